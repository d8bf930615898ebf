//! Hybrid language models from folders as transformers 5.25's `save_pretrained` writes them
//! (`config.json`, `model.safetensors` or shards, any float type): the family comes from
//! `model_type`, its config and tensor names from the family's file (`granite`, `bamba`,
//! `nemotron_h`, `falcon_h1`); `mamba_ssm`'s language models of Mamba-3 layers (no
//! `model_type`, `ssm_cfg.layer = "Mamba3"`) likewise (`mamba_ssm`). What they share is here.

mod bamba;
mod export;
mod falcon_h1;
mod granite;
mod mamba_ssm;
mod nemotron_h;
mod presets;

pub use export::save_hybrid;
pub use presets::{hybrid_preset, HybridSpec, HYBRID_PRESETS};

use std::path::Path;

use burn::tensor::backend::Backend;
use serde::Deserialize;

use super::config::{from_json, model_type, read_json, HYBRID_MODEL_TYPES};
use super::mamba3::mamba3_name;
use super::safetensors::{check_tied_head, check_weights_fit, load_tensors, TensorSource};
use super::weights::WeightFiles;
use crate::error::{Mamba2Error, Result};
use crate::init::ParamInit;
use crate::layers::rope::RotaryEmbeddingConfig;
use crate::models::hybrid::{HybridConfig, HybridFamily, HybridLm, LayerKind};

/// The `model_type`s [`load_hybrid`] reads (and `mamba_ssm`'s Mamba-3 models, which have none).
const MODEL_TYPES: &str =
    "granitemoehybrid, bamba, nemotron_h, falcon_h1; or mamba_ssm's ssm_cfg.layer \"Mamba3\"";

/// transformers 5.25's defaults that Granite's, Bamba's and Falcon-H1's configs share (each
/// family's own are in its file).
mod defaults {
    pub fn unit() -> f64 {
        1.0
    }
    pub fn one() -> usize {
        1
    }
    pub fn enabled() -> bool {
        true
    }
    pub fn hidden_size() -> usize {
        4096
    }
    pub fn num_hidden_layers() -> usize {
        32
    }
    pub fn num_attention_heads() -> usize {
        32
    }
    pub fn hidden_act() -> String {
        "silu".into()
    }
    pub fn mamba_n_heads() -> usize {
        128
    }
    pub fn mamba_d_state() -> usize {
        256
    }
    pub fn mamba_d_conv() -> usize {
        4
    }
    pub fn mamba_expand() -> usize {
        2
    }
    pub fn mamba_chunk_size() -> usize {
        256
    }
    pub fn initializer_range() -> f64 {
        0.02
    }
}

/// The name a tensor has in the files: see [`TensorSource`].
type TensorName = TensorSource;

/// Whether the folder `dir` holds a model that [`load_hybrid`] rather than
/// [`load_lm`](crate::load_lm) reads: its `config.json` names one of the hybrid families'
/// `model_type`s (those [`load_hybrid`] reads or not yet), or is `mamba_ssm`'s with Mamba-3
/// layers.
pub fn is_hybrid_folder(dir: &Path) -> Result<bool> {
    let (value, _) = read_json(&dir.join("config.json"))?;
    Ok(
        model_type(&value).is_some_and(|t| HYBRID_MODEL_TYPES.contains(&t))
            || mamba_ssm::is_mamba3_lm(&value),
    )
}

/// Reads the hybrid config of the folder `dir` (`config.json`), by its `model_type`.
pub fn read_hybrid_config(dir: &Path) -> Result<HybridConfig> {
    let file = dir.join("config.json");
    let (value, writer) = read_json(&file)?;
    config_from_value(value, &file, &writer)
}

/// The hybrid config of the `config.json` fields `value` (of `file`, written by `writer`), by
/// their `model_type`.
fn config_from_value(value: serde_json::Value, file: &Path, writer: &str) -> Result<HybridConfig> {
    let file = file.to_path_buf();
    let kind = model_type(&value).map(str::to_owned);
    let config = match kind.as_deref() {
        None if mamba_ssm::is_mamba3_lm(&value) => {
            from_json::<mamba_ssm::MambaSsmConfig>(value, &file, writer)?.into_config(&file)
        }
        Some("granitemoehybrid") => {
            from_json::<granite::GraniteConfig>(value, &file, writer)?.into_config(&file)
        }
        Some("bamba") => from_json::<bamba::BambaConfig>(value, &file, writer)?.into_config(&file),
        Some("nemotron_h") => {
            from_json::<nemotron_h::NemotronHConfig>(value, &file, writer)?.into_config(&file)
        }
        Some("falcon_h1") => {
            from_json::<falcon_h1::FalconH1Config>(value, &file, writer)?.into_config(&file)
        }
        other => Err(Mamba2Error::Unsupported {
            file: file.clone(),
            reason: match other {
                Some(t) => format!("model_type {t:?} (hybrids: {MODEL_TYPES})"),
                None => format!("no model_type (hybrids: {MODEL_TYPES})"),
            },
        }),
    };
    config.map_err(|e| match e {
        Mamba2Error::InvalidConfig { field, reason } => Mamba2Error::ConfigFile {
            file: file.clone(),
            field,
            reason,
        },
        e => e,
    })
}

/// Loads the hybrid language model of a transformers folder: Granite 4.0-H
/// (`granitemoehybrid`, dense), Bamba (`bamba`), Nemotron-H (`nemotron_h`, dense), Falcon-H1
/// (`falcon_h1`). All or nothing, as [`load_lm`](crate::load_lm): every
/// parameter found with its shape, every tensor of the files used, or an error naming it.
pub fn load_hybrid<B: Backend>(dir: impl AsRef<Path>, device: &B::Device) -> Result<HybridLm<B>> {
    let dir = dir.as_ref();
    let config = read_hybrid_config(dir)?;
    let files = WeightFiles::find(dir)?;
    check_weights_fit(files.path(), files.bytes()?, config.param_count())?;
    let tensors = files.read()?;
    let names = |path: &str| source(&config, path);
    let embedding = names("embedding.weight").names[0].clone();
    let head = names("lm_head.weight").names[0].clone();
    let tied = config.tie_embeddings;
    if tied {
        check_tied_head(&tensors, &[embedding.as_str()])?;
    }
    let model = config.build::<B>(&ParamInit::deferred(device))?;
    load_tensors(model, &tensors, files.path(), names, |name| {
        tied && name == head
    })
}

/// Where the parameter at `path` in a model of `config` is in its files.
fn source(config: &HybridConfig, path: &str) -> TensorName {
    let layout = match config.family {
        HybridFamily::Granite => &granite::LAYOUT,
        HybridFamily::Bamba => &bamba::LAYOUT,
        HybridFamily::MambaSsm => &mamba_ssm::LAYOUT,
        HybridFamily::NemotronH => &nemotron_h::LAYOUT,
        HybridFamily::FalconH1 => &falcon_h1::LAYOUT,
    };
    let n_experts = config.moe.as_ref().map_or(0, |m| m.n_experts);
    layout.tensor_name(path, n_experts)
}

/// Where a family keeps its tensors: `{prefix}.layers.{i}.{module}.{name}` and its own names for
/// the embedding, the norms and the modules.
struct Layout {
    /// `model` or `backbone`.
    prefix: &'static str,
    embedding: &'static str,
    final_norm: &'static str,
    input_norm: &'static str,
    ffn_norm: &'static str,
    mamba: &'static str,
    attention: &'static str,
    /// The name in layer `prefix` of the MLP's parameter `tail` (`gate.weight`).
    mlp: fn(prefix: &str, tail: &str) -> TensorName,
    /// The name (or names, stacked) in layer `prefix` of the mixture of experts' parameter
    /// `tail` (`router.weight`, `up`), of `n_experts` experts.
    moe: fn(prefix: &str, tail: &str, n_experts: usize) -> TensorName,
}

impl Layout {
    fn tensor_name(&self, path: &str, n_experts: usize) -> TensorName {
        let whole = |name: String| TensorName::whole(name, is_linear(path));
        let top = |name: &str| whole(format!("{}.{name}.weight", self.prefix));
        match path {
            "embedding.weight" => return top(self.embedding),
            "norm.weight" => return top(self.final_norm),
            "lm_head.weight" => return whole(path.into()),
            _ => {}
        }
        let Some(rest) = path.strip_prefix("layers.") else {
            return whole(path.into());
        };
        let (layer, rest) = rest.split_once('.').unwrap_or((rest, ""));
        let prefix = format!("{}.layers.{layer}", self.prefix);
        if let Some(tail) = rest.strip_prefix("mlp.") {
            return (self.mlp)(&prefix, tail);
        }
        if let Some(tail) = rest.strip_prefix("moe.") {
            return (self.moe)(&prefix, tail, n_experts);
        }
        let tail = match rest {
            "input_norm.weight" => format!("{}.weight", self.input_norm),
            "ffn_norm.weight" => format!("{}.weight", self.ffn_norm),
            r => match r.strip_prefix("attention.") {
                Some(t) => format!("{}.{t}", self.attention),
                None if r.starts_with("mamba3.") => {
                    format!("{}.{}", self.mamba, mamba3_name(&r["mamba3.".len()..]).0)
                }
                None => format!(
                    "{}.{}",
                    self.mamba,
                    mamba_name(r.strip_prefix("mamba.").unwrap_or(r))
                ),
            },
        };
        whole(format!("{prefix}.{tail}"))
    }
}

/// The names of a three-matrix MLP as transformers' `LlamaMLP` has them, under `module`:
/// `{module}.gate_proj`, `up_proj`, `down_proj` (weights and biases).
fn proj_mlp(module: &str, prefix: &str, tail: &str) -> TensorName {
    let name = match tail.split_once('.') {
        Some((linear, param)) => format!("{prefix}.{module}.{linear}_proj.{param}"),
        None => format!("{prefix}.{module}.{tail}"),
    };
    TensorName::whole(name, tail.ends_with(".weight"))
}

/// A layer kind as transformers 5.25 names it, or as older files do; `mlp` only where the
/// family has MLP layers.
fn layer_kind(name: &str, mlp_layers: bool, file: &Path) -> Result<LayerKind> {
    match name {
        "linear_attention" | "mamba" => Ok(LayerKind::Mamba),
        "full_attention" | "attention" => Ok(LayerKind::Attention),
        "mlp" if mlp_layers => Ok(LayerKind::Mlp),
        "moe" if mlp_layers => Ok(LayerKind::Moe),
        other => Err(Mamba2Error::Unsupported {
            file: file.to_path_buf(),
            reason: format!("layer_types: layer kind {other:?}"),
        }),
    }
}

/// The Mamba layers' head size: `mamba_d_head` as written (an integer, or `"auto"`:
/// `d_inner / n_heads`), checked to tile `d_inner` with `n_heads` heads.
fn mamba_head_dim(
    value: Option<&serde_json::Value>,
    d_inner: usize,
    n_heads: usize,
) -> Result<usize> {
    let head_dim = match value {
        None => None,
        Some(serde_json::Value::String(s)) if s == "auto" => None,
        Some(v) => Some(v.as_u64().map(|v| v as usize).ok_or_else(|| {
            Mamba2Error::config("mamba_d_head", format!("an integer or \"auto\", got {v}"))
        })?),
    };
    let head_dim = head_dim.unwrap_or(d_inner / n_heads.max(1));
    if head_dim.checked_mul(n_heads) != Some(d_inner) {
        return Err(Mamba2Error::config(
            "mamba_n_heads",
            format!(
                "mamba_n_heads · mamba_d_head = {n_heads} · {head_dim} must equal the Mamba \
                 layers' width {d_inner}"
            ),
        ));
    }
    Ok(head_dim)
}

/// The Mamba layers' convolution activation: only SiLU, as every published hybrid has.
fn check_silu(field: &str, act: &str, file: &Path) -> Result<()> {
    if act == "silu" || act == "swish" {
        return Ok(());
    }
    Err(Mamba2Error::Unsupported {
        file: file.to_path_buf(),
        reason: format!("{field} = {act:?} (only silu)"),
    })
}

/// Where the parameter at module path `path` of a [`HybridLm`] of `config`
/// (`layers.0.mlp.gate.weight`) is in its checkpoints.
pub fn hybrid_tensor_name(config: &HybridConfig, path: &str) -> HybridTensorName {
    let s = source(config, path);
    HybridTensorName {
        names: if s.stacked.is_empty() {
            vec![s.names[0].clone()]
        } else {
            s.stacked
        },
        transposed: s.transpose,
        part: s.part,
    }
}

/// Where a parameter of a [`HybridLm`] is in its checkpoints ([`hybrid_tensor_name`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HybridTensorName {
    /// The tensor's name; several where the parameter stacks them along a new first axis, in
    /// order (Nemotron-H's experts, one tensor each).
    pub names: Vec<String>,
    /// The file holds the transpose (PyTorch's `[out, in]` of a `Linear`).
    pub transposed: bool,
    /// Where the file fuses several parameters along its first axis: which block of how many
    /// (`(index, of)`).
    pub part: Option<(usize, usize)>,
}

/// The `moe` names of a family without experts: none of its layers has any.
fn no_experts(prefix: &str, tail: &str, _n_experts: usize) -> TensorName {
    TensorName::whole(format!("{prefix}.moe.{tail}"), false)
}

/// Whether the parameter at `path` is a `Linear` weight, which the files hold transposed
/// (PyTorch's `[out, in]`).
fn is_linear(path: &str) -> bool {
    path == "lm_head.weight"
        || path.ends_with("_proj.weight")
        || [".mlp.gate.weight", ".mlp.up.weight", ".mlp.down.weight"]
            .iter()
            .any(|s| path.ends_with(s))
}

/// The file name of a Mamba-2 mixer parameter (`a_log` is `A_log`, `d` is `D`).
fn mamba_name(path: &str) -> String {
    let (head, last) = path.rsplit_once('.').unwrap_or(("", path));
    let last = match last {
        "a_log" => "A_log",
        "d" => "D",
        other => other,
    };
    match head {
        "" => last.to_string(),
        head => format!("{head}.{last}"),
    }
}

/// The rotary embedding's settings as transformers 5.25 writes them (`rope_parameters`), or as
/// older files do (`rope_theta`, `rope_scaling` at the top level).
#[derive(Deserialize, Default)]
struct Rope {
    rope_parameters: Option<RopeParameters>,
    rope_theta: Option<f64>,
    rope_scaling: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct RopeParameters {
    rope_type: Option<String>,
    rope_theta: Option<f64>,
    partial_rotary_factor: Option<f64>,
}

impl Rope {
    /// The embedding over the first `int(head_dim · partial_rotary_factor)` channels, the factor
    /// from `rope_parameters`, else `partial`; over the whole head where `partial` is `None`
    /// (families whose code does not read the factor); only the default RoPE (no scaling).
    fn config(
        &self,
        head_dim: usize,
        partial: Option<f64>,
        file: &Path,
    ) -> Result<RotaryEmbeddingConfig> {
        let unsupported = |reason: String| Mamba2Error::Unsupported {
            file: file.to_path_buf(),
            reason,
        };
        let p = self.rope_parameters.as_ref();
        let kind = p.and_then(|p| p.rope_type.as_deref()).unwrap_or("default");
        if kind != "default" {
            return Err(unsupported(format!("rope_type {kind:?} (only default)")));
        }
        if self.rope_scaling.as_ref().is_some_and(|s| !s.is_null()) {
            return Err(unsupported("rope_scaling (only the default RoPE)".into()));
        }
        let theta = p
            .and_then(|p| p.rope_theta)
            .or(self.rope_theta)
            .unwrap_or(10000.0);
        let factor = match partial {
            Some(default) => p.and_then(|p| p.partial_rotary_factor).unwrap_or(default),
            None => 1.0,
        };
        if !(factor > 0.0 && factor <= 1.0) {
            return Err(Mamba2Error::config(
                "partial_rotary_factor",
                format!("must be in (0, 1], got {factor}"),
            ));
        }
        // Python's int(): toward zero
        let rotary_dim = (head_dim as f64 * factor) as usize;
        Ok(RotaryEmbeddingConfig::new(head_dim)
            .with_theta(theta)
            .with_rotary_dim((rotary_dim != head_dim).then_some(rotary_dim)))
    }
}
