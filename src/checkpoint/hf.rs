//! Hugging Face transformers' `Mamba2Config` (`config.json` of a `Mamba2ForCausalLM` folder),
//! read into this crate's config.

use std::path::Path;

use serde::Deserialize;

use crate::error::{Mamba2Error, Result};
use crate::layers::backbone::Mamba2BackboneConfig;
use crate::layers::mixer::{DtLimit, Mamba2Config};
use crate::models::lm::Mamba2LmConfig;

/// Hugging Face `Mamba2Config` fields; absent fields take transformers' defaults.
#[derive(Deserialize)]
pub(super) struct HfConfig {
    #[serde(default = "defaults::num_heads")]
    num_heads: usize,
    #[serde(default = "defaults::head_dim")]
    head_dim: usize,
    #[serde(default = "defaults::vocab_size")]
    vocab_size: usize,
    #[serde(default = "defaults::hidden_size")]
    hidden_size: usize,
    #[serde(default = "defaults::state_size")]
    state_size: usize,
    #[serde(default = "defaults::num_hidden_layers")]
    num_hidden_layers: usize,
    #[serde(default = "defaults::eps")]
    layer_norm_epsilon: f64,
    #[serde(default = "defaults::expand")]
    expand: usize,
    #[serde(default = "defaults::conv_kernel")]
    conv_kernel: usize,
    #[serde(default = "defaults::n_groups")]
    n_groups: usize,
    #[serde(default)]
    use_bias: bool,
    #[serde(default = "defaults::enabled")]
    use_conv_bias: bool,
    #[serde(default = "defaults::hidden_act")]
    hidden_act: String,
    #[serde(default = "defaults::time_step_min")]
    time_step_min: f64,
    #[serde(default = "defaults::time_step_max")]
    time_step_max: f64,
    #[serde(default = "defaults::time_step_floor")]
    time_step_floor: f64,
    #[serde(default)]
    time_step_limit: DtLimit,
    #[serde(default = "defaults::chunk_size")]
    chunk_size: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default = "defaults::enabled")]
    rms_norm: bool,
    #[serde(default)]
    norm_before_gate: bool,
    #[serde(default = "defaults::initializer_range")]
    initializer_range: f64,
    #[serde(default)]
    rescale_prenorm_residual: bool,
}

/// transformers' `Mamba2Config` defaults (those of Mamba-Codestral-7B).
pub(super) mod defaults {
    /// The flags both formats turn on unless told otherwise.
    pub fn enabled() -> bool {
        true
    }

    pub fn num_heads() -> usize {
        128
    }
    pub fn head_dim() -> usize {
        64
    }
    pub fn vocab_size() -> usize {
        32768
    }
    pub fn hidden_size() -> usize {
        4096
    }
    pub fn state_size() -> usize {
        128
    }
    pub fn num_hidden_layers() -> usize {
        64
    }
    pub fn eps() -> f64 {
        1e-5
    }
    pub fn expand() -> usize {
        2
    }
    pub fn conv_kernel() -> usize {
        4
    }
    pub fn n_groups() -> usize {
        8
    }
    pub fn hidden_act() -> String {
        "silu".into()
    }
    pub fn time_step_min() -> f64 {
        0.001
    }
    pub fn time_step_max() -> f64 {
        0.1
    }
    pub fn time_step_floor() -> f64 {
        1e-4
    }
    pub fn chunk_size() -> usize {
        256
    }
    pub fn initializer_range() -> f64 {
        0.1
    }
}

impl HfConfig {
    pub(super) fn into_config(self, file: &Path) -> Result<Mamba2LmConfig> {
        let unsupported = |reason: String| Mamba2Error::Unsupported {
            file: file.to_path_buf(),
            reason,
        };
        if !matches!(self.hidden_act.as_str(), "silu" | "swish") {
            return Err(unsupported(format!(
                "hidden_act = {:?} (only silu)",
                self.hidden_act
            )));
        }
        if self.num_heads * self.head_dim != self.expand * self.hidden_size {
            return Err(Mamba2Error::config(
                "num_heads",
                format!(
                    "num_heads · head_dim = {} · {} must equal expand · hidden_size = {} · {}",
                    self.num_heads, self.head_dim, self.expand, self.hidden_size
                ),
            ));
        }
        let mixer = Mamba2Config::new(self.hidden_size)
            .with_d_state(self.state_size)
            .with_d_conv(self.conv_kernel)
            .with_expand(self.expand)
            .with_headdim(self.head_dim)
            .with_ngroups(self.n_groups)
            .with_chunk_size(self.chunk_size)
            .with_dt_min(self.time_step_min)
            .with_dt_max(self.time_step_max)
            .with_dt_init_floor(self.time_step_floor)
            .with_dt_limit(self.time_step_limit)
            .with_bias(self.use_bias)
            .with_conv_bias(self.use_conv_bias)
            .with_rmsnorm(self.rms_norm)
            .with_norm_eps(self.layer_norm_epsilon)
            .with_norm_before_gate(self.norm_before_gate);
        let backbone = Mamba2BackboneConfig::new(self.num_hidden_layers, mixer)
            .with_norm_eps(self.layer_norm_epsilon)
            .with_rescale_prenorm_residual(self.rescale_prenorm_residual);
        let config = Mamba2LmConfig::new(backbone, self.vocab_size)
            .with_pad_vocab_size_multiple(1)
            .with_tie_embeddings(self.tie_word_embeddings)
            .with_initializer_range(self.initializer_range);
        config.validate()?;
        Ok(config)
    }
}
