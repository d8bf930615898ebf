//! Published hybrid models' shapes, as the architecture fields of their `config.json`, read by
//! the same family readers as a folder's: a preset is what loading that model's folder would
//! build, without its weights.
//!
//! The fields were taken from copies of the published files (the models' own pages could not
//! be read here), each checked by its parameter count, which equals the published one
//! (`tests/hybrid.rs`); docs/hybrids.md (Presets) gives each one's sources and the fields that
//! no copy showed.

use std::path::{Path, PathBuf};

use super::super::config::parse_json;
use super::{config_from_value, Result};
use crate::error::Mamba2Error;
use crate::models::hybrid::HybridConfig;

/// The presets: name, `config.json` fields, published parameter count.
pub const HYBRID_PRESETS: [(&str, &str, u64); 10] = [
    (
        "granite-4.0-h-350m",
        include_str!("presets/granite-4.0-h-350m.json"),
        340_332_224,
    ),
    (
        "granite-4.0-h-1b",
        include_str!("presets/granite-4.0-h-1b.json"),
        1_461_538_368,
    ),
    (
        "granite-4.0-h-micro",
        include_str!("presets/granite-4.0-h-micro.json"),
        3_191_396_096,
    ),
    (
        "granite-4.0-h-tiny",
        include_str!("presets/granite-4.0-h-tiny.json"),
        6_939_037_248,
    ),
    (
        "granite-4.0-h-small",
        include_str!("presets/granite-4.0-h-small.json"),
        32_207_337_984,
    ),
    (
        "bamba-9b",
        include_str!("presets/bamba-9b.json"),
        9_780_235_392,
    ),
    (
        "nemotron-h-4b",
        include_str!("presets/nemotron-h-4b.json"),
        4_489_223_040,
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
    (
        "falcon-h1-1.5b",
        include_str!("presets/falcon-h1-1.5b.json"),
        1_554_859_392,
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
    /// The range of the Mamba layers' initial step sizes `dt` (log-uniform), where a run sets
    /// it (`None`: the mixers' default, 0.001 … 0.1). An init, so not in `config.json`.
    #[serde(default)]
    pub dt_init_range: Option<(f64, f64)>,
    /// The range of the Mamba layers' initial decay rates `-A` (uniform), where a run sets it
    /// (`None`: the mixer's default, 1 … 16). An init, so not in `config.json`.
    #[serde(default)]
    pub a_init_range: Option<(f64, f64)>,
}

impl HybridSpec {
    /// The published model `name` (one of [`HYBRID_PRESETS`]).
    pub fn preset(name: &str) -> Result<Self> {
        hybrid_preset(name)?;
        let (_, json, _) = HYBRID_PRESETS
            .iter()
            .find(|(n, _, _)| *n == name)
            .expect("hybrid_preset found it");
        Ok(Self::new(json.to_string()))
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
        let spec = Self::new(config_json);
        spec.config_at(&file)?;
        Ok(spec)
    }

    /// The model of `config_json` (not checked until [`config`](Self::config)), the mixer's
    /// default init.
    pub fn new(config_json: impl Into<String>) -> Self {
        Self {
            config_json: config_json.into(),
            dt_init_range: None,
            a_init_range: None,
        }
    }

    /// The same model with the Mamba layers' initial `dt` drawn log-uniformly from
    /// `range` (`None`: the mixer's default).
    pub fn with_dt_init_range(self, range: Option<(f64, f64)>) -> Self {
        Self {
            dt_init_range: range,
            ..self
        }
    }

    /// The same model with the Mamba layers' initial `-A` drawn uniformly from `range`
    /// (`None`: the mixer's default).
    pub fn with_a_init_range(self, range: Option<(f64, f64)>) -> Self {
        Self {
            a_init_range: range,
            ..self
        }
    }

    /// The model's config, as `config.json` describes it.
    pub fn config(&self) -> Result<HybridConfig> {
        self.config_at(Path::new("config.json"))
    }

    /// The config a run builds the model from: [`config`](Self::config) with the init ranges
    /// set here, checked.
    pub fn init_config(&self) -> Result<HybridConfig> {
        let mut config = self.config()?;
        if let Some((min, max)) = self.dt_init_range {
            (config.mixer.dt_min, config.mixer.dt_max) = (min, max);
            if let Some(mamba3) = &mut config.mamba3 {
                (mamba3.dt_min, mamba3.dt_max) = (min, max);
            }
        }
        if let Some(range) = self.a_init_range {
            config.mixer.a_init_range = range;
        }
        config.validate()?;
        Ok(config)
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
        let spec = Self {
            config_json,
            ..self
        };
        spec.config()?;
        Ok(spec)
    }
}
