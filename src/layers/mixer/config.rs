//! The mixer's configuration, with the reference's fields and defaults, and its initialisation.

use burn::config::Config;
use burn::nn::conv::Conv1dConfig;
use burn::nn::PaddingConfig1d;
use burn::tensor::{backend::Backend, Distribution, Tensor};

use super::dt_limit::DtLimit;
use super::layer::Mamba2;
use crate::error::Mamba2Error;
use crate::init::ParamInit;
use crate::layers::norm::RmsNormGatedConfig;
use crate::ssd::FusedKernels;

/// Configuration of a [`Mamba2`] mixer, with the fields and defaults of the state-spaces
/// reference (`mamba_ssm.modules.mamba2.Mamba2`).
///
/// Derived sizes: `d_inner = expand · d_model` (or `inner_size`), `nheads = d_inner / headdim`,
/// `conv_dim = d_inner + 2 · ngroups · d_state`,
/// `d_in_proj = 2 · d_inner + 2 · ngroups · d_state + nheads`.
#[derive(Config, Debug)]
pub struct Mamba2Config {
    /// Width of the residual stream (`D_m`).
    pub d_model: usize,
    /// State size per head (`N`). Default: 128.
    #[config(default = 128)]
    pub d_state: usize,
    /// Width of the causal depthwise convolution (`K`). Default: 4.
    #[config(default = 4)]
    pub d_conv: usize,
    /// Expansion factor from `d_model` to `d_inner`. Default: 2.
    #[config(default = 2)]
    pub expand: usize,
    /// Head dimension (`P`). Default: 64.
    #[config(default = 64)]
    pub headdim: usize,
    /// Number of B/C groups (`G`); heads `[g·H/G, (g+1)·H/G)` share group `g`. Default: 1.
    #[config(default = 1)]
    pub ngroups: usize,
    /// Chunk length of the chunked SSD (`Q`). Default: 256.
    #[config(default = 256)]
    pub chunk_size: usize,
    /// Smallest `dt` drawn at initialisation. Default: 0.001.
    #[config(default = 0.001)]
    pub dt_min: f64,
    /// Largest `dt` drawn at initialisation. Default: 0.1.
    #[config(default = 0.1)]
    pub dt_max: f64,
    /// Floor on the initial `dt`. Default: 1e-4.
    #[config(default = 1e-4)]
    pub dt_init_floor: f64,
    /// Clamp on `dt` after the softplus, in every path. Default: `(0, ∞)` (none).
    #[config(default = "DtLimit::NONE")]
    pub dt_limit: DtLimit,
    /// Range of the uniform draw of `-A` at initialisation (`A_log = ln U(lo, hi)`).
    /// Default: `(1, 16)`.
    #[config(default = "(1.0, 16.0)")]
    pub a_init_range: (f64, f64),
    /// Bias on in_proj and out_proj. Default: false.
    #[config(default = false)]
    pub bias: bool,
    /// Bias on out_proj where it differs from in_proj's (Falcon-H1's `projectors_bias`).
    /// Default: `None` (as `bias`).
    pub out_proj_bias: Option<bool>,
    /// Fixed factors of in_proj's output pieces `[z, x, B, C, dt]`, applied before the
    /// convolution and the softplus (Falcon-H1's μP `ssm_multipliers`; they are not parameters).
    /// Default: `None` (all 1).
    pub in_proj_multipliers: Option<[f64; 5]>,
    /// Bias on the convolution. Default: true.
    #[config(default = true)]
    pub conv_bias: bool,
    /// Gated RMSNorm before out_proj (otherwise `y · silu(z)`). Default: true.
    #[config(default = true)]
    pub rmsnorm: bool,
    /// Epsilon of the gated RMSNorm. Default: 1e-5.
    #[config(default = 1e-5)]
    pub norm_eps: f64,
    /// Normalise before applying the gate. Default: false (the published models).
    #[config(default = false)]
    pub norm_before_gate: bool,
    /// `D` per channel (`[d_inner]`) instead of per head (`[nheads]`). Default: false.
    #[config(default = false)]
    pub d_has_hdim: bool,
    /// Width of the inner stream (`d_inner`) where it is not `expand · d_model`, as in the
    /// hybrids that size it by heads (Nemotron-H's `mamba_num_heads · mamba_head_dim`, Falcon-H1's
    /// `mamba_d_ssm`). Default: `None` (`expand · d_model`).
    pub inner_size: Option<usize>,
    /// Where the chunked SSD and the projections run the backend's fused kernels; `None` (the
    /// default, and what a config written without the field reads as) is
    /// [`FusedKernels::Measured`]. Not a property of the weights: a loaded model takes it from
    /// [`Mamba2::set_fused_kernels`](crate::Mamba2::set_fused_kernels).
    pub fused_kernels: Option<FusedKernels>,
}

impl Mamba2Config {
    /// `inner_size`, or else `expand · d_model`.
    pub fn d_inner(&self) -> usize {
        self.inner_size.unwrap_or(self.expand * self.d_model)
    }

    /// The number of parameters of the layer, in `f64` (which cannot overflow for sizes read
    /// from a corrupt file: the loaders compare it with the files' size before building).
    pub(crate) fn param_count(&self) -> f64 {
        let f = |v: usize| v as f64;
        let bias = |n: f64, on: bool| if on { n } else { 0.0 };
        let d_model = f(self.d_model);
        let d_inner = self.inner_size.map_or(f(self.expand) * d_model, f);
        let heads = (d_inner / f(self.headdim.max(1))).floor();
        let bc = 2.0 * f(self.ngroups) * f(self.d_state);
        let in_out = 2.0 * d_inner + bc + heads;
        let in_proj = d_model * in_out + bias(in_out, self.bias);
        let conv = (d_inner + bc) * f(self.d_conv) + bias(d_inner + bc, self.conv_bias);
        // dt_bias, A_log, D (per channel with `d_has_hdim`)
        let ssm = 2.0 * heads + if self.d_has_hdim { d_inner } else { heads };
        let gate_norm = bias(d_inner, self.rmsnorm);
        let out_proj = d_inner * d_model + bias(d_model, self.has_out_proj_bias());
        in_proj + conv + ssm + gate_norm + out_proj
    }

    /// `d_inner / headdim`.
    pub fn nheads(&self) -> usize {
        self.d_inner() / self.headdim.max(1)
    }

    /// Channels of the convolution: `d_inner + 2 · ngroups · d_state` (x, B, C).
    pub fn conv_dim(&self) -> usize {
        self.d_inner() + 2 * self.ngroups * self.d_state
    }

    /// Output width of in_proj: `[z | x | B | C | dt]`.
    pub fn d_in_proj(&self) -> usize {
        2 * self.d_inner() + 2 * self.ngroups * self.d_state + self.nheads()
    }

    /// Whether out_proj has a bias.
    pub fn has_out_proj_bias(&self) -> bool {
        self.out_proj_bias.unwrap_or(self.bias)
    }

    /// Checks that a model can be built from this config.
    pub fn validate(&self) -> crate::error::Result<()> {
        let invalid = |field: &'static str, reason: String| Err(Mamba2Error::config(field, reason));
        for (field, v) in [
            ("d_model", self.d_model),
            ("d_state", self.d_state),
            ("d_conv", self.d_conv),
            ("expand", self.expand),
            ("headdim", self.headdim),
            ("ngroups", self.ngroups),
            ("chunk_size", self.chunk_size),
            ("inner_size", self.inner_size.unwrap_or(1)),
        ] {
            if v == 0 {
                return invalid(field, "must be at least 1".into());
            }
        }
        // the derived sizes (and in_proj's weight) must be representable
        let d_inner = match self.inner_size {
            Some(width) => Some(width),
            None => self.expand.checked_mul(self.d_model),
        };
        let in_proj_weights = d_inner.and_then(|d_inner| {
            let bc = self.ngroups.checked_mul(self.d_state)?.checked_mul(2)?;
            let d_in_proj = d_inner.checked_mul(2)?.checked_add(bc)?;
            d_in_proj
                .checked_add(d_inner / self.headdim)?
                .checked_mul(self.d_model)
        });
        if in_proj_weights.is_none() {
            return invalid(
                "d_model",
                format!(
                    "d_model = {}, expand = {}, ngroups = {}, d_state = {}: the layer's sizes \
                     overflow",
                    self.d_model, self.expand, self.ngroups, self.d_state
                ),
            );
        }
        if !self.d_inner().is_multiple_of(self.headdim) {
            return invalid(
                "headdim",
                format!(
                    "must divide d_inner = {}, got {}",
                    self.d_inner(),
                    self.headdim
                ),
            );
        }
        if !self.nheads().is_multiple_of(self.ngroups) {
            return invalid(
                "ngroups",
                format!(
                    "must divide nheads = {}, got {}",
                    self.nheads(),
                    self.ngroups
                ),
            );
        }
        if !(self.dt_min > 0.0 && self.dt_max >= self.dt_min && self.dt_max.is_finite()) {
            return invalid(
                "dt_min",
                format!(
                    "need 0 < dt_min <= dt_max < inf, got ({}, {})",
                    self.dt_min, self.dt_max
                ),
            );
        }
        if self.dt_init_floor.is_nan() || self.dt_init_floor < 0.0 {
            return invalid(
                "dt_init_floor",
                format!("must be >= 0, got {}", self.dt_init_floor),
            );
        }
        let DtLimit { min, max } = self.dt_limit;
        if !(min >= 0.0 && max > min) || max.is_nan() {
            return invalid(
                "dt_limit",
                format!("need 0 <= min < max, got ({min}, {max})"),
            );
        }
        let (lo, hi) = self.a_init_range;
        if !(lo > 0.0 && hi >= lo && hi.is_finite()) {
            return invalid(
                "a_init_range",
                format!("need 0 < lo <= hi < inf, got ({lo}, {hi})"),
            );
        }
        if !(self.norm_eps > 0.0) {
            return invalid("norm_eps", format!("must be > 0, got {}", self.norm_eps));
        }
        if let Some(m) = self.in_proj_multipliers {
            if m.iter().any(|v| !v.is_finite()) {
                return invalid("in_proj_multipliers", format!("must be finite, got {m:?}"));
            }
        }
        Ok(())
    }

    /// Builds the mixer, initialised as state-spaces does for a standalone layer:
    /// in_proj and out_proj weights `U(±1/√fan_in)` with zero biases, conv weight and bias
    /// `U(±1/√d_conv)`, `dt_bias = softplus⁻¹(dt)` with `dt` log-uniform in
    /// `[dt_min, dt_max]` (floored at `dt_init_floor`), `A_log = ln U(a_init_range)`, `D = 1`,
    /// norm weight 1. (The backbone additionally scales out_proj by `1/√n_layer`.)
    ///
    /// Seed the backend (`B::seed`) for reproducible weights.
    ///
    /// With a GPU feature, the first model built or loaded in a process also gives CubeCL the
    /// crate's settings (persistent kernel and autotune caches), unless it is configured
    /// already (`cubecl_setup`).
    pub fn init<B: Backend>(&self, device: &B::Device) -> crate::error::Result<Mamba2<B>> {
        self.build(&ParamInit::now(device), 1.0)
    }

    /// [`init`](Self::init) with parameters made by `init`, out_proj's weight multiplied by
    /// `out_proj_scale`.
    pub(crate) fn build<B: Backend>(
        &self,
        init: &ParamInit<B>,
        out_proj_scale: f64,
    ) -> crate::error::Result<Mamba2<B>> {
        self.validate()?;
        let (d_inner, h) = (self.d_inner(), self.nheads());
        let device = init.device();

        // drawn in this order (conv, dt, A, in_proj, out_proj), which seeded runs rely on
        let (conv_dim, d_conv) = (self.conv_dim(), self.d_conv);
        let conv_bound = 1.0 / (d_conv as f64).sqrt();
        let conv_uniform = Distribution::Uniform(-conv_bound, conv_bound);
        let mut conv1d = Conv1dConfig::new(conv_dim, conv_dim, d_conv)
            .with_groups(conv_dim)
            .with_padding(PaddingConfig1d::Explicit(d_conv - 1, 0))
            .with_bias(self.conv_bias)
            .init::<B>(device);
        conv1d.weight = init.param([conv_dim, 1, d_conv], move |device| {
            Tensor::<B, 1>::random([conv_dim * d_conv], conv_uniform, device)
                .reshape([conv_dim, 1, d_conv])
        });
        conv1d.bias = self
            .conv_bias
            .then(|| init.random([conv_dim], conv_uniform, 1.0));

        let dt_bias = init.dt_bias(h, self.dt_min, self.dt_max, self.dt_init_floor);
        let (lo, hi) = self.a_init_range;
        let a_log = init.param([h], move |device| {
            Tensor::<B, 1>::random([h], Distribution::Uniform(lo, hi), device).log()
        });
        let d_len = if self.d_has_hdim { d_inner } else { h };

        Ok(Mamba2 {
            in_proj: init.linear(self.d_model, self.d_in_proj(), self.bias, 1.0),
            conv1d,
            dt_bias,
            a_log,
            d: init.full([d_len], 1.0),
            norm: self.rmsnorm.then(|| {
                RmsNormGatedConfig::new(d_inner, d_inner / self.ngroups)
                    .with_eps(self.norm_eps)
                    .with_norm_before_gate(self.norm_before_gate)
                    .build(init)
            }),
            out_proj: init.linear(
                d_inner,
                self.d_model,
                self.has_out_proj_bias(),
                out_proj_scale,
            ),
            in_proj_lora: None,
            out_proj_lora: None,
            d_model: self.d_model,
            d_inner,
            d_state: self.d_state,
            d_conv: self.d_conv,
            headdim: self.headdim,
            nheads: h,
            ngroups: self.ngroups,
            chunk_size: self.chunk_size,
            dt_limit: (self.dt_limit.min, self.dt_limit.max),
            fused_kernels: self.fused_kernels.unwrap_or_default(),
            in_proj_multipliers: self
                .in_proj_multipliers
                .filter(|m| m.iter().any(|&v| v != 1.0)),
        })
    }
}
