//! `config.json` in any of the three formats: which one a file is, and the model config it
//! describes.

use std::path::Path;

use super::hf::HfConfig;
use super::state_spaces::StateSpacesConfig;
use crate::error::{Mamba2Error, Result};
use crate::models::lm::Mamba2LmConfig;

/// The layout a checkpoint folder is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointFormat {
    /// Hugging Face transformers (`Mamba2Config`, `backbone.embeddings.*`).
    HuggingFace,
    /// state-spaces `mamba_ssm` (`ssm_cfg`, `backbone.embedding.*`).
    StateSpaces,
    /// This crate's own record (`model.mpk`).
    Burn,
}

/// Reads `dir/config.json` in any of the three formats.
///
/// Python's JSON (`Infinity`, `NaN`) is accepted. The file is parsed once, into a JSON value
/// that holds a non-finite number as `null`: the dt limits read a `null` bound as `∞` (this
/// crate writes an infinite bound so too), every other number field refuses it.
pub fn read_config(dir: &Path) -> Result<(Mamba2LmConfig, CheckpointFormat)> {
    let file = dir.join("config.json");
    parse_config(&file).map_err(|e| match e {
        // name the file too
        Mamba2Error::InvalidConfig { field, reason } => Mamba2Error::ConfigFile {
            file: file.clone(),
            field,
            reason,
        },
        e => e,
    })
}

fn parse_config(file: &Path) -> Result<(Mamba2LmConfig, CheckpointFormat)> {
    let text = std::fs::read_to_string(file).map_err(|e| Mamba2Error::file(file, e))?;
    let value: serde_json::Value = json5::from_str(&text)
        .map_err(|e| Mamba2Error::file(file, format!("not valid JSON: {e}")))?;
    let has = |key: &str| value.get(key).is_some();
    let is_mamba2 = value.get("model_type").and_then(|v| v.as_str()) == Some("mamba2");
    let format = if has("ssm_cfg") || (has("d_model") && has("n_layer")) {
        CheckpointFormat::StateSpaces
    } else if has("backbone") && has("vocab_size") && !has("hidden_size") {
        CheckpointFormat::Burn
    } else if has("hidden_size") || is_mamba2 {
        CheckpointFormat::HuggingFace
    } else {
        return Err(Mamba2Error::file(
            file,
            "not a Mamba-2 config (no hidden_size, d_model/n_layer or backbone)",
        ));
    };
    let parse_err = |e: serde_json::Error| Mamba2Error::file(file, format!("bad config: {e}"));
    match format {
        CheckpointFormat::StateSpaces => {
            let c: StateSpacesConfig = serde_json::from_value(value).map_err(parse_err)?;
            Ok((c.into_config(file)?, format))
        }
        CheckpointFormat::Burn => {
            let c: Mamba2LmConfig = serde_json::from_value(value).map_err(parse_err)?;
            Ok((c, format))
        }
        CheckpointFormat::HuggingFace => {
            let c: HfConfig = serde_json::from_value(value).map_err(parse_err)?;
            Ok((c.into_config(file)?, format))
        }
    }
    .and_then(|(c, format)| {
        c.validate()?;
        Ok((c, format))
    })
}
