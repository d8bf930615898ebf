//! A forecaster for multivariate time series: a Mamba-2 backbone over the lookback window and
//! a linear head from its last hidden state to the whole horizon.
//!
//! Options the time-series literature expects:
//! - **RevIN** (reversible instance normalisation, Kim et al. 2022): each window's variables are
//!   normalised by their own mean and standard deviation over the lookback (with a learnable
//!   per-variable affine map), and the forecast is mapped back;
//! - **channel-independent** mode (PatchTST): every variable is its own univariate sequence
//!   through shared weights; otherwise **channel-mixing**: all variables enter one sequence;
//! - **patches** (PatchTST): each token is `patch_len` consecutive steps (overlapping when
//!   `patch_stride < patch_len`), so the backbone runs over a few tokens per window instead of
//!   one per step;
//! - a **flatten head** (PatchTST) that maps every token's hidden state to the horizon, beside
//!   the head on the last token's hidden state that suits streaming.

use crate::ssd::SsdBackend;
use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::{Dropout, DropoutConfig, Linear};
use burn::tensor::{backend::Backend, Tensor};

use crate::error::{check_shape, Mamba2Error};
use crate::init::param;
use crate::layers::backbone::{Mamba2Backbone, Mamba2BackboneConfig};
use crate::precision::{cast_to, reshape_via_flat};

/// Configuration of a [`Mamba2Forecaster`].
#[derive(Config, Debug)]
pub struct Mamba2ForecasterConfig {
    /// Variables per time step in the input window.
    pub n_inputs: usize,
    /// Variables forecast per step (must equal `n_inputs` with RevIN or channel independence:
    /// then the targets are the input variables).
    pub n_targets: usize,
    /// Steps forecast.
    pub horizon: usize,
    /// The backbone.
    pub backbone: Mamba2BackboneConfig,
    /// Reversible instance normalisation. Default: true.
    #[config(default = true)]
    pub revin: bool,
    /// One univariate sequence per variable with shared weights. Default: true.
    #[config(default = true)]
    pub channel_independent: bool,
    /// Time steps per token. Default: 1 (one token per step).
    #[config(default = 1)]
    pub patch_len: usize,
    /// Steps between the starts of consecutive patches (`None`: `patch_len`, no overlap).
    /// Default: None.
    pub patch_stride: Option<usize>,
    /// What the head reads. Default: [`ForecastHead::Last`].
    #[config(default = "ForecastHead::Last")]
    pub head: ForecastHead,
    /// Steps per input window, fixed when the head is [`ForecastHead::Flatten`] (`None`: any
    /// window of at least `patch_len` steps). Default: None.
    pub lookback: Option<usize>,
    /// Dropout on what the head reads, during training. Default: 0.
    #[config(default = 0.0)]
    pub head_dropout: f64,
}

/// The forecaster's head.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum ForecastHead {
    /// A linear map of the last token's hidden state (the head a streaming forecaster can
    /// update after each observation).
    Last,
    /// A linear map of every token's hidden state, concatenated (PatchTST's flatten head);
    /// needs a fixed `lookback`.
    Flatten,
}

/// Learnable per-variable affine map of RevIN.
#[derive(Module, Debug)]
pub struct RevIn<B: Backend> {
    /// Scale `[n_vars]`, ones at init.
    pub weight: Param<Tensor<B, 1>>,
    /// Shift `[n_vars]`, zeros at init.
    pub bias: Param<Tensor<B, 1>>,
}

/// Mamba-2 forecaster (see the module documentation).
#[derive(Module, Debug)]
pub struct Mamba2Forecaster<B: Backend> {
    /// Per-step input projection: `1 → d_model` (channel-independent) or `n_inputs → d_model`.
    pub input: Linear<B>,
    /// The backbone.
    pub backbone: Mamba2Backbone<B>,
    /// Head from the last hidden state (`d_model`) or from every token's (`tokens · d_model`)
    /// to `horizon` (channel-independent) or `horizon · n_targets`.
    pub head: Linear<B>,
    /// RevIN's affine map, when enabled.
    pub revin: Option<RevIn<B>>,
    /// Dropout before the head.
    pub head_dropout: Dropout,
    n_inputs: usize,
    n_targets: usize,
    horizon: usize,
    channel_independent: bool,
    patch_len: usize,
    patch_stride: usize,
    lookback: Option<usize>,
    flatten_tokens: Option<usize>,
}

impl Mamba2ForecasterConfig {
    /// Builds the forecaster (linear layers `U(±1/√fan_in)`, zero biases; RevIN identity).
    pub fn init<B: Backend>(
        &self,
        device: &B::Device,
    ) -> crate::error::Result<Mamba2Forecaster<B>> {
        for (field, v) in [
            ("n_inputs", self.n_inputs),
            ("n_targets", self.n_targets),
            ("horizon", self.horizon),
        ] {
            if v == 0 {
                return Err(Mamba2Error::config(field, "must be at least 1"));
            }
        }
        if (self.revin || self.channel_independent) && self.n_targets != self.n_inputs {
            return Err(Mamba2Error::config("n_targets", format!(
                    "RevIN and channel independence forecast the input variables: need n_targets = n_inputs = {}, got {}",
                    self.n_inputs, self.n_targets
                ),
            ));
        }
        let invalid = |field, reason: String| Err(Mamba2Error::config(field, reason));
        if self.patch_len == 0 {
            return invalid("patch_len", "must be at least 1".into());
        }
        let patch_stride = self.patch_stride.unwrap_or(self.patch_len);
        if patch_stride == 0 || patch_stride > self.patch_len {
            return invalid(
                "patch_stride",
                format!(
                    "must be in 1..=patch_len = {} (patches may overlap, not leave gaps), got {patch_stride}",
                    self.patch_len
                ),
            );
        }
        if !(0.0..1.0).contains(&self.head_dropout) {
            return invalid(
                "head_dropout",
                format!("must be in [0, 1), got {}", self.head_dropout),
            );
        }
        let flatten_tokens = match (self.head, self.lookback) {
            (_, Some(l)) if l < self.patch_len => {
                return invalid(
                    "lookback",
                    format!("{l} steps hold no patch of {} steps", self.patch_len),
                )
            }
            (ForecastHead::Flatten, Some(l)) => Some(patch_count(l, self.patch_len, patch_stride)),
            (ForecastHead::Flatten, None) => {
                return invalid("lookback", "the flatten head needs a fixed lookback".into())
            }
            (ForecastHead::Last, _) => None,
        };
        let d = self.backbone.mixer.d_model;
        let (d_in, d_out) = if self.channel_independent {
            (self.patch_len, self.horizon)
        } else {
            (
                self.patch_len * self.n_inputs,
                self.horizon * self.n_targets,
            )
        };
        Ok(Mamba2Forecaster {
            input: crate::init::linear(d_in, d, true, device),
            backbone: self.backbone.init(device)?,
            head: crate::init::linear(d * flatten_tokens.unwrap_or(1), d_out, true, device),
            revin: self.revin.then(|| RevIn {
                weight: param(Tensor::ones([self.n_inputs], device)),
                bias: param(Tensor::zeros([self.n_inputs], device)),
            }),
            head_dropout: DropoutConfig::new(self.head_dropout).init(),
            n_inputs: self.n_inputs,
            n_targets: self.n_targets,
            horizon: self.horizon,
            channel_independent: self.channel_independent,
            patch_len: self.patch_len,
            patch_stride,
            lookback: self.lookback,
            flatten_tokens,
        })
    }
}

/// Patches of `len` steps, `stride` apart, that fit in `lookback` steps, the last one ending at
/// the window's last step.
fn patch_count(lookback: usize, len: usize, stride: usize) -> usize {
    (lookback - len) / stride + 1
}

impl<B: Backend> Mamba2Forecaster<B> {
    /// Forecasts the next `horizon` steps from a lookback window.
    ///
    /// The window is cut into patches of `patch_len` steps, `patch_stride` apart, the last
    /// ending at the window's last step (with a stride that does not divide `lookback -
    /// patch_len`, the first few steps fall outside every patch).
    ///
    /// # Shapes
    /// - x: `[b, lookback, n_inputs]` (`lookback` as configured, if it is)
    /// - returns `[b, horizon, n_targets]`
    pub fn forward(&self, x: Tensor<B, 3>) -> crate::error::Result<Tensor<B, 3>>
    where
        B: SsdBackend,
    {
        check_shape(
            "x",
            &x.dims(),
            &[None, self.lookback, Some(self.n_inputs)],
            "b, lookback, n_inputs",
        )?;
        let [b, l, c] = x.dims();
        if l < self.patch_len {
            return Err(Mamba2Error::Shape {
                name: "x",
                expected: format!("[b, lookback >= patch_len = {}, n_inputs]", self.patch_len),
                actual: vec![b, l, c],
            });
        }
        // RevIN and its inverse in the input's type, the rest in the weights' (mixed precision
        // casts them)
        let io = x.dtype();
        let affine = |rev: &RevIn<B>| {
            let w = cast_to(rev.weight.val(), io).reshape([1, 1, c]);
            (w, cast_to(rev.bias.val(), io).reshape([1, 1, c]))
        };
        // RevIN: per window and variable statistics over the lookback
        let (x, stats) = match &self.revin {
            Some(rev) => {
                let mean = x.clone().mean_dim(1); // [b, 1, c]
                let centered = x - mean.clone();
                let var = centered.clone().square().mean_dim(1);
                let inv_std = (var.clone() + 1e-5).powf_scalar(-0.5);
                let std = (var + 1e-5).sqrt();
                let (w, bias) = affine(rev);
                (centered * inv_std * w + bias, Some((mean, std)))
            }
            None => (x, None),
        };
        let x = cast_to(x, self.input.weight.val().dtype());
        let y = if self.channel_independent {
            // [b, l, c] -> [b·c, l, 1] -> tokens [b·c, n, patch_len]
            let seq = x.swap_dims(1, 2).reshape([b * c, l, 1]);
            let features = self.head_input(self.patches(seq))?;
            self.head
                .forward(features)
                .reshape([b, c, self.horizon])
                .swap_dims(1, 2)
        } else {
            // tokens [b, n, patch_len · c]
            let features = self.head_input(self.patches(x))?;
            self.head
                .forward(features)
                .reshape([b, self.horizon, self.n_targets])
        };
        let y = cast_to(y, io);
        Ok(match (&self.revin, stats) {
            (Some(rev), Some((mean, std))) => {
                let (w, bias) = affine(rev);
                // invert the affine map, then the statistics; the reciprocal is an exact
                // division with a constant numerator (see `activation::sigmoid`)
                let one = Tensor::<B, 3>::ones([1, 1, 1], &w.device());
                let inv_w = one / (w + 1e-10);
                (y - bias) * inv_w * std + mean
            }
            _ => y,
        })
    }

    /// The tokens of a window: patches of `patch_len` steps, `patch_stride` apart, the last
    /// ending at the last step, each step's variables side by side.
    ///
    /// # Shapes
    /// - x: `[b, l, v]`; returns `[b, n, patch_len · v]`
    fn patches(&self, x: Tensor<B, 3>) -> Tensor<B, 3>
    where
        B: SsdBackend,
    {
        let [b, l, v] = x.dims();
        let (len, stride) = (self.patch_len, self.patch_stride);
        if len == 1 {
            return x;
        }
        let n = patch_count(l, len, stride);
        let first = l - len - (n - 1) * stride;
        // narrowed views of a channel-independent `[b·c, l, 1]`, reshaped through a flat copy
        // (burn-cubecl's view reshape of strided tensors with unit axes: see `ssd`)
        if stride == len {
            return reshape_via_flat(x.narrow(1, first, n * len), [b, n, len * v]);
        }
        let tokens = (0..n)
            .map(|i| {
                let patch = x.clone().narrow(1, first + i * stride, len);
                reshape_via_flat(patch, [b, 1, len * v])
            })
            .collect();
        Tensor::cat(tokens, 1)
    }

    /// What the head reads: the backbone's hidden state of the last token, or of every token
    /// side by side, after dropout.
    ///
    /// # Shapes
    /// - tokens: `[s, n, d_in]`; returns `[s, d_model]` (last) or `[s, n · d_model]` (flatten)
    fn head_input(&self, tokens: Tensor<B, 3>) -> crate::error::Result<Tensor<B, 2>>
    where
        B: SsdBackend,
    {
        let [s, n, _] = tokens.dims();
        let d = self.backbone.d_model();
        let (h, _) = self.backbone.forward(self.input.forward(tokens), None)?;
        let features = match self.flatten_tokens {
            Some(_) => h.reshape([s, n * d]),
            None => h.narrow(1, n - 1, 1).reshape([s, d]),
        };
        Ok(self.head_dropout.forward(features))
    }
}

impl<B: Backend> Mamba2Forecaster<B> {
    /// Forecast horizon.
    pub fn horizon(&self) -> usize {
        self.horizon
    }

    /// Variables per input step.
    pub fn n_inputs(&self) -> usize {
        self.n_inputs
    }

    /// Variables forecast per step.
    pub fn n_targets(&self) -> usize {
        self.n_targets
    }

    /// Whether each variable is its own sequence.
    pub fn channel_independent(&self) -> bool {
        self.channel_independent
    }

    /// Time steps per token.
    pub fn patch_len(&self) -> usize {
        self.patch_len
    }

    /// Whether the head reads every token's hidden state ([`ForecastHead::Flatten`]).
    pub fn flatten_head(&self) -> bool {
        self.flatten_tokens.is_some()
    }
}
