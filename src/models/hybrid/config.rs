//! The configuration of a hybrid language model, common to the families: the layer pattern,
//! the layers' own configs and the model's multipliers.

use burn::config::Config;
use burn::nn::Embedding;
use burn::tensor::{backend::Backend, Distribution};

use super::layer::{HybridLayer, LayerKind};
use super::lm::HybridLm;
use crate::error::Mamba2Error;
use crate::init::ParamInit;
use crate::layers::attention::AttentionConfig;
use crate::layers::mamba3::Mamba3Config;
use crate::layers::mixer::Mamba2Config;
use crate::layers::mlp::MlpConfig;
use crate::layers::moe::MoeConfig;
use crate::layers::norm::RmsNormConfig;

/// The model family a hybrid config was read from: it names the tensors of its checkpoints.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum HybridFamily {
    /// IBM's Granite 4.0-H (transformers' `granitemoehybrid`).
    Granite,
    /// IBM's Bamba (`bamba`).
    Bamba,
    /// `mamba_ssm`'s `MambaLMHeadModel` with Mamba-3 layers (its `config.json`, no
    /// `model_type`).
    MambaSsm,
    /// NVIDIA's Nemotron-H (`nemotron_h`).
    NemotronH,
    /// TII's Falcon-H1 (`falcon_h1`).
    FalconH1,
}

impl HybridFamily {
    /// transformers' `model_type` (`mamba_ssm` for [`MambaSsm`](Self::MambaSsm), whose files
    /// name none).
    pub fn model_type(&self) -> &'static str {
        match self {
            Self::Granite => "granitemoehybrid",
            Self::Bamba => "bamba",
            // mamba_ssm's files have no model_type: its readers tell them by `ssm_cfg`
            Self::MambaSsm => "mamba_ssm",
            Self::NemotronH => "nemotron_h",
            Self::FalconH1 => "falcon_h1",
        }
    }
}

/// Configuration of a [`HybridLm`]: pre-norm residual layers, each a token mixer (a Mamba-2
/// layer or attention) followed by an MLP, or (with `mlp_after_mixer` off, as in Nemotron-H)
/// each one operation: a mixer or an MLP.
///
/// `h₀ = embedding_multiplier · E[ids]`; each layer
/// `h ← h + residual_multiplier · mixer(norm(h))`, then
/// `h ← h + residual_multiplier · mlp(ffn_norm(h))`; `logits = head(norm(h)) / logits_scaling`.
#[derive(Config, Debug)]
pub struct HybridConfig {
    /// The family the config describes (for its checkpoint names).
    pub family: HybridFamily,
    /// Vocabulary size (the width of the logits).
    pub vocab_size: usize,
    /// What each layer computes first, in order.
    pub layers: Vec<LayerKind>,
    /// The Mamba-2 layers' config (its `d_model` is the model's width).
    pub mixer: Mamba2Config,
    /// The Mamba-3 layers' config (of the same `d_model`). Default: none.
    pub mamba3: Option<Mamba3Config>,
    /// The attention layers' config.
    pub attention: AttentionConfig,
    /// The MLP after each mixer, and of each MLP layer.
    pub mlp: MlpConfig,
    /// The mixture of experts: beside the MLP after each mixer where `mlp_after_mixer` is set
    /// (Granite), and of each MoE layer. Default: none.
    pub moe: Option<MoeConfig>,
    /// Whether each Mamba and attention layer ends with the MLP on a norm of its own (Granite,
    /// Bamba); without, the MLPs are layers of their own (Nemotron-H). Default: true.
    #[config(default = true)]
    pub mlp_after_mixer: bool,
    /// Epsilon of every RMSNorm. Default: 1e-5.
    #[config(default = 1e-5)]
    pub norm_eps: f64,
    /// Factor of the embeddings. Default: 1.
    #[config(default = 1.0)]
    pub embedding_multiplier: f64,
    /// Factor of each layer's branches before they join the residual stream. Default: 1.
    #[config(default = 1.0)]
    pub residual_multiplier: f64,
    /// Divisor of the logits. Default: 1.
    #[config(default = 1.0)]
    pub logits_scaling: f64,
    /// Factor of the logits (Falcon-H1's `lm_head_multiplier`). Default: 1.
    #[config(default = 1.0)]
    pub logits_multiplier: f64,
    /// The Mamba layers' input and output factors (Falcon-H1's `ssm_in_multiplier`,
    /// `ssm_out_multiplier`). Default: `(1, 1)`.
    #[config(default = "(1.0, 1.0)")]
    pub mamba_multipliers: (f64, f64),
    /// The attention layers' input and output factors (Falcon-H1's `attention_in_multiplier`,
    /// `attention_out_multiplier`). Default: `(1, 1)`.
    #[config(default = "(1.0, 1.0)")]
    pub attention_multipliers: (f64, f64),
    /// Share the embedding matrix with the LM head. Default: false.
    #[config(default = false)]
    pub tie_embeddings: bool,
    /// Standard deviation of the embedding's normal init. Default: 0.02.
    #[config(default = 0.02)]
    pub initializer_range: f64,
}

impl HybridConfig {
    /// Width of the residual stream.
    pub fn d_model(&self) -> usize {
        self.mixer.d_model
    }

    /// Checks the config and its layers'.
    pub fn validate(&self) -> crate::error::Result<()> {
        if self.vocab_size == 0 {
            return Err(Mamba2Error::config("vocab_size", "must be at least 1"));
        }
        if self.layers.is_empty() {
            return Err(Mamba2Error::config("layer_types", "no layer"));
        }
        let d = self.d_model();
        for (field, width) in [
            ("attention.d_model", self.attention.d_model),
            ("mlp.d_model", self.mlp.d_model),
        ] {
            if width != d {
                return Err(Mamba2Error::config(
                    field,
                    format!("{width} differs from the model's width {d}"),
                ));
            }
        }
        for (field, v) in [
            ("norm_eps", self.norm_eps),
            ("embedding_multiplier", self.embedding_multiplier),
            ("residual_multiplier", self.residual_multiplier),
            ("logits_scaling", self.logits_scaling),
            ("logits_multiplier", self.logits_multiplier),
            ("ssm_in_multiplier", self.mamba_multipliers.0),
            ("ssm_out_multiplier", self.mamba_multipliers.1),
            ("attention_in_multiplier", self.attention_multipliers.0),
            ("attention_out_multiplier", self.attention_multipliers.1),
        ] {
            // a divisor must be positive; a factor only finite
            let positive = matches!(field, "norm_eps" | "logits_scaling");
            if !v.is_finite() || (positive && v <= 0.0) {
                let what = if positive {
                    "finite and positive"
                } else {
                    "finite"
                };
                return Err(Mamba2Error::config(
                    field,
                    format!("must be {what}, got {v}"),
                ));
            }
        }
        if self.vocab_size.checked_mul(d).is_none() {
            return Err(Mamba2Error::config(
                "vocab_size",
                format!("{} times the width {d} overflows", self.vocab_size),
            ));
        }
        match &self.mamba3 {
            Some(mamba3) => {
                mamba3.validate()?;
                if mamba3.d_model != d {
                    return Err(Mamba2Error::config(
                        "mamba3.d_model",
                        format!("{} differs from the model's width {d}", mamba3.d_model),
                    ));
                }
            }
            None if self.layers.contains(&LayerKind::Mamba3) => {
                return Err(Mamba2Error::config(
                    "mamba3",
                    "the pattern has Mamba-3 layers but the config no Mamba-3 layer config",
                ));
            }
            None => {}
        }
        let has = |kinds: [LayerKind; 2]| kinds.iter().any(|k| self.layers.contains(k));
        if has([LayerKind::Mamba, LayerKind::Parallel]) {
            self.mixer.validate()?;
        }
        if has([LayerKind::Attention, LayerKind::Parallel]) {
            self.attention.validate()?;
        }
        if self.mlp_after_mixer || self.layers.contains(&LayerKind::Mlp) {
            self.mlp.validate()?;
        }
        match &self.moe {
            Some(moe) => {
                moe.validate()?;
                if moe.d_model != d {
                    return Err(Mamba2Error::config(
                        "moe.d_model",
                        format!("{} differs from the model's width {d}", moe.d_model),
                    ));
                }
            }
            None if self.layers.contains(&LayerKind::Moe) => {
                return Err(Mamba2Error::config(
                    "moe",
                    "the pattern has mixture-of-experts layers but the config no experts",
                ));
            }
            None => {}
        }
        Ok(())
    }

    /// The number of parameters [`init`](Self::init) creates, in `f64` (no overflow for sizes
    /// read from a corrupt file: the loader compares it with the files' size first).
    pub fn param_count(&self) -> f64 {
        let f = |v: usize| v as f64;
        let bias = |n: f64, on: bool| if on { n } else { 0.0 };
        let d = f(self.d_model());
        let mamba = self.mixer.param_count();
        let a = &self.attention;
        let attention = {
            let (q, kv) = (f(a.n_heads * a.head_dim), f(a.n_kv_heads * a.head_dim));
            2.0 * d * q + 2.0 * d * kv + bias(q + 2.0 * kv + d, a.bias)
        };
        let mlp = self.mlp.param_count();
        let moe = self.moe.as_ref().map_or(0.0, MoeConfig::param_count);
        let mamba3 = self.mamba3.as_ref().map_or(0.0, Mamba3Config::param_count);
        // the MLP (and the experts) after a mixer, and its norm
        let ffn = if self.mlp_after_mixer {
            mlp + moe + d
        } else {
            0.0
        };
        let layers: f64 = self
            .layers
            .iter()
            .map(|kind| match kind {
                LayerKind::Mamba => mamba + ffn,
                LayerKind::Attention => attention + ffn,
                LayerKind::Parallel => mamba + attention + ffn,
                LayerKind::Mlp => mlp,
                LayerKind::Moe => moe,
                LayerKind::Mamba3 => mamba3 + ffn,
            } + d)
            .sum();
        let embedding = f(self.vocab_size) * d;
        let head = if self.tie_embeddings { 0.0 } else { embedding };
        layers + d + embedding + head
    }

    /// The factor of the Mamba-3 layers' initial out_proj weights: `mamba_ssm`'s
    /// `1/√(residuals · n_layer)` (its `_init_weights`, with one residual branch per layer, two
    /// with an MLP after the mixer), 1 in the other families (transformers' own init).
    fn mamba3_out_proj_scale(&self) -> f64 {
        if self.family != HybridFamily::MambaSsm {
            return 1.0;
        }
        let residuals = if self.mlp_after_mixer { 2.0 } else { 1.0 };
        1.0 / (residuals * self.layers.len() as f64).sqrt()
    }

    /// The number of parameters of the model.
    pub fn num_params(&self) -> usize {
        self.param_count() as usize
    }

    /// Builds the model: embedding `N(0, initializer_range)`, the layers as their configs'
    /// `init`, norms 1, untied head `U(±1/√d_model)`.
    pub fn init<B: Backend>(&self, device: &B::Device) -> crate::error::Result<HybridLm<B>> {
        self.build(&ParamInit::now(device))
    }

    pub(crate) fn build<B: Backend>(
        &self,
        init: &ParamInit<B>,
    ) -> crate::error::Result<HybridLm<B>> {
        self.validate()?;
        let (v, d) = (self.vocab_size, self.d_model());
        let norm = RmsNormConfig::new(d).with_eps(self.norm_eps);
        let mamba3_scale = self.mamba3_out_proj_scale();
        let layers = self
            .layers
            .iter()
            .map(|&kind| {
                let alone = matches!(kind, LayerKind::Mlp | LayerKind::Moe);
                let mlp = kind == LayerKind::Mlp || (!alone && self.mlp_after_mixer);
                let moe = kind == LayerKind::Moe || (!alone && self.mlp_after_mixer);
                Ok(HybridLayer {
                    input_norm: norm.build(init),
                    mamba: matches!(kind, LayerKind::Mamba | LayerKind::Parallel)
                        .then(|| self.mixer.build(init, 1.0))
                        .transpose()?,
                    mamba3: match &self.mamba3 {
                        Some(config) if kind == LayerKind::Mamba3 => {
                            Some(config.build(init, mamba3_scale)?)
                        }
                        _ => None,
                    },
                    attention: matches!(kind, LayerKind::Attention | LayerKind::Parallel)
                        .then(|| self.attention.build(init))
                        .transpose()?,
                    ffn_norm: (!alone && self.mlp_after_mixer).then(|| norm.build(init)),
                    mlp: mlp.then(|| self.mlp.build(init)).transpose()?,
                    moe: match &self.moe {
                        Some(config) if moe => Some(config.build(init)?),
                        _ => None,
                    },
                    residual_multiplier: self.residual_multiplier,
                    mamba_multipliers: self.mamba_multipliers,
                    attention_multipliers: self.attention_multipliers,
                })
            })
            .collect::<crate::error::Result<Vec<_>>>()?;
        Ok(HybridLm {
            embedding: Embedding {
                weight: init.random(
                    [v, d],
                    Distribution::Normal(0.0, self.initializer_range),
                    1.0,
                ),
            },
            layers,
            norm: norm.build(init),
            lm_head: (!self.tie_embeddings).then(|| init.linear(d, v, false, 1.0)),
            vocab_size: v,
            d_model: d,
            embedding_multiplier: self.embedding_multiplier,
            logits_scaling: self.logits_scaling,
            logits_multiplier: self.logits_multiplier,
        })
    }
}
