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
/// Non-finite floats are accepted in every encoding transformers writes or has written: bare
/// (Python's JSON: `Infinity`, `NaN`) and tagged (`{"__float__": "Infinity"}`, transformers 5's
/// `save_pretrained`). The file is parsed once, into a JSON value that holds a non-finite number
/// as `null`: the dt limits read a `null` bound as `∞` (this crate writes an infinite bound so
/// too), every other number field refuses it. A field of the wrong type is an error that names
/// its JSON path (`time_step_limit[1]`) and, where the file says so, the transformers version
/// that wrote it.
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

/// `file` parsed as JSON (in the lenient form transformers writes: bare non-finite floats,
/// tagged floats decoded), and a note naming the transformers version that wrote it (empty
/// when the file does not say), for the errors.
pub(super) fn read_json(file: &Path) -> Result<(serde_json::Value, String)> {
    let text = std::fs::read_to_string(file).map_err(|e| Mamba2Error::file(file, e))?;
    parse_json(&text, file)
}

/// `text` (of `file`, for the errors) parsed as [`read_json`] parses a file.
pub(super) fn parse_json(text: &str, file: &Path) -> Result<(serde_json::Value, String)> {
    let mut value: serde_json::Value = json5::from_str(text)
        .map_err(|e| Mamba2Error::file(file, format!("not valid JSON: {e}")))?;
    decode_tagged_floats(&mut value);
    let writer = value
        .get("transformers_version")
        .and_then(|v| v.as_str())
        .map(|v| format!(" (written by transformers {v})"))
        .unwrap_or_default();
    Ok((value, writer))
}

/// Reads `value` (of `file`, written by `writer`) as a `T`; an error names the field's JSON path.
pub(super) fn from_json<T: serde::de::DeserializeOwned>(
    value: serde_json::Value,
    file: &Path,
    writer: &str,
) -> Result<T> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let at = if path == "." {
            String::new()
        } else {
            format!("`{path}`: ")
        };
        Mamba2Error::file(file, format!("bad config: {at}{}{writer}", e.inner()))
    })
}

/// The `model_type`s of the hybrid families: those [`load_hybrid`](super::load_hybrid) reads
/// and those to come, for the error of a Mamba-2 loader given one.
pub(super) const HYBRID_MODEL_TYPES: [&str; 4] =
    ["granitemoehybrid", "bamba", "nemotron_h", "falcon_h1"];

/// transformers' `model_type` of a config, if it names one.
pub(super) fn model_type(value: &serde_json::Value) -> Option<&str> {
    value.get("model_type").and_then(|v| v.as_str())
}

fn parse_config(file: &Path) -> Result<(Mamba2LmConfig, CheckpointFormat)> {
    let (value, writer) = read_json(file)?;
    let has = |key: &str| value.get(key).is_some();
    match model_type(&value) {
        None | Some("mamba2") => {}
        Some(other) => {
            let hint = if HYBRID_MODEL_TYPES.contains(&other) {
                " (a hybrid model: `load_hybrid` reads it)"
            } else {
                ""
            };
            return Err(Mamba2Error::Unsupported {
                file: file.to_path_buf(),
                reason: format!("model_type {other:?} is not a Mamba-2 language model{hint}"),
            });
        }
    }
    let is_mamba2 = model_type(&value) == Some("mamba2");
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
    match format {
        CheckpointFormat::StateSpaces => {
            let c: StateSpacesConfig = from_json(value, file, &writer)?;
            Ok((c.into_config(file)?, format))
        }
        CheckpointFormat::Burn => Ok((from_json(value, file, &writer)?, format)),
        CheckpointFormat::HuggingFace => {
            let c: HfConfig = from_json(value, file, &writer)?;
            Ok((c.into_config(file)?, format))
        }
    }
    .and_then(|(c, format)| {
        c.validate()?;
        Ok((c, format))
    })
}

/// Replaces each float that transformers wrote tagged, `{"__float__": "Infinity"}` (its JSON
/// encoder since version 5, for the floats plain JSON cannot hold), by the value the bare
/// literal parses to: `null` for a non-finite one (as the parser gives for `Infinity`), the
/// number otherwise. An object whose tag does not hold a float is left as it is, for the
/// field's own error.
fn decode_tagged_floats(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let tagged = match (map.len(), map.get("__float__")) {
                (1, Some(Value::String(s))) => s.trim().parse::<f64>().ok(),
                _ => None,
            };
            match tagged {
                Some(x) => {
                    *value = serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
                }
                None => map.values_mut().for_each(decode_tagged_floats),
            }
        }
        Value::Array(items) => items.iter_mut().for_each(decode_tagged_floats),
        _ => {}
    }
}
