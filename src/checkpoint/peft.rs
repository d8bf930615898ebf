//! Low-rank adapters in PEFT's layout: `adapter_config.json` and `adapter_model.safetensors`,
//! which `peft.PeftModel.from_pretrained` loads onto the base model in transformers.
//!
//! Each adapted projection is a module of the base model's files: PEFT names its update
//! `base_model.model.{module}.lora_A.weight` (`[rank, in]`, the crate's `A` transposed) and
//! `lora_B.weight` (`[out, rank]`), and scales it by `lora_alpha / r`. Where a family's file
//! fuses several of the crate's projections into one module (Granite's `input_linear`, the
//! gated MLP's gate and up rows), the module's update is theirs side by side: `lora_A` their
//! `A`s stacked, `lora_B` their `B`s on the diagonal of blocks, of rank `k · r` for `k` blocks,
//! declared in `rank_pattern` with `k · alpha` in `alpha_pattern` so that the scale stays
//! `alpha / r`; a block the config does not target is zero.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{backend::Backend, Tensor, TensorData};
use serde_json::{json, Value};

use super::config::CheckpointFormat;
use super::export::{write_safetensors_as, Lazy};
use super::hybrid::hybrid_tensor_name;
use super::record::write_atomic;
use super::safetensors::pytorch_name;
use crate::error::{Mamba2Error, Result};
use crate::layers::lora::LoraConfig;
use crate::models::hybrid::{HybridConfig, HybridFamily, HybridLm};
use crate::models::lm::Mamba2Lm;

/// Writes the low-rank adapters of `model` (a [`Mamba2Lm`] fine-tuned with `lora`) to `dir` in
/// PEFT's layout, its modules named as the base model's files in `format` name them (the
/// crate's own format as transformers'); `base` is recorded as `base_model_name_or_path`.
/// Returns the weights file. A model without adapters is an error naming `lora`.
pub fn save_lora_adapter<B: Backend>(
    model: &Mamba2Lm<B>,
    lora: &LoraConfig,
    format: CheckpointFormat,
    base: Option<&str>,
    dir: impl AsRef<Path>,
) -> Result<PathBuf> {
    let format = match format {
        CheckpointFormat::Burn => CheckpointFormat::HuggingFace,
        f => f,
    };
    let adapters = adapters(model)?;
    let modules = group(adapters, |linear| {
        let (name, _) = pytorch_name(&format!("{linear}.weight"), format);
        (strip_weight(name), None)
    });
    write(modules, lora, base, dir.as_ref())
}

/// Writes the low-rank adapters of `model` (a [`HybridLm`] of `config`, fine-tuned with
/// `lora`) to `dir` in PEFT's layout, its modules named as the family's model in
/// transformers 5.25 names them; `base` is recorded as `base_model_name_or_path`. Returns the weights file.
pub fn save_hybrid_lora_adapter<B: Backend>(
    model: &HybridLm<B>,
    config: &HybridConfig,
    lora: &LoraConfig,
    base: Option<&str>,
    dir: impl AsRef<Path>,
) -> Result<PathBuf> {
    let adapters = adapters(model)?;
    let modules = group(adapters, |linear| {
        let name = hybrid_tensor_name(config, &format!("{linear}.weight"));
        let module = strip_weight(name.names[0].clone());
        // PEFT names modules, not tensors: transformers 5.25 keeps Nemotron-H's files'
        // `backbone.` tensors in its `model.` modules (renamed on load)
        let module = match (config.family, module.strip_prefix("backbone.")) {
            (HybridFamily::NemotronH, Some(rest)) => format!("model.{rest}"),
            _ => module,
        };
        (module, name.part)
    });
    write(modules, lora, base, dir.as_ref())
}

fn strip_weight(name: String) -> String {
    name.strip_suffix(".weight")
        .map(str::to_string)
        .unwrap_or(name)
}

/// One adapter of the model: the module path of the projection it updates
/// (`backbone.layers.0.mixer.in_proj`), `A` `[in, r]` and `B` `[r, out]`.
struct Adapter {
    linear: String,
    a: TensorData,
    b: TensorData,
}

/// Collects the `a` and `b` of every `{linear}_lora` module.
#[derive(Default)]
struct Adapters {
    path: Vec<String>,
    a: BTreeMap<String, TensorData>,
    b: BTreeMap<String, TensorData>,
}

impl<B: Backend> ModuleVisitor<B> for Adapters {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let path = self.path.join(".");
        let Some((module, matrix)) = path.rsplit_once('.') else {
            return;
        };
        let Some(linear) = module.strip_suffix("_lora") else {
            return;
        };
        let data = param.val().into_data().convert::<f32>();
        let side = if matrix == "a" {
            &mut self.a
        } else {
            &mut self.b
        };
        side.insert(linear.to_string(), data);
    }
}

fn adapters<B: Backend, M: Module<B>>(model: &M) -> Result<Vec<Adapter>> {
    let mut found = Adapters::default();
    model.visit(&mut found);
    let adapters: Vec<Adapter> = std::mem::take(&mut found.a)
        .into_iter()
        .filter_map(|(linear, a)| {
            let b = found.b.remove(&linear)?;
            Some(Adapter { linear, a, b })
        })
        .collect();
    if adapters.is_empty() {
        return Err(Mamba2Error::config(
            "lora",
            "the model holds no low-rank adapter to write",
        ));
    }
    Ok(adapters)
}

/// A module of the base model's files and the adapters of its blocks: `(block, of)` where the
/// file fuses `of` projections along its output rows.
struct PeftModule {
    blocks: Vec<(usize, Adapter)>,
    of: usize,
}

fn group(
    adapters: Vec<Adapter>,
    name: impl Fn(&str) -> (String, Option<(usize, usize)>),
) -> BTreeMap<String, PeftModule> {
    let mut modules: BTreeMap<String, PeftModule> = BTreeMap::new();
    for adapter in adapters {
        let (module, part) = name(&adapter.linear);
        let (block, of) = part.unwrap_or((0, 1));
        let entry = modules.entry(module).or_insert(PeftModule {
            blocks: Vec::new(),
            of,
        });
        entry.blocks.push((block, adapter));
    }
    modules
}

/// `lora_A` `[k·r, in]` and `lora_B` `[k·out, k·r]` of a module of `k` blocks, each block's
/// update on its own rows and rank columns (zero where a block has no adapter).
fn fused(module: &PeftModule, rank: usize) -> Result<(TensorData, TensorData)> {
    let k = module.of;
    let dims = |d: &TensorData| [d.shape[0], d.shape[1]];
    let [d_in, _] = dims(&module.blocks[0].1.a);
    let d_out_block = dims(&module.blocks[0].1.b)[1];
    let (rows_a, cols_b) = (k * rank, k * rank);
    let mut a = vec![0f32; rows_a * d_in];
    let mut b = vec![0f32; k * d_out_block * cols_b];
    for (block, adapter) in &module.blocks {
        let ([ai, ar], [br, bo]) = (dims(&adapter.a), dims(&adapter.b));
        if ai != d_in || ar != rank || br != rank || bo != d_out_block {
            return Err(Mamba2Error::config(
                "lora",
                format!(
                    "{}: an update of shapes {:?} and {:?} against rank {rank} and the \
                     module's blocks of {d_in} → {d_out_block}",
                    adapter.linear, adapter.a.shape, adapter.b.shape
                ),
            ));
        }
        let (av, bv) = (
            adapter.a.to_vec::<f32>().expect("f32"),
            adapter.b.to_vec::<f32>().expect("f32"),
        );
        // lora_A row (block · r + j) = column j of A
        for j in 0..rank {
            for i in 0..d_in {
                a[(block * rank + j) * d_in + i] = av[i * rank + j];
            }
        }
        // lora_B row (block · out + o), column (block · r + j) = B[j, o]
        for o in 0..d_out_block {
            for j in 0..rank {
                b[(block * d_out_block + o) * cols_b + block * rank + j] = bv[j * d_out_block + o];
            }
        }
    }
    Ok((
        TensorData::new(a, [rows_a, d_in]),
        TensorData::new(b, [k * d_out_block, cols_b]),
    ))
}

fn write(
    modules: BTreeMap<String, PeftModule>,
    lora: &LoraConfig,
    base: Option<&str>,
    dir: &Path,
) -> Result<PathBuf> {
    lora.validate()?;
    let mut tensors = Vec::new();
    let (mut rank_pattern, mut alpha_pattern) = (BTreeMap::new(), BTreeMap::new());
    let mut names = std::collections::BTreeSet::new();
    for (module, blocks) in &modules {
        let (a, b) = fused(blocks, lora.rank)?;
        if blocks.of > 1 {
            rank_pattern.insert(module.clone(), json!(blocks.of * lora.rank));
            alpha_pattern.insert(module.clone(), json!(blocks.of as f64 * lora.alpha));
        }
        // whole names: a suffix (`input_linear`) would also match modules that are not
        // adapted, some of which PEFT cannot adapt (Granite's experts)
        names.insert(module.clone());
        for (side, data) in [("lora_A", a), ("lora_B", b)] {
            tensors.push((
                format!("base_model.model.{module}.{side}.weight"),
                lazy(data),
            ));
        }
    }
    let config = json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": names.into_iter().collect::<Vec<_>>(),
        "rank_pattern": Value::Object(rank_pattern.into_iter().collect()),
        "alpha_pattern": Value::Object(alpha_pattern.into_iter().collect()),
        "bias": "none",
        "fan_in_fan_out": false,
        "inference_mode": true,
        "init_lora_weights": true,
        "use_rslora": false,
        "use_dora": false,
        "modules_to_save": null,
        "layers_to_transform": null,
    });
    std::fs::create_dir_all(dir).map_err(|e| Mamba2Error::file(dir, e))?;
    let text = serde_json::to_string_pretty(&config).expect("a JSON value serializes");
    let file = dir.join("adapter_config.json");
    write_atomic(&file, text.as_bytes()).map_err(|e| Mamba2Error::file(&file, e))?;
    write_safetensors_as(dir, "adapter_model.safetensors", tensors)
}

fn lazy(data: TensorData) -> Lazy {
    let shape = data.shape.to_vec();
    let bytes = shape.iter().product::<usize>() * 4;
    Lazy {
        shape,
        dtype: ::safetensors::tensor::Dtype::F32,
        bytes,
        data: Box::new(move || data.clone()),
    }
}
