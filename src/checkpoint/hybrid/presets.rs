//! Published hybrid models' shapes, as the architecture fields of their `config.json`, read by
//! the same family readers as a folder's: a preset is what loading that model's folder would
//! build, without its weights.
//!
//! The fields were taken from copies of the published files (the models' own pages could not
//! be read here): `granite-4.0-h-350m` from a test of a port that mirrors the checkpoint,
//! `nemotron-h-8b` and `falcon-h1-0.5b` from NVIDIA Megatron-Bridge's conversion tests
//! (`mamba_d_ssm` of Falcon-H1 0.5B is `mamba_n_heads · mamba_d_head`, the only width
//! transformers accepts for it). Each one's parameter count equals the published one
//! (`tests/hybrid.rs`).

use std::path::{Path, PathBuf};

use super::super::config::parse_json;
use super::{config_from_value, Result};
use crate::error::Mamba2Error;
use crate::models::hybrid::HybridConfig;

/// The presets: name, `config.json` fields, published parameter count.
pub const HYBRID_PRESETS: [(&str, &str, u64); 3] = [
    (
        "granite-4.0-h-350m",
        include_str!("presets/granite-4.0-h-350m.json"),
        340_332_224,
    ),
    (
        "nemotron-h-8b",
        include_str!("presets/nemotron-h-8b.json"),
        8_100_852_736,
    ),
    (
        "falcon-h1-0.5b",
        include_str!("presets/falcon-h1-0.5b.json"),
        521_411_104,
    ),
];

/// The config of the published model `name` (one of [`HYBRID_PRESETS`]).
pub fn hybrid_preset(name: &str) -> Result<HybridConfig> {
    let Some((_, json, _)) = HYBRID_PRESETS.iter().find(|(n, _, _)| *n == name) else {
        let names: Vec<&str> = HYBRID_PRESETS.iter().map(|(n, _, _)| *n).collect();
        return Err(Mamba2Error::config(
            "preset",
            format!("no hybrid preset {name:?} (presets: {})", names.join(", ")),
        ));
    };
    let value = serde_json::from_str(json).expect("the presets are valid JSON");
    config_from_value(value, Path::new(name), "")
}

/// A hybrid model as transformers describes it: the text of its `config.json` (a preset's, a
/// folder's, or one written by hand in a family's fields). What a training run builds
/// ([`LmConfig`](crate::train::LmConfig)), and what it writes beside the trained weights, so that
/// the folder loads with [`load_hybrid`](super::load_hybrid) and in transformers.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HybridSpec {
    /// The `config.json` text.
    pub config_json: String,
}

impl HybridSpec {
    /// The published model `name` (one of [`HYBRID_PRESETS`]).
    pub fn preset(name: &str) -> Result<Self> {
        hybrid_preset(name)?;
        let (_, json, _) = HYBRID_PRESETS
            .iter()
            .find(|(n, _, _)| *n == name)
            .expect("hybrid_preset found it");
        Ok(Self {
            config_json: json.to_string(),
        })
    }

    /// The `config.json` at `path` (the file, or a folder holding it), checked.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file: PathBuf = match path.is_dir() {
            true => path.join("config.json"),
            false => path.to_path_buf(),
        };
        let config_json =
            std::fs::read_to_string(&file).map_err(|e| Mamba2Error::file(&file, e))?;
        let spec = Self { config_json };
        spec.config_at(&file)?;
        Ok(spec)
    }

    /// The model's config.
    pub fn config(&self) -> Result<HybridConfig> {
        self.config_at(Path::new("config.json"))
    }

    fn config_at(&self, file: &Path) -> Result<HybridConfig> {
        let (value, writer) = parse_json(&self.config_json, file)?;
        config_from_value(value, file, &writer)
    }

    /// The same model with a vocabulary of `vocab_size` tokens (`vocab_size` rewritten; the
    /// text is written again as indented JSON, so it must be strict JSON: transformers' tagged
    /// floats, not a bare `Infinity`).
    pub fn with_vocab_size(self, vocab_size: usize) -> Result<Self> {
        let file = Path::new("config.json");
        let mut value: serde_json::Value = serde_json::from_str(&self.config_json)
            .map_err(|e| Mamba2Error::file(file, format!("not strict JSON: {e}")))?;
        let Some(fields) = value.as_object_mut() else {
            return Err(Mamba2Error::file(file, "not a JSON object"));
        };
        fields.insert("vocab_size".into(), vocab_size.into());
        let config_json = serde_json::to_string_pretty(&value)
            .map_err(|e| Mamba2Error::file(file, e.to_string()))?;
        let spec = Self { config_json };
        spec.config()?;
        Ok(spec)
    }
}
