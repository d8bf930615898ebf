//! IBM's Granite 4.0-H as transformers 5.25 saves it (`model_type: granitemoehybrid`): its
//! `config.json` read into a [`HybridConfig`], and its tensor names.

use std::path::Path;

use serde::Deserialize;

use super::{layer_kind, mamba_head_dim, Layout, Rope, TensorName};
use crate::error::{Mamba2Error, Result};
use crate::layers::attention::AttentionConfig;
use crate::layers::mixer::{DtLimit, Mamba2Config};
use crate::layers::mlp::{MlpActivation, MlpConfig};
use crate::layers::moe::MoeConfig;
use crate::models::hybrid::{HybridConfig, HybridFamily, LayerKind};

/// `GraniteMoeHybridConfig`'s fields; absent ones take transformers 5.25's defaults.
#[derive(Deserialize)]
pub(super) struct GraniteConfig {
    #[serde(default = "defaults::vocab_size")]
    vocab_size: usize,
    #[serde(default = "defaults::hidden_size")]
    hidden_size: usize,
    #[serde(default = "defaults::num_hidden_layers")]
    num_hidden_layers: usize,
    #[serde(default = "defaults::num_attention_heads")]
    num_attention_heads: usize,
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
    #[serde(default = "defaults::unit")]
    embedding_multiplier: f64,
    #[serde(default = "defaults::unit")]
    logits_scaling: f64,
    #[serde(default = "defaults::unit")]
    residual_multiplier: f64,
    #[serde(default = "defaults::unit")]
    attention_multiplier: f64,
    #[serde(default = "defaults::num_local_experts")]
    num_local_experts: usize,
    #[serde(default = "defaults::num_experts_per_tok")]
    num_experts_per_tok: usize,
    #[serde(default = "defaults::intermediate_size")]
    intermediate_size: usize,
    #[serde(default = "defaults::shared_intermediate_size")]
    shared_intermediate_size: usize,
    position_embedding_type: Option<String>,
    #[serde(alias = "layers_block_type")]
    layer_types: Option<Vec<String>>,
    #[serde(default = "defaults::mamba_n_heads")]
    mamba_n_heads: usize,
    #[serde(default = "defaults::one")]
    mamba_n_groups: usize,
    #[serde(default = "defaults::mamba_d_state")]
    mamba_d_state: usize,
    mamba_d_head: Option<serde_json::Value>,
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

/// transformers 5.25's `GraniteMoeHybridConfig` defaults.
mod defaults {
    pub use super::super::defaults::*;

    pub fn vocab_size() -> usize {
        32000
    }
    pub fn rms_norm_eps() -> f64 {
        1e-6
    }
    pub fn num_local_experts() -> usize {
        8
    }
    pub fn num_experts_per_tok() -> usize {
        2
    }
    pub fn intermediate_size() -> usize {
        11008
    }
    pub fn shared_intermediate_size() -> usize {
        1024
    }
}

impl GraniteConfig {
    pub(super) fn into_config(self, file: &Path) -> Result<HybridConfig> {
        let unsupported = |reason: String| Mamba2Error::Unsupported {
            file: file.to_path_buf(),
            reason,
        };
        let activation = MlpActivation::from_hf(&self.hidden_act)
            .filter(|a| *a == MlpActivation::Silu)
            .ok_or_else(|| {
                unsupported(format!("hidden_act = {:?} (only silu)", self.hidden_act))
            })?;
        let layers = match &self.layer_types {
            None => vec![LayerKind::Mamba; self.num_hidden_layers],
            Some(kinds) => kinds
                .iter()
                .map(|k| layer_kind(k, false, file))
                .collect::<Result<Vec<_>>>()?,
        };
        if layers.len() != self.num_hidden_layers {
            return Err(Mamba2Error::config(
                "layer_types",
                format!(
                    "{} layer kinds for num_hidden_layers = {}",
                    layers.len(),
                    self.num_hidden_layers
                ),
            ));
        }
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
        let rope = match self.position_embedding_type.as_deref() {
            Some("rope") => Some(self.rope.config(head_dim, None, file)?),
            None | Some("nope") => None,
            Some(other) => {
                return Err(unsupported(format!("position_embedding_type = {other:?}")));
            }
        };
        let attention = AttentionConfig::new(
            d,
            n_heads,
            self.num_key_value_heads.unwrap_or(n_heads),
            head_dim,
        )
        .with_bias(self.attention_bias)
        .with_scale(Some(self.attention_multiplier))
        .with_rope(rope);
        let mlp = MlpConfig::new(d, self.shared_intermediate_size).with_activation(activation);
        // the experts beside the shared MLP, where there are any (the dense models have 0)
        let moe = (self.num_local_experts > 0).then(|| {
            MoeConfig::new(
                d,
                self.intermediate_size,
                self.num_local_experts,
                self.num_experts_per_tok,
            )
            .with_activation(activation)
        });
        let config = HybridConfig::new(
            HybridFamily::Granite,
            self.vocab_size,
            layers,
            mixer,
            attention,
            mlp,
        )
        .with_norm_eps(self.rms_norm_eps)
        .with_embedding_multiplier(self.embedding_multiplier)
        .with_residual_multiplier(self.residual_multiplier)
        .with_logits_scaling(self.logits_scaling)
        .with_tie_embeddings(self.tie_word_embeddings)
        .with_initializer_range(self.initializer_range)
        .with_moe(moe);
        config.validate()?;
        Ok(config)
    }
}

/// Granite's tensor names; the gated MLP's gate and up are the two halves of
/// `shared_mlp.input_linear`.
pub(super) const LAYOUT: Layout = Layout {
    prefix: "model",
    embedding: "embed_tokens",
    final_norm: "norm",
    input_norm: "input_layernorm",
    ffn_norm: "post_attention_layernorm",
    mamba: "mamba",
    attention: "self_attn",
    mlp: shared_mlp,
    moe: block_sparse_moe,
};

/// The experts of `block_sparse_moe`: the router's `router.layer`, every expert's gate and up
/// stacked as `input_linear` (`[experts, 2 · intermediate, hidden]`), their down projections as
/// `output_linear`.
fn block_sparse_moe(prefix: &str, tail: &str, _n_experts: usize) -> TensorName {
    let name = |t: &str| format!("{prefix}.block_sparse_moe.{t}");
    match tail {
        "router.weight" => TensorName::whole(name("router.layer.weight"), true),
        "up" => TensorName::whole(name("input_linear.weight"), false),
        "down" => TensorName::whole(name("output_linear.weight"), false),
        other => TensorName::whole(name(other), false),
    }
}

fn shared_mlp(prefix: &str, tail: &str) -> TensorName {
    let name = |t: &str| format!("{prefix}.shared_mlp.{t}");
    match tail {
        "gate.weight" => TensorName::part(name("input_linear.weight"), 0, 2, true),
        "up.weight" => TensorName::part(name("input_linear.weight"), 1, 2, true),
        "down.weight" => TensorName::whole(name("output_linear.weight"), true),
        other => TensorName::whole(name(other), false),
    }
}
