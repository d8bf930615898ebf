//! state-spaces `mamba_ssm`'s `MambaConfig` (`config.json` of a `MambaLMHeadModel` folder),
//! read into this crate's config.

use std::path::Path;

use serde::Deserialize;

use crate::error::{Mamba2Error, Result};
use crate::layers::backbone::Mamba2BackboneConfig;
use crate::layers::mixer::{DtLimit, Mamba2Config};
use crate::models::lm::Mamba2LmConfig;

/// state-spaces `MambaConfig` fields.
#[derive(Deserialize)]
pub(super) struct StateSpacesConfig {
    d_model: usize,
    #[serde(default)]
    d_intermediate: usize,
    n_layer: usize,
    vocab_size: usize,
    #[serde(default)]
    ssm_cfg: StateSpacesMixerConfig,
    #[serde(default)]
    attn_layer_idx: Vec<usize>,
    #[serde(default = "super::hf::defaults::enabled")]
    rms_norm: bool,
    #[serde(default = "default_pad_multiple")]
    pad_vocab_size_multiple: usize,
    #[serde(default = "super::hf::defaults::enabled")]
    tie_embeddings: bool,
    #[serde(default = "super::hf::defaults::eps")]
    norm_epsilon: f64,
}

/// state-spaces `Mamba2.__init__` arguments, with its defaults.
#[derive(Deserialize, Default)]
#[allow(non_snake_case)]
struct StateSpacesMixerConfig {
    layer: Option<String>,
    d_state: Option<usize>,
    d_conv: Option<usize>,
    expand: Option<usize>,
    headdim: Option<usize>,
    d_ssm: Option<usize>,
    ngroups: Option<usize>,
    chunk_size: Option<usize>,
    dt_min: Option<f64>,
    dt_max: Option<f64>,
    dt_init_floor: Option<f64>,
    dt_limit: Option<DtLimit>,
    A_init_range: Option<(f64, f64)>,
    bias: Option<bool>,
    conv_bias: Option<bool>,
    rmsnorm: Option<bool>,
    norm_before_gate: Option<bool>,
    D_has_hdim: Option<bool>,
}

/// `mamba_ssm`'s default `pad_vocab_size_multiple`.
fn default_pad_multiple() -> usize {
    8
}

impl StateSpacesConfig {
    pub(super) fn into_config(self, file: &Path) -> Result<Mamba2LmConfig> {
        let unsupported = |reason: String| Mamba2Error::Unsupported {
            file: file.to_path_buf(),
            reason,
        };
        let m = self.ssm_cfg;
        if m.layer.as_deref() == Some("Mamba3") {
            return Err(unsupported(
                "ssm_cfg.layer = \"Mamba3\": a Mamba-3 model, which `load_hybrid` reads".into(),
            ));
        }
        if m.layer.as_deref() != Some("Mamba2") {
            return Err(unsupported(format!(
                "ssm_cfg.layer = {:?} (only \"Mamba2\"; state-spaces defaults to Mamba-1)",
                m.layer
            )));
        }
        if self.d_intermediate != 0 {
            return Err(unsupported(format!(
                "d_intermediate = {} (MLP blocks)",
                self.d_intermediate
            )));
        }
        if !self.attn_layer_idx.is_empty() {
            return Err(unsupported(format!(
                "attention layers {:?}",
                self.attn_layer_idx
            )));
        }
        if !self.rms_norm {
            return Err(unsupported("rms_norm = false (LayerNorm blocks)".into()));
        }
        let d = Mamba2Config::new(self.d_model);
        let mixer = Mamba2Config {
            d_state: m.d_state.unwrap_or(d.d_state),
            d_conv: m.d_conv.unwrap_or(d.d_conv),
            expand: m.expand.unwrap_or(d.expand),
            headdim: m.headdim.unwrap_or(d.headdim),
            ngroups: m.ngroups.unwrap_or(d.ngroups),
            chunk_size: m.chunk_size.unwrap_or(d.chunk_size),
            dt_min: m.dt_min.unwrap_or(d.dt_min),
            dt_max: m.dt_max.unwrap_or(d.dt_max),
            dt_init_floor: m.dt_init_floor.unwrap_or(d.dt_init_floor),
            dt_limit: m.dt_limit.unwrap_or(d.dt_limit),
            a_init_range: m.A_init_range.unwrap_or(d.a_init_range),
            bias: m.bias.unwrap_or(d.bias),
            conv_bias: m.conv_bias.unwrap_or(d.conv_bias),
            rmsnorm: m.rmsnorm.unwrap_or(d.rmsnorm),
            norm_before_gate: m.norm_before_gate.unwrap_or(d.norm_before_gate),
            d_has_hdim: m.D_has_hdim.unwrap_or(d.d_has_hdim),
            norm_eps: self.norm_epsilon,
            ..d
        };
        if let Some(d_ssm) = m.d_ssm {
            if d_ssm != mixer.d_inner() {
                return Err(unsupported(format!(
                    "d_ssm = {d_ssm} < d_inner (gated MLP part)"
                )));
            }
        }
        let backbone =
            Mamba2BackboneConfig::new(self.n_layer, mixer).with_norm_eps(self.norm_epsilon);
        let config = Mamba2LmConfig::new(backbone, self.vocab_size)
            .with_pad_vocab_size_multiple(self.pad_vocab_size_multiple)
            .with_tie_embeddings(self.tie_embeddings);
        config.validate()?;
        Ok(config)
    }
}
