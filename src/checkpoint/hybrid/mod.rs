//! Hybrid language models from folders as transformers 5.25's `save_pretrained` writes them
//! (`config.json`, `model.safetensors` or shards, any float type): the family comes from
//! `model_type`, its config and tensor names from the family's file (`granite`).

mod granite;

use std::path::Path;

use burn::tensor::backend::Backend;
use serde::Deserialize;

use super::config::{from_json, model_type, read_json};
use super::safetensors::{check_tied_head, check_weights_fit, load_tensors, TensorSource};
use super::weights::WeightFiles;
use crate::error::{Mamba2Error, Result};
use crate::init::ParamInit;
use crate::layers::rope::RotaryEmbeddingConfig;
use crate::models::hybrid::{HybridConfig, HybridFamily, HybridLm};

/// The name a tensor has in the files: see [`TensorSource`].
type TensorName = TensorSource;

/// Reads the hybrid config of the folder `dir` (`config.json`), by its `model_type`.
pub fn read_hybrid_config(dir: &Path) -> Result<HybridConfig> {
    let file = dir.join("config.json");
    let (value, writer) = read_json(&file)?;
    let kind = model_type(&value).map(str::to_owned);
    let config = match kind.as_deref() {
        Some("granitemoehybrid") => {
            from_json::<granite::GraniteConfig>(value, &file, &writer)?.into_config(&file)
        }
        other => Err(Mamba2Error::Unsupported {
            file: file.clone(),
            reason: match other {
                Some(t) => format!("model_type {t:?} (hybrids: granitemoehybrid)"),
                None => "no model_type (hybrids: granitemoehybrid)".into(),
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
/// (`granitemoehybrid`, dense). All or nothing, as [`load_lm`](crate::load_lm): every
/// parameter found with its shape, every tensor of the files used, or an error naming it.
pub fn load_hybrid<B: Backend>(dir: impl AsRef<Path>, device: &B::Device) -> Result<HybridLm<B>> {
    let dir = dir.as_ref();
    let config = read_hybrid_config(dir)?;
    let files = WeightFiles::find(dir)?;
    check_weights_fit(files.path(), files.bytes()?, config.param_count())?;
    let tensors = files.read()?;
    let names = |path: &str| source(config.family, path);
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

/// Where the parameter at `path` in a model of `family` is in its files.
fn source(family: HybridFamily, path: &str) -> TensorName {
    match family {
        HybridFamily::Granite => granite::tensor_name(path),
    }
}

/// Where the parameter at module path `path` of a [`HybridLm`] of `family` (`layers.0.mlp.gate.weight`)
/// is in its checkpoints: the tensor's name, whether the file holds its transpose (PyTorch's
/// `[out, in]` of a `Linear`), and, where the file fuses several parameters along its first
/// axis, which block of how many (`(index, of)`).
pub fn hybrid_tensor_name(
    family: HybridFamily,
    path: &str,
) -> (String, bool, Option<(usize, usize)>) {
    let s = source(family, path);
    (s.names[0].clone(), s.transpose, s.part)
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

/// The file name of a Mamba-2 mixer parameter (`mamba.a_log` is `mamba.A_log`).
fn mamba_name(path: &str) -> String {
    match path.rsplit_once('.') {
        Some((p, "a_log")) => format!("{p}.A_log"),
        Some((p, "d")) => format!("{p}.D"),
        _ => path.to_string(),
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
}

impl Rope {
    /// The embedding over all `head_dim` channels; only the default RoPE (no scaling).
    fn config(&self, head_dim: usize, file: &Path) -> Result<RotaryEmbeddingConfig> {
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
        Ok(RotaryEmbeddingConfig::new(head_dim).with_theta(theta))
    }
}
