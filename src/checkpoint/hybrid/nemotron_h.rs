//! NVIDIA's Nemotron-H as transformers 5.25 saves it (`model_type: nemotron_h`): its
//! `config.json` read into a [`HybridConfig`], and its tensor names. Its layers are one operation
//! each (a Mamba layer, attention or an MLP, on one norm), its Mamba width is
//! `mamba_num_heads · mamba_head_dim` whatever `expand` says, its attention has no positions,
//! and its head is never tied.

use std::path::Path;

use serde::Deserialize;

use super::{check_silu, layer_kind, proj_mlp, Layout, TensorName};
use crate::error::{Mamba2Error, Result};
use crate::layers::attention::AttentionConfig;
use crate::layers::mixer::{DtLimit, Mamba2Config};
use crate::layers::mlp::{MlpActivation, MlpConfig};
use crate::layers::moe::{MoeConfig, RouterKind};
use crate::models::hybrid::{HybridConfig, HybridFamily, LayerKind};

/// `NemotronHConfig`'s fields (and the older names it renames on load); absent ones take
/// transformers 5.25's defaults. `tie_word_embeddings`, `attention_bias`, `expand` and
/// `num_hidden_layers` are not read: the modeling code ignores them.
#[derive(Deserialize)]
pub(super) struct NemotronHConfig {
    #[serde(default = "defaults::vocab_size")]
    vocab_size: usize,
    #[serde(default = "defaults::hidden_size")]
    hidden_size: usize,
    #[serde(alias = "layer_types")]
    layers_block_type: Option<Vec<String>>,
    hybrid_override_pattern: Option<String>,
    #[serde(default = "defaults::num_attention_heads")]
    num_attention_heads: usize,
    #[serde(default = "defaults::num_key_value_heads")]
    num_key_value_heads: Option<usize>,
    #[serde(default = "defaults::head_dim")]
    head_dim: usize,
    #[serde(default = "defaults::intermediate_size")]
    intermediate_size: usize,
    #[serde(default = "defaults::mlp_hidden_act")]
    mlp_hidden_act: String,
    #[serde(default)]
    mlp_bias: bool,
    #[serde(default = "defaults::ssm_state_size")]
    ssm_state_size: usize,
    #[serde(default = "defaults::mamba_num_heads")]
    mamba_num_heads: usize,
    #[serde(default = "defaults::mamba_head_dim")]
    mamba_head_dim: usize,
    #[serde(default = "defaults::mamba_hidden_act")]
    mamba_hidden_act: String,
    #[serde(default = "defaults::n_groups", alias = "mamba_n_groups")]
    n_groups: usize,
    #[serde(default = "defaults::conv_kernel", alias = "mamba_d_conv")]
    conv_kernel: usize,
    #[serde(default, alias = "mamba_dt_limit")]
    time_step_limit: DtLimit,
    #[serde(default = "defaults::enabled", alias = "mamba_conv_bias")]
    use_conv_bias: bool,
    #[serde(default = "defaults::chunk_size", alias = "mamba_chunk_size")]
    chunk_size: usize,
    #[serde(default)]
    use_bias: bool,
    #[serde(default = "defaults::layer_norm_epsilon")]
    layer_norm_epsilon: f64,
    #[serde(default = "defaults::initializer_range")]
    initializer_range: f64,
    #[serde(default)]
    num_nextn_predict_layers: usize,
    #[serde(default = "defaults::n_routed_experts", alias = "num_local_experts")]
    n_routed_experts: usize,
    #[serde(default = "defaults::num_experts_per_tok")]
    num_experts_per_tok: usize,
    #[serde(default = "defaults::moe_intermediate_size")]
    moe_intermediate_size: usize,
    #[serde(default = "defaults::moe_intermediate_size")]
    moe_shared_expert_intermediate_size: usize,
    moe_latent_size: Option<usize>,
    #[serde(default = "defaults::one")]
    n_group: usize,
    #[serde(default = "defaults::one")]
    topk_group: usize,
    #[serde(default = "defaults::enabled")]
    norm_topk_prob: bool,
    #[serde(default = "defaults::unit")]
    routed_scaling_factor: f64,
}

/// transformers 5.25's `NemotronHConfig` defaults.
mod defaults {
    pub fn enabled() -> bool {
        true
    }
    pub fn one() -> usize {
        1
    }
    pub fn unit() -> f64 {
        1.0
    }
    pub fn n_routed_experts() -> usize {
        8
    }
    pub fn num_experts_per_tok() -> usize {
        2
    }
    pub fn moe_intermediate_size() -> usize {
        7688
    }
    pub fn vocab_size() -> usize {
        131072
    }
    pub fn hidden_size() -> usize {
        4096
    }
    pub fn num_attention_heads() -> usize {
        32
    }
    pub fn num_key_value_heads() -> Option<usize> {
        Some(8)
    }
    pub fn head_dim() -> usize {
        128
    }
    pub fn intermediate_size() -> usize {
        21504
    }
    pub fn mlp_hidden_act() -> String {
        "relu2".into()
    }
    pub fn ssm_state_size() -> usize {
        128
    }
    pub fn mamba_num_heads() -> usize {
        128
    }
    pub fn mamba_head_dim() -> usize {
        64
    }
    pub fn mamba_hidden_act() -> String {
        "silu".into()
    }
    pub fn n_groups() -> usize {
        8
    }
    pub fn conv_kernel() -> usize {
        4
    }
    pub fn chunk_size() -> usize {
        128
    }
    pub fn layer_norm_epsilon() -> f64 {
        1e-5
    }
    pub fn initializer_range() -> f64 {
        0.02
    }
}

impl NemotronHConfig {
    /// The layer kinds: `layers_block_type`, else `hybrid_override_pattern` (one character a
    /// layer: `M` Mamba, `*` attention, `-` MLP, `E` mixture of experts), else transformers'
    /// default pattern.
    fn layers(&self, file: &Path) -> Result<Vec<LayerKind>> {
        let names: Vec<String> = match (&self.layers_block_type, &self.hybrid_override_pattern) {
            (Some(kinds), _) => kinds.clone(),
            (None, Some(pattern)) => pattern
                .chars()
                .map(|c| match c {
                    'M' => Ok("linear_attention".to_string()),
                    '*' => Ok("full_attention".to_string()),
                    '-' => Ok("mlp".to_string()),
                    'E' => Ok("moe".to_string()),
                    other => Err(Mamba2Error::config(
                        "hybrid_override_pattern",
                        format!("layer character {other:?} (one of M, *, -, E)"),
                    )),
                })
                .collect::<Result<_>>()?,
            (None, None) => ["linear_attention", "moe", "full_attention", "mlp"]
                .map(String::from)
                .to_vec(),
        };
        names.iter().map(|k| layer_kind(k, true, file)).collect()
    }

    pub(super) fn into_config(self, file: &Path) -> Result<HybridConfig> {
        let unsupported = |reason: String| Mamba2Error::Unsupported {
            file: file.to_path_buf(),
            reason,
        };
        if self.num_nextn_predict_layers > 0 {
            return Err(unsupported(format!(
                "num_nextn_predict_layers = {}: multi-token prediction layers",
                self.num_nextn_predict_layers
            )));
        }
        if let Some(latent) = self.moe_latent_size {
            return Err(unsupported(format!(
                "moe_latent_size = {latent}: the experts' latent projections"
            )));
        }
        check_silu("mamba_hidden_act", &self.mamba_hidden_act, file)?;
        let activation = MlpActivation::from_hf(&self.mlp_hidden_act).ok_or_else(|| {
            unsupported(format!(
                "mlp_hidden_act = {:?} (relu2 or silu)",
                self.mlp_hidden_act
            ))
        })?;
        let layers = self.layers(file)?;
        let d = self.hidden_size;
        let d_inner = self
            .mamba_num_heads
            .checked_mul(self.mamba_head_dim)
            .ok_or_else(|| {
                Mamba2Error::config("mamba_num_heads", "times mamba_head_dim overflows")
            })?;
        let mixer = Mamba2Config::new(d)
            .with_inner_size(Some(d_inner))
            .with_d_state(self.ssm_state_size)
            .with_d_conv(self.conv_kernel)
            .with_headdim(self.mamba_head_dim)
            .with_ngroups(self.n_groups)
            .with_chunk_size(self.chunk_size)
            .with_dt_limit(self.time_step_limit)
            .with_bias(self.use_bias)
            .with_conv_bias(self.use_conv_bias)
            .with_norm_eps(self.layer_norm_epsilon);
        let n_heads = self.num_attention_heads;
        // no positions, no biases, the score scaled by 1/√head_dim
        let attention = AttentionConfig::new(
            d,
            n_heads,
            self.num_key_value_heads.unwrap_or(n_heads),
            self.head_dim,
        );
        let mlp = MlpConfig::new(d, self.intermediate_size)
            .with_gated(false)
            .with_activation(activation)
            .with_bias(self.mlp_bias);
        // the `moe` layers' experts (relu², no gate, no biases) and their shared expert
        let moe = layers.contains(&LayerKind::Moe).then(|| {
            let shared = MlpConfig::new(d, self.moe_shared_expert_intermediate_size)
                .with_gated(false)
                .with_activation(activation)
                .with_bias(self.mlp_bias);
            MoeConfig::new(
                d,
                self.moe_intermediate_size,
                self.n_routed_experts,
                self.num_experts_per_tok,
            )
            .with_gated(false)
            .with_activation(activation)
            .with_router(RouterKind::Sigmoid)
            .with_n_group(self.n_group)
            .with_topk_group(self.topk_group)
            .with_normalize(self.norm_topk_prob)
            .with_routed_scaling(self.routed_scaling_factor)
            .with_shared(Some(shared))
        });
        let config = HybridConfig::new(
            HybridFamily::NemotronH,
            self.vocab_size,
            layers,
            mixer,
            attention,
            mlp,
        )
        .with_mlp_after_mixer(false)
        .with_moe(moe)
        .with_norm_eps(self.layer_norm_epsilon)
        .with_initializer_range(self.initializer_range);
        config.validate()?;
        Ok(config)
    }
}

/// Nemotron-H's tensor names: every operation of a layer is its `mixer`.
pub(super) const LAYOUT: Layout = Layout {
    prefix: "backbone",
    embedding: "embeddings",
    final_norm: "norm_f",
    input_norm: "norm",
    ffn_norm: "norm",
    mamba: "mixer",
    attention: "mixer",
    mlp: |prefix, tail| proj_mlp("mixer", prefix, tail),
    moe: mixer_experts,
};

/// The `moe` layer's names under its `mixer`: the router is `gate` (with its
/// `e_score_correction_bias`), each expert its own `experts.{e}.up_proj` and `down_proj`
/// (stacked here), the shared expert `shared_experts`.
fn mixer_experts(prefix: &str, tail: &str, n_experts: usize) -> TensorName {
    let name = |t: &str| format!("{prefix}.mixer.{t}");
    let experts = |linear: &str| {
        let names = (0..n_experts)
            .map(|e| name(&format!("experts.{e}.{linear}_proj.weight")))
            .collect();
        TensorName::stacked(names)
    };
    match tail {
        "router.weight" => TensorName::whole(name("gate.weight"), true),
        "correction_bias" => TensorName::whole(name("gate.e_score_correction_bias"), false),
        "up" => experts("up"),
        "down" => experts("down"),
        other => match other.strip_prefix("shared.") {
            Some(t) => proj_mlp("mixer.shared_experts", prefix, t),
            None => TensorName::whole(name(other), false),
        },
    }
}
