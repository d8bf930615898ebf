//! The Mamba-2 mixer: in_proj, causal depthwise conv, SSD, gated RMSNorm, out_proj.

use burn::config::Config;
use burn::module::{Content, DisplaySettings, Module, ModuleDisplay, Param};
use burn::nn::conv::{Conv1d, Conv1dConfig};

use crate::documents::Documents;
use burn::nn::{Linear, PaddingConfig1d};
use burn::tensor::{backend::Backend, Distribution, Tensor, TensorData};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::activation::{silu, softplus, softplus_clamped};
use crate::error::{check_shape, Mamba2Error};
use crate::norm::{RmsNormGated, RmsNormGatedConfig};
use crate::ssd::{self, upcast};
use crate::state::Mamba2State;
use crate::SsdBackend;

/// Bounds that `dt` is clamped to after the softplus, in every path (chunked and step).
///
/// The default `(0, ∞)` clamps nothing. In JSON an infinite bound is written `null`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DtLimit {
    /// Lower bound (≥ 0).
    pub min: f64,
    /// Upper bound (may be `f64::INFINITY`).
    pub max: f64,
}

impl DtLimit {
    /// No clamping: `(0, ∞)`.
    pub const NONE: DtLimit = DtLimit {
        min: 0.0,
        max: f64::INFINITY,
    };

    /// Whether the clamp can change a softplus output (which is always > 0).
    pub fn is_active(&self) -> bool {
        self.min > 0.0 || self.max.is_finite()
    }

    /// One `dt` clamped to the bounds (the CPU step's; the tensor path folds the clamp into
    /// the softplus, `activation::softplus_clamped`).
    pub(crate) fn clamp_f32(&self, dt: f32) -> f32 {
        if self.is_active() {
            // a validated limit has min < max (and `clamp` keeps a NaN a NaN)
            dt.clamp(self.min as f32, self.max as f32)
        } else {
            dt
        }
    }
}

impl Default for DtLimit {
    fn default() -> Self {
        Self::NONE
    }
}

impl Serialize for DtLimit {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let max = self.max.is_finite().then_some(self.max);
        (self.min, max).serialize(s)
    }
}

impl<'de> Deserialize<'de> for DtLimit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let (min, max) = <(f64, Option<f64>)>::deserialize(d)?;
        Ok(DtLimit {
            min,
            max: max.unwrap_or(f64::INFINITY),
        })
    }
}

/// Configuration of a [`Mamba2`] mixer, with the fields and defaults of the state-spaces
/// reference (`mamba_ssm.modules.mamba2.Mamba2`).
///
/// Derived sizes: `d_inner = expand · d_model`, `nheads = d_inner / headdim`,
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
}

impl Mamba2Config {
    /// `expand · d_model`.
    pub fn d_inner(&self) -> usize {
        self.expand * self.d_model
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

    /// Checks that a model can be built from this config.
    pub fn validate(&self) -> crate::Result<()> {
        let invalid =
            |field: &'static str, reason: String| Err(Mamba2Error::InvalidConfig { field, reason });
        for (field, v) in [
            ("d_model", self.d_model),
            ("d_state", self.d_state),
            ("d_conv", self.d_conv),
            ("expand", self.expand),
            ("headdim", self.headdim),
            ("ngroups", self.ngroups),
            ("chunk_size", self.chunk_size),
        ] {
            if v == 0 {
                return invalid(field, "must be at least 1".into());
            }
        }
        // the derived sizes (and in_proj's weight) must be representable
        let in_proj_weights = self.expand.checked_mul(self.d_model).and_then(|d_inner| {
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
        if self.d_inner() % self.headdim != 0 {
            return invalid(
                "headdim",
                format!(
                    "must divide d_inner = expand · d_model = {}, got {}",
                    self.d_inner(),
                    self.headdim
                ),
            );
        }
        if self.nheads() % self.ngroups != 0 {
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
        Ok(())
    }

    /// Builds the mixer, initialised as state-spaces does for a standalone layer:
    /// in_proj and out_proj weights `U(±1/√fan_in)` with zero biases, conv weight and bias
    /// `U(±1/√d_conv)`, `dt_bias = softplus⁻¹(dt)` with `dt` log-uniform in
    /// `[dt_min, dt_max]` (floored at `dt_init_floor`), `A_log = ln U(a_init_range)`, `D = 1`,
    /// norm weight 1. (The backbone additionally scales out_proj by `1/√n_layer`.)
    ///
    /// Seed the backend (`B::seed`) for reproducible weights.
    pub fn init<B: Backend>(&self, device: &B::Device) -> crate::Result<Mamba2<B>> {
        self.validate()?;
        let (d_inner, h) = (self.d_inner(), self.nheads());
        let uniform = |shape: Vec<usize>, bound: f64| {
            Tensor::<B, 1>::random(
                [shape.iter().product::<usize>()],
                Distribution::Uniform(-bound, bound),
                device,
            )
        };
        let linear = |d_in: usize, d_out: usize| crate::linear(d_in, d_out, self.bias, device);

        let conv_dim = self.conv_dim();
        let conv_bound = 1.0 / (self.d_conv as f64).sqrt();
        let mut conv1d = Conv1dConfig::new(conv_dim, conv_dim, self.d_conv)
            .with_groups(conv_dim)
            .with_padding(PaddingConfig1d::Explicit(self.d_conv - 1, 0))
            .with_bias(self.conv_bias)
            .init::<B>(device);
        conv1d.weight = crate::param(uniform(vec![conv_dim, self.d_conv], conv_bound).reshape([
            conv_dim,
            1,
            self.d_conv,
        ]));
        conv1d.bias = self
            .conv_bias
            .then(|| crate::param(uniform(vec![conv_dim], conv_bound)));

        // dt_bias = inverse softplus of a log-uniform dt, computed in f64 on the host
        let u: Vec<f64> = Tensor::<B, 1>::random([h], Distribution::Uniform(0.0, 1.0), device)
            .into_data()
            .convert::<f64>()
            .to_vec()
            .expect("f64 data");
        let (ln_min, ln_max) = (self.dt_min.ln(), self.dt_max.ln());
        let dt_bias: Vec<f64> = u
            .iter()
            .map(|u| {
                let dt = (u * (ln_max - ln_min) + ln_min)
                    .exp()
                    .max(self.dt_init_floor);
                dt + (-(-dt).exp_m1()).ln()
            })
            .collect();
        let (lo, hi) = self.a_init_range;
        let a_log = Tensor::<B, 1>::random([h], Distribution::Uniform(lo, hi), device).log();
        let d_len = if self.d_has_hdim { d_inner } else { h };

        Ok(Mamba2 {
            in_proj: linear(self.d_model, self.d_in_proj()),
            conv1d,
            dt_bias: crate::param(Tensor::from_data(TensorData::new(dt_bias, [h]), device)),
            a_log: crate::param(a_log),
            d: crate::param(Tensor::ones([d_len], device)),
            norm: self.rmsnorm.then(|| {
                RmsNormGatedConfig::new(d_inner, d_inner / self.ngroups)
                    .with_eps(self.norm_eps)
                    .with_norm_before_gate(self.norm_before_gate)
                    .init(device)
            }),
            out_proj: linear(d_inner, self.d_model),
            d_model: self.d_model,
            d_inner,
            d_state: self.d_state,
            d_conv: self.d_conv,
            headdim: self.headdim,
            nheads: h,
            ngroups: self.ngroups,
            chunk_size: self.chunk_size,
            dt_limit: (self.dt_limit.min, self.dt_limit.max),
        })
    }
}

/// The Mamba-2 mixer (one SSD layer with its projections).
///
/// Parameter names follow the checkpoints (`in_proj`, `conv1d`, `dt_bias`, `a_log` for
/// `A_log`, `d` for `D`, `norm`, `out_proj`); `Linear` weights are stored `[in, out]`, as
/// Burn does.
#[derive(Module, Debug)]
#[module(custom_display)]
pub struct Mamba2<B: Backend> {
    /// `d_model → [z | x | B | C | dt]`.
    pub in_proj: Linear<B>,
    /// Depthwise causal convolution over `xBC`; weight `[conv_dim, 1, d_conv]`.
    pub conv1d: Conv1d<B>,
    /// Added to `dt` before the softplus, `[nheads]`.
    pub dt_bias: Param<Tensor<B, 1>>,
    /// `A = -exp(a_log)`, `[nheads]`.
    pub a_log: Param<Tensor<B, 1>>,
    /// Skip connection, `[nheads]` (or `[d_inner]` with `d_has_hdim`).
    pub d: Param<Tensor<B, 1>>,
    /// Group-wise gated RMSNorm (absent when `rmsnorm = false`).
    pub norm: Option<RmsNormGated<B>>,
    /// `d_inner → d_model`.
    pub out_proj: Linear<B>,
    pub(crate) d_model: usize,
    pub(crate) d_inner: usize,
    pub(crate) d_state: usize,
    pub(crate) d_conv: usize,
    pub(crate) headdim: usize,
    pub(crate) nheads: usize,
    pub(crate) ngroups: usize,
    pub(crate) chunk_size: usize,
    pub(crate) dt_limit: (f64, f64),
}

/// The pieces of the in_proj output, before the convolution.
///
/// # Shapes
/// - z, x: `[t, d_inner]`, b, c: `[t, g·n]`, dt: `[t, h]` for `t` tokens
struct Projected<B: Backend> {
    z: Tensor<B, 2>,
    x: Tensor<B, 2>,
    b: Tensor<B, 2>,
    c: Tensor<B, 2>,
    dt: Tensor<B, 2>,
}

impl<B: Backend> Mamba2<B> {
    /// Width of the residual stream.
    pub fn d_model(&self) -> usize {
        self.d_model
    }

    /// Number of heads.
    pub fn nheads(&self) -> usize {
        self.nheads
    }

    /// Channels of the convolution (x, B, C).
    pub fn conv_dim(&self) -> usize {
        self.d_inner + 2 * self.ngroups * self.d_state
    }

    /// The chunk length of the chunked SSD.
    pub fn chunk_size(&self) -> usize {
        self.chunk_size
    }

    /// Sets the chunk length of the chunked SSD (results do not depend on it, speed does).
    pub fn set_chunk_size(&mut self, chunk_size: usize) -> crate::Result<()> {
        if chunk_size == 0 {
            return Err(Mamba2Error::InvalidConfig {
                field: "chunk_size",
                reason: "must be at least 1".into(),
            });
        }
        self.chunk_size = chunk_size;
        Ok(())
    }

    /// The all-zero state of a fresh sequence.
    pub fn zero_state(&self, batch: usize, device: &B::Device) -> Mamba2State<B> {
        Mamba2State {
            conv: Tensor::zeros([batch, self.conv_dim(), self.d_conv], device),
            ssm: Tensor::zeros([batch, self.nheads, self.headdim, self.d_state], device),
        }
    }

    /// Checks `state` against this layer for a batch of `batch`.
    pub fn check_state(&self, state: &Mamba2State<B>, batch: usize) -> crate::Result<()> {
        check_shape(
            "state.conv",
            &state.conv.dims(),
            &[Some(batch), Some(self.conv_dim()), Some(self.d_conv)],
            "b, conv_dim, d_conv",
        )?;
        check_shape(
            "state.ssm",
            &state.ssm.dims(),
            &[
                Some(batch),
                Some(self.nheads),
                Some(self.headdim),
                Some(self.d_state),
            ],
            "b, h, p, n",
        )
    }

    /// One recurrent step: the output for a single new token, in constant time and memory.
    ///
    /// # Shapes
    /// - x: `[b, d_model]`
    /// - state: conv `[b, conv_dim, d_conv]`, ssm `[b, h, p, n]`
    /// - returns `[b, d_model]` and the new state
    pub fn step(
        &self,
        x: Tensor<B, 2>,
        state: Mamba2State<B>,
    ) -> crate::Result<(Tensor<B, 2>, Mamba2State<B>)> {
        check_shape("x", &x.dims(), &[None, Some(self.d_model)], "b, d_model")?;
        let b = x.dims()[0];
        self.check_state(&state, b)?;
        let (h, p, g, n, k) = (
            self.nheads,
            self.headdim,
            self.ngroups,
            self.d_state,
            self.d_conv,
        );

        // one product for the single token (five would cost five launches), then its slices
        let zxbcdt = self.in_proj.forward(x);
        let conv_dim = self.conv_dim();
        let z = zxbcdt.clone().narrow(1, 0, self.d_inner);
        let xbc = zxbcdt.clone().narrow(1, self.d_inner, conv_dim); // raw xBC [b, conv_dim]
        let dt = zxbcdt.narrow(1, self.d_inner + conv_dim, h);
        // shift the window left by one and append the new raw column
        let window = Tensor::cat(
            vec![state.conv.narrow(2, 1, k - 1), xbc.unsqueeze_dim::<3>(2)],
            2,
        ); // [b, conv_dim, k]
        let weight = self.conv1d.weight.val().reshape([1, self.conv_dim(), k]);
        let mut conv = (window.clone() * weight)
            .sum_dim(2)
            .reshape([b, self.conv_dim()]);
        if let Some(bias) = &self.conv1d.bias {
            conv = conv + bias.val().unsqueeze::<2>();
        }
        let xbc = silu(conv);
        let xs = xbc.clone().narrow(1, 0, self.d_inner).reshape([b, h, p]);
        let b_mat = xbc
            .clone()
            .narrow(1, self.d_inner, g * n)
            .reshape([b, g, n]);
        let c_mat = xbc
            .narrow(1, self.d_inner + g * n, g * n)
            .reshape([b, g, n]);
        let dt = self.dt_activation(dt);

        let (y, ssm_state) = ssd::ssd_step(xs.clone(), dt, self.a(), b_mat, c_mat, state.ssm);
        let y = y + xs * self.d_skip().unsqueeze::<3>();
        let y = self.gate_and_project(y.reshape([b, 1, self.d_inner]), z.unsqueeze_dim::<3>(1));
        Ok((
            y.reshape([b, self.d_model]),
            Mamba2State {
                conv: window,
                ssm: ssm_state,
            },
        ))
    }

    /// in_proj, as one product per piece of its output `[z | x | B | C | dt]`, each with its
    /// columns of the weight: the pieces come out contiguous, and their gradients need no
    /// full-width zero-padded buffers, as slices of one product's output would.
    ///
    /// # Shapes
    /// - x: `[t, d_model]` for `t` tokens; returns the pieces (see [`Projected`])
    fn project(&self, x: Tensor<B, 2>) -> Projected<B> {
        let weight = self.in_proj.weight.val(); // [d_model, d_in_proj]
        let bias = self.in_proj.bias.as_ref().map(|b| b.val());
        let piece = |start: usize, len: usize| {
            let w = weight.clone().narrow(1, start, len);
            // a one-column slice is a strided view with a unit last axis, which `linear`'s
            // reshape to [1, d_model, 1] would read wrong on burn-cubecl (see
            // `ssd::reshape_via_flat`): copied first
            let w = if len == 1 {
                ssd::reshape_via_flat(w, [weight.dims()[0], 1])
            } else {
                w
            };
            burn::tensor::module::linear(
                x.clone(),
                w,
                bias.clone().map(|b| b.narrow(0, start, len)),
            )
        };
        let (d_inner, gn) = (self.d_inner, self.ngroups * self.d_state);
        Projected {
            z: piece(0, d_inner),
            x: piece(d_inner, d_inner),
            b: piece(2 * d_inner, gn),
            c: piece(2 * d_inner + gn, gn),
            dt: piece(2 * d_inner + 2 * gn, self.nheads),
        }
    }

    /// Depthwise causal convolution + SiLU over a sequence, continuing the raw window
    /// `previous`: `out[t, c] = silu(bias[c] + Σ_k w[c, k] · xBC[t - (K-1) + k, c])`, on the
    /// three pieces `x`, `B`, `C` of `xBC` (channels `[0, d_inner)`, then `g·n` each).
    ///
    /// # Shapes
    /// - pieces: `[b, l, d_inner]`, `[b, l, g·n]`, `[b, l, g·n]`; previous: `[b, conv_dim, d_conv]`
    /// - returns the pieces convolved (same shapes) and the new window `[b, conv_dim, d_conv]`
    fn conv_sequence(
        &self,
        pieces: [Tensor<B, 3>; 3],
        previous: Tensor<B, 3>,
        taps: Option<&[Tensor<B, 3>]>,
    ) -> ([Tensor<B, 3>; 3], Tensor<B, 3>) {
        let mut start = 0;
        let mut windows = Vec::with_capacity(3);
        let out = pieces.map(|piece| {
            let width = piece.dims()[2];
            let (out, window) =
                self.conv_channels(piece, previous.clone().narrow(1, start, width), start, taps);
            start += width;
            windows.push(window);
            out
        });
        (out, Tensor::cat(windows, 1))
    }

    /// [`Self::conv_sequence`] on the channels `[first, first + c)` of `xBC`.
    ///
    /// # Shapes
    /// - xbc: `[b, l, c]`, previous: `[b, c, d_conv]`, taps: `d_conv` of `[b, l, 1]` (1 where
    ///   tap `j`, token `t - (d_conv-1-j)`, is in `t`'s document)
    /// - returns `[b, l, c]` and the new window `[b, c, d_conv]`
    fn conv_channels(
        &self,
        xbc: Tensor<B, 3>,
        previous: Tensor<B, 3>,
        first: usize,
        taps: Option<&[Tensor<B, 3>]>,
    ) -> (Tensor<B, 3>, Tensor<B, 3>) {
        let [_, l, c] = xbc.dims();
        let k = self.d_conv;
        // the K-1 newest columns of the previous window, then the new ones: [b, K-1+l, c]
        let full = Tensor::cat(vec![previous.narrow(2, 1, k - 1).swap_dims(1, 2), xbc], 1);
        let weight = self.conv1d.weight.val().narrow(0, first, c).reshape([c, k]);
        let tap = |j: usize| {
            let term = full.clone().narrow(1, j, l);
            let term = match taps {
                Some(taps) => {
                    let dtype = term.dtype();
                    term * ssd::cast_to(taps[j].clone(), dtype)
                }
                None => term,
            };
            term * weight.clone().narrow(1, j, 1).reshape([1, 1, c])
        };
        let mut out = tap(0);
        for j in 1..k {
            out = out + tap(j);
        }
        if let Some(bias) = &self.conv1d.bias {
            out = out + bias.val().narrow(0, first, c).reshape([1, 1, c]);
        }
        let mut window = full.narrow(1, l - 1, k);
        if let Some(taps) = taps {
            // the columns of the last token's document only, as if it had run alone
            let last = taps.iter().map(|m| m.clone().narrow(1, l - 1, 1)).collect();
            let dtype = window.dtype();
            window = window * ssd::cast_to(Tensor::cat(last, 1), dtype);
        }
        (silu(out), window.swap_dims(1, 2))
    }

    /// `dt = clamp(softplus(dt + dt_bias), dt_limit)`, in f32 or wider.
    ///
    /// # Shapes
    /// - dt: `[..., h]`; returns the same shape
    fn dt_activation<const D: usize>(&self, dt: Tensor<B, D>) -> Tensor<B, D> {
        let x = upcast(dt) + upcast(self.dt_bias.val()).unsqueeze::<D>();
        let limit = self.dt_limit();
        if limit.is_active() {
            softplus_clamped(x, limit.min, limit.max)
        } else {
            softplus(x)
        }
    }

    /// The bounds of `dt` (stored as a pair: a module field must be a module or a constant).
    pub(crate) fn dt_limit(&self) -> DtLimit {
        let (min, max) = self.dt_limit;
        DtLimit { min, max }
    }

    /// `A = -exp(A_log)`, `[h]`, in f32 or wider.
    fn a(&self) -> Tensor<B, 1> {
        upcast(self.a_log.val()).exp().neg()
    }

    /// `D` shaped to broadcast over `[.., h, p]`: `[h, 1]` or `[h, p]`.
    fn d_skip(&self) -> Tensor<B, 2> {
        let d = self.d.val();
        if d.dims()[0] == self.nheads {
            d.reshape([self.nheads, 1])
        } else {
            d.reshape([self.nheads, self.headdim])
        }
    }

    /// Gated RMSNorm (or the plain gate), then out_proj.
    ///
    /// # Shapes
    /// - y, z: `[b, l, d_inner]`; returns `[b, l, d_model]`
    fn gate_and_project(&self, y: Tensor<B, 3>, z: Tensor<B, 3>) -> Tensor<B, 3> {
        let y = ssd::cast_to(y, z.dtype());
        let y = match &self.norm {
            Some(norm) => norm.forward(y, z),
            None => y * silu(z),
        };
        // one product over all tokens rather than one per batch row
        let [b, l, d] = y.dims();
        self.out_proj
            .forward(y.reshape([b * l, d]))
            .reshape([b, l, self.d_model])
    }
}

impl<B: SsdBackend> Mamba2<B> {
    /// Runs the layer over a sequence, continuing from `state` (a fresh sequence when `None`),
    /// and returns the output and the state after the last token. Any length works, and
    /// splitting a sequence into pieces gives the same result as running it whole.
    ///
    /// # Shapes
    /// - x: `[b, l, d_model]`, `l ≥ 1`
    /// - state: conv `[b, conv_dim, d_conv]`, ssm `[b, h, p, n]`
    /// - returns `[b, l, d_model]` and the new state
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        state: Option<Mamba2State<B>>,
    ) -> crate::Result<(Tensor<B, 3>, Mamba2State<B>)> {
        self.forward_inner(x, state, None)
    }

    /// [`forward`](Self::forward) over packed rows: each row holds the `documents` back to
    /// back, and neither the SSM state nor the convolution reads across a document boundary,
    /// so every document gets the outputs it would get alone. `state` continues each row's
    /// first document; the returned state is that of each row's last document.
    ///
    /// # Shapes
    /// - x: `[b, l, d_model]`, documents: `[b, l]`
    /// - returns `[b, l, d_model]` and the new state
    pub fn forward_documents(
        &self,
        x: Tensor<B, 3>,
        documents: &Documents<B>,
        state: Option<Mamba2State<B>>,
    ) -> crate::Result<(Tensor<B, 3>, Mamba2State<B>)> {
        self.forward_inner(x, state, Some(documents))
    }

    /// [`forward`](Self::forward), over packed rows when `documents` are given.
    pub(crate) fn forward_inner(
        &self,
        x: Tensor<B, 3>,
        state: Option<Mamba2State<B>>,
        documents: Option<&Documents<B>>,
    ) -> crate::Result<(Tensor<B, 3>, Mamba2State<B>)> {
        check_shape(
            "x",
            &x.dims(),
            &[None, None, Some(self.d_model)],
            "b, l, d_model",
        )?;
        let [b, l, _] = x.dims();
        if l == 0 {
            return Err(Mamba2Error::Shape {
                name: "x",
                expected: "a sequence of at least one token".into(),
                actual: x.dims().to_vec(),
            });
        }
        if let Some(s) = &state {
            self.check_state(s, b)?;
        }
        if let Some(documents) = documents {
            documents.check(b, l)?;
        }
        let (h, p, g, n) = (self.nheads, self.headdim, self.ngroups, self.d_state);

        let Projected {
            z,
            x,
            b: b_in,
            c: c_in,
            dt,
        } = self.project(x.reshape([b * l, self.d_model]));
        let previous = match &state {
            Some(s) => s.conv.clone(),
            None => Tensor::zeros([b, self.conv_dim(), self.d_conv], (&x.device(), x.dtype())),
        };
        // per tap j of the convolution (token t - (K-1-j)): whether it is t's document
        let taps = documents.map(|d| {
            (0..self.d_conv)
                .map(|j| d.same_as_shifted(self.d_conv - 1 - j).unsqueeze_dim::<3>(2))
                .collect::<Vec<_>>()
        });
        let ([xs, b_mat, c_mat], conv_state) = self.conv_sequence(
            [
                x.reshape([b, l, self.d_inner]),
                b_in.reshape([b, l, g * n]),
                c_in.reshape([b, l, g * n]),
            ],
            previous,
            taps.as_deref(),
        );
        let xs = xs.reshape([b, l, h, p]);
        let b_mat = b_mat.reshape([b, l, g, n]);
        let c_mat = c_mat.reshape([b, l, g, n]);
        let (z, dt) = (z.reshape([b, l, self.d_inner]), dt.reshape([b, l, h]));
        let dt = self.dt_activation(dt);

        let (y, ssm_state) = ssd::ssd_chunked_documents(
            xs.clone(),
            dt,
            self.a(),
            b_mat,
            c_mat,
            self.chunk_size,
            state.map(|s| s.ssm),
            documents.map(Documents::starts),
        );
        let y = y + xs * self.d_skip().unsqueeze::<4>();
        let y = self.gate_and_project(y.reshape([b, l, self.d_inner]), z);
        Ok((
            y,
            Mamba2State {
                conv: conv_state,
                ssm: ssm_state,
            },
        ))
    }
}

impl<B: Backend> ModuleDisplay for Mamba2<B> {
    fn custom_settings(&self) -> Option<DisplaySettings> {
        crate::norm::inline_display()
    }

    fn custom_content(&self, content: Content) -> Option<Content> {
        content
            .add("d_model", &self.d_model)
            .add("d_inner", &self.d_inner)
            .add("d_state", &self.d_state)
            .add("nheads", &self.nheads)
            .add("headdim", &self.headdim)
            .add("ngroups", &self.ngroups)
            .add("d_conv", &self.d_conv)
            .add("chunk_size", &self.chunk_size)
            .add("gated_norm", &self.norm.is_some())
            .add("params", &self.num_params())
            .optional()
    }
}

#[cfg(all(test, feature = "ndarray"))]
mod tests {
    use super::*;

    #[test]
    fn the_mixer_displays_its_sizes() {
        let device = Default::default();
        let mixer = Mamba2Config::new(32)
            .with_d_state(8)
            .with_headdim(16)
            .init::<burn::backend::NdArray>(&device)
            .unwrap();
        let text = mixer.to_string();
        for part in [
            "d_model: 32",
            "d_inner: 64",
            "d_state: 8",
            "nheads: 4",
            "headdim: 16",
        ] {
            assert!(text.contains(part), "{part} missing from {text}");
        }
        let params = mixer.num_params();
        assert!(text.contains(&format!("params: {params}")), "{text}");
    }
}
