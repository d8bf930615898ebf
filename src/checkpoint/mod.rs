//! Checkpoints: Hugging Face and state-spaces Mamba-2 folders, and this crate's own records.
//!
//! A checkpoint folder holds `config.json` and the weights, in any layout Mamba-2 checkpoints
//! are published in: `model.safetensors`, shards listed by `model.safetensors.index.json`, or
//! `pytorch_model.bin` (with the `pytorch` feature):
//!
//! - **Hugging Face** (`Mamba2ForCausalLM`): `config.json` as transformers writes it (it may hold
//!   `Infinity`, like published configs), tensors `backbone.embeddings.weight`,
//!   `backbone.layers.{i}.{norm.weight, mixer.*}`, `backbone.norm_f.weight`, `lm_head.weight`.
//! - **state-spaces** (`MambaLMHeadModel`): `config.json` with `d_model`, `n_layer`,
//!   `ssm_cfg = {"layer": "Mamba2", ...}`; `backbone.embedding.weight`; with tied embeddings
//!   `lm_head.weight` may be absent, or stored beside the embedding (as `torch.save` writes it),
//!   when it must equal it.
//! - **this crate** ([`save_lm`]): `config.json` of a [`Mamba2LmConfig`] and `model.mpk`, a
//!   full-precision Burn record.
//! - **Mamba-3 layers** (`mamba_ssm`'s `Mamba3`): its constructor arguments
//!   ([`mamba3_config_from_json`]) and its state dict under any prefix ([`load_mamba3`]);
//!   [`save_mamba3`] writes both.
//!
//! Loading is all or nothing: every parameter must be found with the right shape and a float
//! type (`f32`, `f16`, `bf16` or `f64`, cast to the model's), every tensor in the files must be
//! used, and a sharded checkpoint must hold each tensor in the shard its index names, or the
//! load fails with an error that names the file and the tensor; no partially loaded model is
//! ever returned.

mod config;
mod export;
mod hf;
mod hybrid;
mod mamba3;
mod peft;
pub(crate) mod record;
mod region;
mod safetensors;
mod state_spaces;
mod weights;

use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;

use crate::error::{Mamba2Error, Result};
use crate::init::ParamInit;
use crate::layers::backbone::Mamba2Backbone;
use crate::models::lm::{Mamba2Lm, Mamba2LmConfig};
use record::{load_record, save_config};
use safetensors::{
    check_tied_head, check_weights_fit, load_tensors, TensorSource, EMBEDDING_NAMES, HEAD_NAME,
};
use weights::{file_size, WeightFiles};

pub use config::{read_config, CheckpointFormat};
pub use hybrid::{
    hybrid_preset, hybrid_tensor_name, is_hybrid_folder, load_hybrid, read_hybrid_config,
    save_hybrid, HybridSpec, HybridTensorName, HYBRID_PRESETS,
};
pub use mamba3::{load_mamba3, mamba3_config_from_json, mamba3_name, save_mamba3};
pub use peft::{save_hybrid_lora_adapter, save_lora_adapter};
pub use record::{load_module_record, save_record, AtomicFileRecorder, CheckpointRecorder};
pub use safetensors::pytorch_name;

/// Loads the language model of a checkpoint folder (`config.json` and the weights in any
/// published layout for the Hugging Face and state-spaces formats, `config.json` +
/// `model.mpk` for this crate's).
pub fn load_lm<B: Backend>(dir: impl AsRef<Path>, device: &B::Device) -> Result<Mamba2Lm<B>> {
    let dir = dir.as_ref();
    let (config, format) = read_config(dir)?;
    if format == CheckpointFormat::Burn {
        let record = dir.join("model.mpk");
        check_weights_fit(&record, file_size(&record)?, config.param_count())?;
        let model = config.build::<B>(&ParamInit::deferred(device))?;
        return load_record(model, &dir.join("model"), device);
    }
    let files = WeightFiles::find(dir)?;
    check_weights_fit(files.path(), files.bytes()?, config.param_count())?;
    let tensors = files.read()?;
    let tied = config.tie_embeddings;
    if tied {
        check_tied_head(&tensors, &EMBEDDING_NAMES)?;
    }
    let model = config.build::<B>(&ParamInit::deferred(device))?;
    load_tensors(
        model,
        &tensors,
        files.path(),
        |path| {
            let (name, transpose) = pytorch_name(path, format);
            let names = if path == "embedding.weight" {
                // either spelling; with tied embeddings the head's copy also serves
                let mut names: Vec<String> =
                    EMBEDDING_NAMES.iter().map(|s| s.to_string()).collect();
                if tied {
                    names.push(HEAD_NAME.into());
                }
                names
            } else {
                vec![name]
            };
            TensorSource {
                names,
                transpose,
                part: None,
                stacked: Vec::new(),
            }
        },
        // with tied embeddings, the head and both embedding spellings are the same matrix
        |name| tied && (name == HEAD_NAME || EMBEDDING_NAMES.contains(&name)),
    )
}

/// Loads only the backbone (blocks and `norm_f`) of a Hugging Face or state-spaces checkpoint
/// folder; the embedding and LM head in the files are skipped.
pub fn load_backbone<B: Backend>(
    dir: impl AsRef<Path>,
    device: &B::Device,
) -> Result<Mamba2Backbone<B>> {
    let dir = dir.as_ref();
    let (config, format) = read_config(dir)?;
    if format == CheckpointFormat::Burn {
        return Ok(load_lm::<B>(dir, device)?.backbone);
    }
    let files = WeightFiles::find(dir)?;
    check_weights_fit(files.path(), files.bytes()?, config.backbone.param_count())?;
    let tensors = files.read()?;
    let model = config.backbone.build::<B>(&ParamInit::deferred(device))?;
    load_tensors(
        model,
        &tensors,
        files.path(),
        |path| {
            let (name, transpose) = pytorch_name(&format!("backbone.{path}"), format);
            TensorSource::whole(name, transpose)
        },
        |name| name == HEAD_NAME || EMBEDDING_NAMES.contains(&name),
    )
}

/// Saves `model` and its `config` to `dir` as a checkpoint in `format`, for Python or for this
/// crate, and returns the weights file:
///
/// - [`HuggingFace`](CheckpointFormat::HuggingFace): `config.json` (transformers'
///   `Mamba2Config`) and `model.safetensors`, which `Mamba2ForCausalLM.from_pretrained` reads;
/// - [`StateSpaces`](CheckpointFormat::StateSpaces): `config.json` (mamba_ssm's `MambaConfig`)
///   and `model.safetensors` under `MambaLMHeadModel`'s parameter names;
/// - [`Burn`](CheckpointFormat::Burn): [`save_lm`]'s `config.json` and `model.mpk`.
///
/// The safetensors files hold every parameter in the model's float type, linear weights as
/// PyTorch's `[out, in]`, tied embeddings once, with metadata `format: pt`. [`load_lm`] reads
/// all three back. A model the format cannot describe (a `D` per channel for transformers,
/// two norm epsilons for either) is a config error, and nothing is written. Low-rank adapters
/// ([`Mamba2Lm::with_lora`]) are written folded into their weights.
pub fn save_checkpoint<B: Backend>(
    model: &Mamba2Lm<B>,
    config: &Mamba2LmConfig,
    dir: impl AsRef<Path>,
    format: CheckpointFormat,
) -> Result<PathBuf> {
    // low-rank updates are written folded into their weights
    let model = model.lora_folded();
    let model = model.as_ref();
    match format {
        CheckpointFormat::Burn => save_lm(model, config, dir),
        other => export::save_pytorch_layout(model, config, dir.as_ref(), other),
    }
}

/// Saves `model` and its config to `dir` in this crate's format (`config.json`, `model.mpk`,
/// full precision); [`load_lm`] reads it back.
pub fn save_lm<B: Backend>(
    model: &Mamba2Lm<B>,
    config: &Mamba2LmConfig,
    dir: impl AsRef<Path>,
) -> Result<PathBuf> {
    // low-rank updates are written folded into their weights
    let model = model.lora_folded();
    let model = model.as_ref();
    let dir = dir.as_ref();
    std::fs::create_dir_all(dir).map_err(|e| Mamba2Error::file(dir, e))?;
    save_config(config, &dir.join("config.json"))?;
    let path = dir.join("model");
    save_record(model, &path)?;
    Ok(path.with_extension("mpk"))
}
