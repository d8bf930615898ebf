//! Mamba-3 layers in `mamba_ssm`'s names: a layer's constructor arguments (`Mamba3(**config)`,
//! as a JSON object) and its state dict (`in_proj.weight`, `dt_bias`, `B_bias`, `C_bias`,
//! `B_norm.weight`, `C_norm.weight`, `D`, `norm.weight`, `out_proj.weight`, and MIMO's
//! `mimo_x`, `mimo_z`, `mimo_o`) under any prefix (`backbone.layers.3.mixer.` in a language
//! model's file); and a layer written back in that form.

use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;
use serde::Deserialize;
use serde_json::json;

use super::export::{exported, write_safetensors};
use super::record::write_atomic;
use super::safetensors::{load_tensors, TensorSource};
use super::weights::WeightFiles;
use crate::error::{Mamba2Error, Result};
use crate::init::ParamInit;
use crate::layers::mamba3::{Mamba3, Mamba3Config};

/// `mamba_ssm`'s `Mamba3` constructor arguments, as its defaults give them.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Mamba3Args {
    d_model: usize,
    #[serde(default = "defaults::d_state")]
    d_state: usize,
    #[serde(default = "defaults::expand")]
    expand: usize,
    #[serde(default = "defaults::headdim")]
    headdim: usize,
    #[serde(default = "defaults::one")]
    ngroups: usize,
    #[serde(default = "defaults::rope_fraction")]
    rope_fraction: f64,
    #[serde(default = "defaults::dt_min")]
    dt_min: f64,
    #[serde(default = "defaults::dt_max")]
    dt_max: f64,
    #[serde(default = "defaults::floor")]
    dt_init_floor: f64,
    #[serde(default = "defaults::floor", rename = "A_floor")]
    a_floor: f64,
    #[serde(default)]
    is_outproj_norm: bool,
    #[serde(default)]
    is_mimo: bool,
    #[serde(default = "defaults::mimo_rank")]
    mimo_rank: usize,
    // where MIMO's norm runs in mamba_ssm's kernels: the same numbers either way
    #[serde(default = "defaults::yes")]
    #[allow(dead_code)]
    fuse_pregate_headwise_norm: bool,
    #[serde(default = "defaults::chunk_size")]
    chunk_size: usize,
    // accepted and unused by `Mamba3` itself
    #[serde(default)]
    #[allow(dead_code)]
    dropout: f64,
    #[serde(default)]
    #[allow(dead_code)]
    layer_idx: Option<usize>,
    #[serde(default)]
    #[allow(dead_code)]
    n_layer: Option<usize>,
}

/// `mamba_ssm` 2.3's defaults.
mod defaults {
    pub fn d_state() -> usize {
        128
    }
    pub fn expand() -> usize {
        2
    }
    pub fn headdim() -> usize {
        64
    }
    pub fn one() -> usize {
        1
    }
    pub fn rope_fraction() -> f64 {
        0.5
    }
    pub fn dt_min() -> f64 {
        1e-3
    }
    pub fn dt_max() -> f64 {
        0.1
    }
    pub fn floor() -> f64 {
        1e-4
    }
    pub fn mimo_rank() -> usize {
        4
    }
    pub fn yes() -> bool {
        true
    }
    pub fn chunk_size() -> usize {
        64
    }
}

/// The layer's configuration from `mamba_ssm`'s constructor arguments (a JSON object, as a
/// layer's `config.json` or an LM's `ssm_cfg` holds them, defaults filled in); unknown keys
/// are errors naming them.
pub fn mamba3_config_from_json(json: &str, origin: &Path) -> Result<Mamba3Config> {
    let args: Mamba3Args = serde_json::from_str(json)
        .map_err(|e| Mamba2Error::file(origin, format!("not a Mamba3 config: {e}")))?;
    let config = Mamba3Config::new(args.d_model)
        .with_d_state(args.d_state)
        .with_expand(args.expand)
        .with_headdim(args.headdim)
        .with_ngroups(args.ngroups)
        .with_rope_fraction(args.rope_fraction)
        .with_dt_min(args.dt_min)
        .with_dt_max(args.dt_max)
        .with_dt_init_floor(args.dt_init_floor)
        .with_a_floor(args.a_floor)
        .with_is_outproj_norm(args.is_outproj_norm)
        .with_is_mimo(args.is_mimo)
        .with_mimo_rank(args.mimo_rank)
        .with_chunk_size(args.chunk_size);
    config.validate()?;
    Ok(config)
}

/// The state-dict name of a [`Mamba3`] parameter (its path in the module: `b_norm.weight`),
/// and whether the file holds its transpose (`nn.Linear`'s `[out, in]`).
pub fn mamba3_name(path: &str) -> (String, bool) {
    let name = match path {
        "b_bias" => "B_bias",
        "c_bias" => "C_bias",
        "b_norm.weight" => "B_norm.weight",
        "c_norm.weight" => "C_norm.weight",
        "d" => "D",
        other => other,
    };
    let transpose = path == "in_proj.weight" || path == "out_proj.weight";
    (name.to_string(), transpose)
}

/// Loads a Mamba-3 layer of `config` from the safetensors file `file`, its tensors named
/// `prefix` + `mamba_ssm`'s names (`prefix` empty for a layer's own state dict). Tensors
/// under other prefixes are left alone; one under `prefix` that the layer has no place for,
/// or a missing or misshapen one, is an error naming it, and nothing is built.
pub fn load_mamba3<B: Backend>(
    config: &Mamba3Config,
    file: &Path,
    prefix: &str,
    device: &B::Device,
) -> Result<Mamba3<B>> {
    let tensors = WeightFiles::Single(file.to_path_buf()).read()?;
    let layer = config.build::<B>(&ParamInit::deferred(device), 1.0)?;
    load_tensors(
        layer,
        &tensors,
        file,
        |path| {
            let (name, transpose) = mamba3_name(path);
            TensorSource::whole(format!("{prefix}{name}"), transpose)
        },
        |name| !name.starts_with(prefix),
    )
}

/// Writes `layer` (built from `config`) to `dir` as the golden cases hold a layer:
/// `config.json` with `mamba_ssm`'s constructor arguments (`Mamba3(**config)`) and
/// `model.safetensors` with its state dict (`load_state_dict` takes it; linear weights
/// `[out, in]`, the layer's float type). Returns the weights file. A layer of other sizes
/// than `config`'s is an error, and nothing is written.
pub fn save_mamba3<B: Backend>(
    layer: &Mamba3<B>,
    config: &Mamba3Config,
    dir: &Path,
) -> Result<PathBuf> {
    config.validate()?;
    let built = (
        layer.d_model(),
        layer.nheads(),
        layer.num_rope_angles(),
        layer.norm.is_some(),
        layer.mimo_x.is_some(),
        layer.rank(),
    );
    let described = (
        config.d_model,
        config.nheads(),
        config.num_rope_angles(),
        config.is_outproj_norm,
        config.is_mimo,
        config.rank(),
    );
    if built != described {
        return Err(Mamba2Error::InvalidInput {
            name: "config",
            reason: format!(
                "describes (d_model, heads, angles, norm, MIMO, rank) {described:?}, the layer \
                 has {built:?}"
            ),
        });
    }
    let args = json!({
        "d_model": config.d_model,
        "d_state": config.d_state,
        "expand": config.expand,
        "headdim": config.headdim,
        "ngroups": config.ngroups,
        "rope_fraction": config.rope_fraction,
        "dt_min": config.dt_min,
        "dt_max": config.dt_max,
        "dt_init_floor": config.dt_init_floor,
        "A_floor": config.a_floor,
        "is_outproj_norm": config.is_outproj_norm,
        "is_mimo": config.is_mimo,
        "mimo_rank": config.mimo_rank,
        "chunk_size": layer.chunk_size(),
    });
    std::fs::create_dir_all(dir).map_err(|e| Mamba2Error::file(dir, e))?;
    let config_file = dir.join("config.json");
    let text = serde_json::to_string_pretty(&args).expect("JSON of numbers and flags");
    write_atomic(&config_file, text.as_bytes()).map_err(|e| Mamba2Error::file(&config_file, e))?;
    write_safetensors(dir, exported(layer, &mamba3_name))
}
