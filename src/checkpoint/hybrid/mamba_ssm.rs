//! `mamba_ssm`'s `MambaLMHeadModel` with Mamba-3 layers (`ssm_cfg.layer = "Mamba3"`): its
//! `config.json` (`MambaConfig`, no `model_type`) read into a [`HybridConfig`], and its tensor
//! names (`backbone.layers.{i}.mixer.*`, `backbone.embedding`, `backbone.norm_f`, `lm_head`).
//! Each layer is `h + mixer(norm(h))`, then, with `d_intermediate > 0`, `h + mlp(norm2(h))` with
//! `mamba_ssm`'s `GatedMLP` (`fc1` holding the up and gate projections, in that order, `fc2`).
//! Mamba-2 folders of this layout are [`Mamba2Lm`](crate::Mamba2Lm)'s
//! ([`load_lm`](crate::load_lm)).

use std::path::Path;

use serde::Deserialize;

use super::{no_experts, Layout, TensorName};
use crate::checkpoint::mamba3::mamba3_config_from_json;
use crate::error::{Mamba2Error, Result};
use crate::layers::attention::AttentionConfig;
use crate::layers::mixer::Mamba2Config;
use crate::layers::mlp::MlpConfig;
use crate::models::hybrid::{HybridConfig, HybridFamily, LayerKind};

/// `mamba_ssm`'s `MambaConfig` fields, with its defaults.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MambaSsmConfig {
    d_model: usize,
    #[serde(default)]
    d_intermediate: usize,
    n_layer: usize,
    vocab_size: usize,
    #[serde(default)]
    ssm_cfg: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    attn_layer_idx: Vec<usize>,
    #[serde(default)]
    attn_cfg: serde_json::Map<String, serde_json::Value>,
    #[serde(default = "enabled")]
    rms_norm: bool,
    // where the residual is added and kept: the same numbers in f32
    #[serde(default = "enabled")]
    #[allow(dead_code)]
    residual_in_fp32: bool,
    #[serde(default = "enabled")]
    #[allow(dead_code)]
    fused_add_norm: bool,
    #[serde(default = "pad_vocab_size_multiple")]
    pad_vocab_size_multiple: usize,
    #[serde(default = "enabled")]
    tie_embeddings: bool,
    // the norms' epsilon (`MixerModel`'s default; `MambaLMHeadModel` passes none)
    #[serde(default = "norm_epsilon")]
    norm_epsilon: f64,
}

fn enabled() -> bool {
    true
}

fn pad_vocab_size_multiple() -> usize {
    8
}

fn norm_epsilon() -> f64 {
    1e-5
}

/// `GatedMLP`'s hidden width: `d_intermediate` rounded up to a multiple of 128.
const MLP_MULTIPLE: usize = 128;

/// Whether `value` (a `config.json`'s fields) is a `mamba_ssm` model of Mamba-3 layers.
pub(super) fn is_mamba3_lm(value: &serde_json::Value) -> bool {
    value.get("model_type").is_none()
        && value
            .get("ssm_cfg")
            .and_then(|c| c.get("layer"))
            .and_then(|l| l.as_str())
            == Some("Mamba3")
}

impl MambaSsmConfig {
    pub(super) fn into_config(self, file: &Path) -> Result<HybridConfig> {
        let unsupported = |reason: String| Mamba2Error::Unsupported {
            file: file.to_path_buf(),
            reason,
        };
        let mut ssm_cfg = self.ssm_cfg;
        let layer = ssm_cfg.remove("layer");
        if layer.as_ref().and_then(|l| l.as_str()) != Some("Mamba3") {
            return Err(unsupported(format!(
                "ssm_cfg.layer = {layer:?} (this reader takes \"Mamba3\"; Mamba-2 models load \
                 with load_lm)"
            )));
        }
        if !self.attn_layer_idx.is_empty() || !self.attn_cfg.is_empty() {
            return Err(unsupported(format!(
                "attention layers (attn_layer_idx {:?}) beside Mamba-3 layers",
                self.attn_layer_idx
            )));
        }
        if !self.rms_norm {
            return Err(unsupported("rms_norm = false (LayerNorm blocks)".into()));
        }
        if self.pad_vocab_size_multiple == 0 {
            return Err(Mamba2Error::config(
                "pad_vocab_size_multiple",
                "must be at least 1",
            ));
        }
        // `Mamba3(d_model, **ssm_cfg)`: the layer's own reader, with its defaults and checks
        ssm_cfg.insert("d_model".into(), self.d_model.into());
        let ssm_cfg = serde_json::Value::Object(ssm_cfg).to_string();
        let mamba3 = mamba3_config_from_json(&ssm_cfg, file)?;
        let d = self.d_model;
        // `MambaLMHeadModel` pads the vocabulary before it builds the embedding
        let vocab = self
            .vocab_size
            .checked_next_multiple_of(self.pad_vocab_size_multiple)
            .ok_or_else(|| Mamba2Error::config("vocab_size", "overflows when padded"))?;
        let mlp = self.d_intermediate > 0;
        let hidden = self
            .d_intermediate
            .checked_next_multiple_of(MLP_MULTIPLE)
            .ok_or_else(|| Mamba2Error::config("d_intermediate", "overflows when rounded"))?;
        let config = HybridConfig::new(
            HybridFamily::MambaSsm,
            vocab,
            vec![LayerKind::Mamba3; self.n_layer],
            // no Mamba-2 layer nor attention: their configs only carry the width
            Mamba2Config::new(d),
            AttentionConfig::new(d, 1, 1, d),
            MlpConfig::new(d, hidden.max(1)),
        )
        .with_mamba3(Some(mamba3))
        .with_mlp_after_mixer(mlp)
        .with_norm_eps(self.norm_epsilon)
        .with_tie_embeddings(self.tie_embeddings);
        config.validate()?;
        Ok(config)
    }
}

/// `mamba_ssm`'s tensor names.
pub(super) const LAYOUT: Layout = Layout {
    prefix: "backbone",
    embedding: "embedding",
    final_norm: "norm_f",
    input_norm: "norm",
    ffn_norm: "norm2",
    mamba: "mixer",
    attention: "mixer",
    mlp: gated_mlp,
    moe: no_experts,
};

/// `GatedMLP`'s names: `fc1` holds the up and the gate projections (its output's two halves,
/// `y, gate = fc1(x).chunk(2)`), `fc2` the down projection.
fn gated_mlp(prefix: &str, tail: &str) -> TensorName {
    let name = |t: &str| format!("{prefix}.mlp.{t}");
    match tail {
        "up.weight" => TensorName::part(name("fc1.weight"), 0, 2, true),
        "gate.weight" => TensorName::part(name("fc1.weight"), 1, 2, true),
        "down.weight" => TensorName::whole(name("fc2.weight"), true),
        other => TensorName::whole(name(other), false),
    }
}
