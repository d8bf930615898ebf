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

use std::path::Path;

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
