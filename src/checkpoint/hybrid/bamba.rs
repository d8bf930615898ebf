//! IBM's Bamba as transformers 5.25 saves it (`model_type: bamba`): its `config.json` read into a
//! [`HybridConfig`], and its tensor names.

use std::path::Path;

use serde::Deserialize;

use super::{check_silu, mamba_head_dim, no_experts, proj_mlp, Layout, Rope};
use crate::error::{Mamba2Error, Result};
use crate::layers::attention::AttentionConfig;
use crate::layers::mixer::{DtLimit, Mamba2Config};
use crate::layers::mlp::MlpConfig;
use crate::models::hybrid::{HybridConfig, HybridFamily, LayerKind};

/// `BambaConfig`'s fields; absent ones take transformers 5.25's defaults.
#[derive(Deserialize)]
pub(super) struct BambaConfig {
    #[serde(default = "defaults::vocab_size")]
    vocab_size: usize,
    #[serde(default = "defaults::hidden_size")]
    hidden_size: usize,
    #[serde(default = "defaults::intermediate_size")]
    intermediate_size: usize,
    #[serde(default = "defaults::num_hidden_layers")]
    num_hidden_layers: usize,
    #[serde(default = "defaults::num_attention_heads")]
    num_attention_heads: usize,
    #[serde(default = "defaults::num_key_value_heads")]
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    #[serde(default = "defaults::hidden_act")]
    hidden_act: String,
    #[serde(default = "defaults::rms_norm_eps")]
    rms_norm_eps: f64,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(flatten)]
    rope: Rope,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    mlp_bias: bool,
    attn_layer_indices: Option<Vec<usize>>,
    #[serde(default = "defaults::mamba_n_heads")]
    mamba_n_heads: usize,
    mamba_d_head: Option<serde_json::Value>,
    #[serde(default = "defaults::one")]
    mamba_n_groups: usize,
    #[serde(default = "defaults::mamba_d_state")]
    mamba_d_state: usize,
    #[serde(default = "defaults::mamba_d_conv")]
    mamba_d_conv: usize,
    #[serde(default = "defaults::mamba_expand")]
    mamba_expand: usize,
    #[serde(default = "defaults::mamba_chunk_size")]
    mamba_chunk_size: usize,
    #[serde(default = "defaults::enabled")]
    mamba_conv_bias: bool,
    #[serde(default)]
    mamba_proj_bias: bool,
    #[serde(default)]
    time_step_limit: DtLimit,
    #[serde(default = "defaults::initializer_range")]
    initializer_range: f64,
}

/// transformers 5.25's `BambaConfig` defaults.
mod defaults {
    pub use super::super::defaults::*;

    pub fn vocab_size() -> usize {
        128000
    }
    pub fn intermediate_size() -> usize {
        14336
    }
    pub fn num_key_value_heads() -> Option<usize> {
        Some(8)
    }
    pub fn rms_norm_eps() -> f64 {
        1e-5
    }
}

impl BambaConfig {
    pub(super) fn into_config(self, file: &Path) -> Result<HybridConfig> {
        // one activation for the MLP and the Mamba layers' convolution
        check_silu("hidden_act", &self.hidden_act, file)?;
        let n = self.num_hidden_layers;
        let attention_layers = self.attn_layer_indices.unwrap_or_default();
        if let Some(&i) = attention_layers.iter().find(|&&i| i >= n) {
            return Err(Mamba2Error::config(
                "attn_layer_indices",
                format!("layer {i} of num_hidden_layers = {n}"),
            ));
        }
        let layers = (0..n)
            .map(|i| match attention_layers.contains(&i) {
                true => LayerKind::Attention,
                false => LayerKind::Mamba,
            })
            .collect();
        let d = self.hidden_size;
        let d_inner = self.mamba_expand * d;
        let headdim = mamba_head_dim(self.mamba_d_head.as_ref(), d_inner, self.mamba_n_heads)?;
        let mixer = Mamba2Config::new(d)
            .with_d_state(self.mamba_d_state)
            .with_d_conv(self.mamba_d_conv)
            .with_expand(self.mamba_expand)
            .with_headdim(headdim)
            .with_ngroups(self.mamba_n_groups)
            .with_chunk_size(self.mamba_chunk_size)
            .with_dt_limit(self.time_step_limit)
            .with_bias(self.mamba_proj_bias)
            .with_conv_bias(self.mamba_conv_bias)
            .with_norm_eps(self.rms_norm_eps);
        let n_heads = self.num_attention_heads;
        let head_dim = self.head_dim.unwrap_or(d / n_heads.max(1));
        // transformers 5.25 rotates half of each head unless `rope_parameters` says otherwise
        let rope = self.rope.config(head_dim, Some(0.5), file)?;
        let attention = AttentionConfig::new(
            d,
            n_heads,
            self.num_key_value_heads.unwrap_or(n_heads),
            head_dim,
        )
        .with_bias(self.attention_bias)
        .with_rope(Some(rope));
        let mlp = MlpConfig::new(d, self.intermediate_size).with_bias(self.mlp_bias);
        let config = HybridConfig::new(
            HybridFamily::Bamba,
            self.vocab_size,
            layers,
            mixer,
            attention,
            mlp,
        )
        .with_norm_eps(self.rms_norm_eps)
        .with_tie_embeddings(self.tie_word_embeddings)
        .with_initializer_range(self.initializer_range);
        config.validate()?;
        Ok(config)
    }
}

/// Bamba's tensor names.
pub(super) const LAYOUT: Layout = Layout {
    prefix: "model",
    embedding: "embed_tokens",
    final_norm: "final_layernorm",
    input_norm: "input_layernorm",
    ffn_norm: "pre_ff_layernorm",
    mamba: "mamba",
    attention: "self_attn",
    mlp: |prefix, tail| proj_mlp("feed_forward", prefix, tail),
    moe: no_experts,
};
