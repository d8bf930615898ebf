//! Checkpoints: Hugging Face and state-spaces Mamba-2 folders, and this crate's own records.
//!
//! A checkpoint folder holds `config.json` and `model.safetensors`:
//!
//! - **Hugging Face** (`Mamba2ForCausalLM`): `config.json` as transformers writes it (it may hold
//!   `Infinity`, like published configs), tensors `backbone.embeddings.weight`,
//!   `backbone.layers.{i}.{norm.weight, mixer.*}`, `backbone.norm_f.weight`, `lm_head.weight`.
//! - **state-spaces** (`MambaLMHeadModel`): `config.json` with `d_model`, `n_layer`,
//!   `ssm_cfg = {"layer": "Mamba2", ...}`; `backbone.embedding.weight`; `lm_head.weight` may be
//!   absent when the embeddings are tied.
//! - **this crate** ([`save_lm`]): `config.json` of a [`Mamba2LmConfig`] and `model.mpk`, a
//!   full-precision Burn record.
//!
//! Loading is all or nothing: every parameter must be found with the right shape and a float
//! type, and every tensor in the file must be used, or the load fails with an error that names
//! the tensor; no partially loaded model is ever returned.

mod config;
mod hf;
pub(crate) mod record;
mod safetensors;
mod state_spaces;

use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;

use crate::error::{Mamba2Error, Result};
use crate::layers::backbone::Mamba2Backbone;
use crate::models::lm::{Mamba2Lm, Mamba2LmConfig};
use record::{load_record, save_config};
use safetensors::{
    backbone_params, check_weights_fit, lm_params, load_safetensors, TensorSource, EMBEDDING_NAMES,
};

pub use config::{read_config, CheckpointFormat};
pub use record::{load_module_record, save_record, AtomicFileRecorder, CheckpointRecorder};
pub use safetensors::pytorch_name;

/// Loads the language model of a checkpoint folder (`config.json` + `model.safetensors` for
/// the Hugging Face and state-spaces formats, `config.json` + `model.mpk` for this crate's).
pub fn load_lm<B: Backend>(dir: impl AsRef<Path>, device: &B::Device) -> Result<Mamba2Lm<B>> {
    let dir = dir.as_ref();
    let (config, format) = read_config(dir)?;
    let weights = match format {
        CheckpointFormat::Burn => dir.join("model.mpk"),
        _ => dir.join("model.safetensors"),
    };
    check_weights_fit(&weights, lm_params(&config))?;
    let model = config.init::<B>(device)?;
    if format == CheckpointFormat::Burn {
        return load_record(model, &dir.join("model"), device);
    }
    let tied = config.tie_embeddings;
    load_safetensors(
        model,
        &dir.join("model.safetensors"),
        |path| {
            let (name, transpose) = pytorch_name(path, format);
            let names = if path == "embedding.weight" {
                // either spelling; with tied embeddings the head's copy also serves
                let mut names: Vec<String> =
                    EMBEDDING_NAMES.iter().map(|s| s.to_string()).collect();
                if tied {
                    names.push("lm_head.weight".into());
                }
                names
            } else {
                vec![name]
            };
            TensorSource { names, transpose }
        },
        // with tied embeddings, the head and both embedding spellings are the same matrix
        |name| tied && (name == "lm_head.weight" || EMBEDDING_NAMES.contains(&name)),
    )
}

/// Loads only the backbone (blocks and `norm_f`) of a Hugging Face or state-spaces checkpoint
/// folder; the embedding and LM head in the file are skipped.
pub fn load_backbone<B: Backend>(
    dir: impl AsRef<Path>,
    device: &B::Device,
) -> Result<Mamba2Backbone<B>> {
    let dir = dir.as_ref();
    let (config, format) = read_config(dir)?;
    if format == CheckpointFormat::Burn {
        return Ok(load_lm::<B>(dir, device)?.backbone);
    }
    let weights = dir.join("model.safetensors");
    check_weights_fit(&weights, backbone_params(&config.backbone))?;
    let model = config.backbone.init::<B>(device)?;
    load_safetensors(
        model,
        &dir.join("model.safetensors"),
        |path| {
            let (name, transpose) = pytorch_name(&format!("backbone.{path}"), format);
            TensorSource {
                names: vec![name],
                transpose,
            }
        },
        |name| name == "lm_head.weight" || EMBEDDING_NAMES.contains(&name),
    )
}

/// Saves `model` and its config to `dir` in this crate's format (`config.json`, `model.mpk`,
/// full precision); [`load_lm`] reads it back.
pub fn save_lm<B: Backend>(
    model: &Mamba2Lm<B>,
    config: &Mamba2LmConfig,
    dir: impl AsRef<Path>,
) -> Result<PathBuf> {
    let dir = dir.as_ref();
    std::fs::create_dir_all(dir).map_err(|e| Mamba2Error::file(dir, e))?;
    save_config(config, &dir.join("config.json"))?;
    let path = dir.join("model");
    save_record(model, &path)?;
    Ok(path.with_extension("mpk"))
}
