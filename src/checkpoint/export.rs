//! Writing a language model back to the Python world: a Hugging Face `Mamba2ForCausalLM`
//! folder or a state-spaces `MambaLMHeadModel` one, each `config.json` + `model.safetensors`
//! with the names, layouts and config keys its loader reads.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ::safetensors::tensor::{Dtype, View};
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{backend::Backend, DType, Tensor, TensorData};
use serde_json::{json, Map, Value};

use super::config::CheckpointFormat;
use super::record::write_atomic;
use super::safetensors::{convert, pytorch_name};
use crate::error::{Mamba2Error, Result};
use crate::layers::mixer::DtLimit;
use crate::models::lm::{Mamba2Lm, Mamba2LmConfig};

/// Writes `config.json` and `model.safetensors` of `model` (built from `config`) in `dir` in
/// `format` (Hugging Face or state-spaces): every parameter under the format's name, linear
/// weights as PyTorch's `[out, in]`, in the model's float type, tied embeddings stored once
/// (as transformers' `save_pretrained` stores them), metadata `format: pt`. Each file is
/// written beside its place and renamed into it; the tensors are converted one at a time.
pub(super) fn save_pytorch_layout<B: Backend>(
    model: &Mamba2Lm<B>,
    config: &Mamba2LmConfig,
    dir: &Path,
    format: CheckpointFormat,
) -> Result<PathBuf> {
    let text = match format {
        CheckpointFormat::HuggingFace => hf_config(config)?,
        CheckpointFormat::StateSpaces => state_spaces_config(config)?,
        CheckpointFormat::Burn => unreachable!("the Burn format is a record"),
    };
    if config.padded_vocab_size() != model.embedding.weight.dims()[0] {
        return Err(Mamba2Error::InvalidInput {
            name: "config",
            reason: format!(
                "describes a vocabulary of {} rows, the model has {}",
                config.padded_vocab_size(),
                model.embedding.weight.dims()[0]
            ),
        });
    }
    std::fs::create_dir_all(dir).map_err(|e| Mamba2Error::file(dir, e))?;
    let config_file = dir.join("config.json");
    write_atomic(&config_file, text.as_bytes()).map_err(|e| Mamba2Error::file(&config_file, e))?;

    let names = |path: &str| pytorch_name(path, format);
    write_safetensors(dir, exported(model, &names))
}

/// Every float parameter of `module` to write, under the name `names` gives its path, with
/// whether the file holds its transpose.
pub(super) fn exported<B: Backend, M: Module<B>>(
    module: &M,
    names: &dyn Fn(&str) -> (String, bool),
) -> Vec<(String, Lazy)> {
    let mut tensors = Exported {
        path: Vec::new(),
        names,
        found: Vec::new(),
    };
    module.visit(&mut tensors);
    tensors.found
}

/// Writes `tensors` as `dir/model.safetensors` (metadata `format: pt`), beside its place first
/// and renamed into it; each tensor's bytes are made as the writer reaches it.
pub(super) fn write_safetensors(dir: &Path, tensors: Vec<(String, Lazy)>) -> Result<PathBuf> {
    write_safetensors_as(dir, "model.safetensors", tensors)
}

/// Writes `tensors` as `dir/{name}`, as [`write_safetensors`] does.
pub(super) fn write_safetensors_as(
    dir: &Path,
    name: &str,
    tensors: Vec<(String, Lazy)>,
) -> Result<PathBuf> {
    let file = dir.join(name);
    let partial = dir.join(format!(".{name}.partial"));
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    ::safetensors::tensor::serialize_to_file(tensors, Some(metadata), &partial)
        .map_err(|e| Mamba2Error::file(&partial, e))?;
    std::fs::rename(&partial, &file).map_err(|e| Mamba2Error::file(&file, e))?;
    Ok(file)
}

/// The file's type for a parameter of float type `dtype`, and the type its values are converted
/// to: float types other than these four are written as f32.
pub(super) fn file_dtype(dtype: DType) -> (Dtype, DType) {
    match dtype {
        DType::F64 => (Dtype::F64, DType::F64),
        DType::F16 => (Dtype::F16, DType::F16),
        DType::BF16 => (Dtype::BF16, DType::BF16),
        _ => (Dtype::F32, DType::F32),
    }
}

/// A parameter to write: its layout and float type, its bytes made when the writer asks.
pub(super) struct Lazy {
    pub(super) shape: Vec<usize>,
    pub(super) dtype: Dtype,
    pub(super) bytes: usize,
    pub(super) data: Box<dyn Fn() -> TensorData>,
}

impl View for Lazy {
    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Owned((self.data)().as_bytes().to_vec())
    }

    fn data_len(&self) -> usize {
        self.bytes
    }
}

/// Collects every float parameter under the name `names` gives it.
struct Exported<'a> {
    path: Vec<String>,
    names: &'a dyn Fn(&str) -> (String, bool),
    found: Vec<(String, Lazy)>,
}

impl<B: Backend> ModuleVisitor<B> for Exported<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let (name, transpose) = (self.names)(&self.path.join("."));
        let tensor = param.val();
        let dtype = tensor.dtype();
        let mut shape = tensor.dims().to_vec();
        if transpose {
            shape.reverse();
        }
        let (st_dtype, out_dtype) = file_dtype(dtype);
        let bytes = shape.iter().product::<usize>() * out_dtype.size();
        let data = Box::new(move || convert(tensor.clone().into_data(), transpose, out_dtype));
        self.found.push((
            name,
            Lazy {
                shape,
                dtype: st_dtype,
                bytes,
                data,
            },
        ));
    }
}

/// A dt limit as Python's JSON writes it: an infinite bound is `Infinity`.
fn dt_limit_value(limit: DtLimit) -> Value {
    let bound = |x: f64| {
        if x.is_infinite() {
            Value::String(INFINITY.into())
        } else {
            json!(x)
        }
    };
    json!([bound(limit.min), bound(limit.max)])
}

/// Stands for `Infinity` until the text is made (JSON has no infinite number; Python's
/// `json` module, which both formats' loaders use, writes and reads it so). The configs hold
/// no other strings that could look like it.
const INFINITY: &str = "__Infinity__";

/// Pretty JSON text with the infinite bounds written as Python writes them.
fn python_json(value: &Map<String, Value>) -> String {
    let text = serde_json::to_string_pretty(value).expect("a JSON map");
    text.replace(&format!("\"{INFINITY}\""), "Infinity") + "\n"
}

/// transformers' `Mamba2Config` of `config`.
fn hf_config(config: &Mamba2LmConfig) -> Result<String> {
    let m = &config.backbone.mixer;
    // transformers' mixer: one D per head, the gated RMSNorm, gating before the norm
    for (field, unsupported) in [
        ("d_has_hdim", m.d_has_hdim),
        ("rmsnorm", !m.rmsnorm),
        ("norm_before_gate", m.norm_before_gate),
    ] {
        if unsupported {
            return Err(Mamba2Error::config(
                field,
                "transformers' Mamba2 cannot hold this setting: export in the state-spaces format",
            ));
        }
    }
    check_expressible(config)?;
    let mut map = Map::new();
    for (key, value) in [
        ("model_type", json!("mamba2")),
        ("architectures", json!(["Mamba2ForCausalLM"])),
        ("vocab_size", json!(config.padded_vocab_size())),
        ("hidden_size", json!(m.d_model)),
        ("num_hidden_layers", json!(config.backbone.n_layer)),
        ("num_heads", json!(m.nheads())),
        ("head_dim", json!(m.headdim)),
        ("state_size", json!(m.d_state)),
        ("n_groups", json!(m.ngroups)),
        ("expand", json!(m.expand)),
        ("conv_kernel", json!(m.d_conv)),
        ("chunk_size", json!(m.chunk_size)),
        ("use_bias", json!(m.bias)),
        ("use_conv_bias", json!(m.conv_bias)),
        ("hidden_act", json!("silu")),
        ("layer_norm_epsilon", json!(config.backbone.norm_eps)),
        ("residual_in_fp32", json!(true)),
        ("time_step_min", json!(m.dt_min)),
        ("time_step_max", json!(m.dt_max)),
        ("time_step_floor", json!(m.dt_init_floor)),
        ("time_step_limit", dt_limit_value(m.dt_limit)),
        ("initializer_range", json!(config.initializer_range)),
        // an initialisation setting, but transformers (5.24) applies it to loaded weights too:
        // set, it would divide every loaded out_proj by √n_layer
        ("rescale_prenorm_residual", json!(false)),
        ("tie_word_embeddings", json!(config.tie_embeddings)),
        ("use_cache", json!(true)),
        // absent, transformers would take 1, 0 and 2 (and stop generating at token 2)
        ("pad_token_id", Value::Null),
        ("bos_token_id", Value::Null),
        ("eos_token_id", Value::Null),
    ] {
        map.insert(key.to_string(), value);
    }
    Ok(python_json(&map))
}

/// Both formats have one epsilon for the block norms and the mixers' gated norms, and size the
/// mixer's inner stream by `expand · d_model`.
fn check_expressible(config: &Mamba2LmConfig) -> Result<()> {
    let m = &config.backbone.mixer;
    if m.inner_size
        .is_some_and(|w| Some(w) != m.expand.checked_mul(m.d_model))
    {
        return Err(Mamba2Error::config(
            "inner_size",
            format!(
                "{:?} is not expand · d_model = {} · {}; both formats size the mixer by expand",
                m.inner_size, m.expand, m.d_model
            ),
        ));
    }
    let (block, mixer) = (config.backbone.norm_eps, m.norm_eps);
    if block != mixer {
        return Err(Mamba2Error::config(
            "norm_eps",
            format!("the blocks' {block} and the mixers' {mixer} differ; both formats have one"),
        ));
    }
    Ok(())
}

/// state-spaces' `MambaConfig` of `config`: its own fields, the mixer's arguments in `ssm_cfg`.
fn state_spaces_config(config: &Mamba2LmConfig) -> Result<String> {
    check_expressible(config)?;
    let m = &config.backbone.mixer;
    let mut ssm = Map::new();
    for (key, value) in [
        ("layer", json!("Mamba2")),
        ("d_state", json!(m.d_state)),
        ("d_conv", json!(m.d_conv)),
        ("expand", json!(m.expand)),
        ("headdim", json!(m.headdim)),
        ("ngroups", json!(m.ngroups)),
        ("chunk_size", json!(m.chunk_size)),
        ("bias", json!(m.bias)),
        ("conv_bias", json!(m.conv_bias)),
        ("rmsnorm", json!(m.rmsnorm)),
        ("norm_before_gate", json!(m.norm_before_gate)),
        ("D_has_hdim", json!(m.d_has_hdim)),
        ("dt_min", json!(m.dt_min)),
        ("dt_max", json!(m.dt_max)),
        ("dt_init_floor", json!(m.dt_init_floor)),
        ("dt_limit", dt_limit_value(m.dt_limit)),
        ("A_init_range", json!([m.a_init_range.0, m.a_init_range.1])),
    ] {
        ssm.insert(key.to_string(), value);
    }
    let mut map = Map::new();
    for (key, value) in [
        ("d_model", json!(m.d_model)),
        ("d_intermediate", json!(0)),
        ("n_layer", json!(config.backbone.n_layer)),
        ("vocab_size", json!(config.vocab_size)),
        ("ssm_cfg", Value::Object(ssm)),
        ("attn_layer_idx", json!([])),
        ("attn_cfg", json!({})),
        ("rms_norm", json!(true)),
        ("residual_in_fp32", json!(true)),
        ("fused_add_norm", json!(true)),
        (
            "pad_vocab_size_multiple",
            json!(config.pad_vocab_size_multiple),
        ),
        ("tie_embeddings", json!(config.tie_embeddings)),
    ] {
        map.insert(key.to_string(), value);
    }
    // mamba_ssm's blocks use 1e-5 and its `MambaConfig` has no field for another value: one
    // is written only when it differs, which mamba_ssm then refuses rather than ignores
    if config.backbone.norm_eps != 1e-5 {
        map.insert("norm_epsilon".into(), json!(config.backbone.norm_eps));
    }
    Ok(python_json(&map))
}
