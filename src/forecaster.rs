//! A forecaster for multivariate time series: a Mamba-2 backbone over the lookback window and
//! a linear head from its last hidden state to the whole horizon.
//!
//! Options the time-series literature expects:
//! - **RevIN** (reversible instance normalisation, Kim et al. 2022): each window's variables are
//!   normalised by their own mean and standard deviation over the lookback (with a learnable
//!   per-variable affine map), and the forecast is mapped back;
//! - **channel-independent** mode (PatchTST): every variable is its own univariate sequence
//!   through shared weights; otherwise **channel-mixing**: all variables enter one sequence.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::{backend::Backend, Tensor};

use crate::backbone::{Mamba2Backbone, Mamba2BackboneConfig};
use crate::error::{check_shape, Mamba2Error};
use crate::param;

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
    /// Head from the last hidden state: `d_model → horizon` (channel-independent) or
    /// `d_model → horizon · n_targets`.
    pub head: Linear<B>,
    /// RevIN's affine map, when enabled.
    pub revin: Option<RevIn<B>>,
    n_inputs: usize,
    n_targets: usize,
    horizon: usize,
    channel_independent: bool,
    step_threads: usize,
}

impl Mamba2ForecasterConfig {
    /// Builds the forecaster (linear layers `U(±1/√fan_in)`, zero biases; RevIN identity).
    pub fn init<B: Backend>(&self, device: &B::Device) -> crate::Result<Mamba2Forecaster<B>> {
        for (field, v) in [
            ("n_inputs", self.n_inputs),
            ("n_targets", self.n_targets),
            ("horizon", self.horizon),
        ] {
            if v == 0 {
                return Err(Mamba2Error::InvalidConfig {
                    field,
                    reason: "must be at least 1".into(),
                });
            }
        }
        if (self.revin || self.channel_independent) && self.n_targets != self.n_inputs {
            return Err(Mamba2Error::InvalidConfig {
                field: "n_targets",
                reason: format!(
                    "RevIN and channel independence forecast the input variables: need n_targets = n_inputs = {}, got {}",
                    self.n_inputs, self.n_targets
                ),
            });
        }
        let d = self.backbone.mixer.d_model;
        let (d_in, d_out) = if self.channel_independent {
            (1, self.horizon)
        } else {
            (self.n_inputs, self.horizon * self.n_targets)
        };
        Ok(Mamba2Forecaster {
            input: crate::linear(d_in, d, true, device),
            backbone: self.backbone.init(device)?,
            head: crate::linear(d, d_out, true, device),
            revin: self.revin.then(|| RevIn {
                weight: param(Tensor::ones([self.n_inputs], device)),
                bias: param(Tensor::zeros([self.n_inputs], device)),
            }),
            n_inputs: self.n_inputs,
            n_targets: self.n_targets,
            horizon: self.horizon,
            channel_independent: self.channel_independent,
            step_threads: 1,
        })
    }
}

impl<B: Backend> Mamba2Forecaster<B> {
    /// Threads a training step spreads each batch over. Default: 1.
    pub fn step_threads(&self) -> usize {
        self.step_threads
    }

    /// Sets the threads a training step spreads each batch over, as
    /// [`Mamba2Lm::with_step_threads`](crate::Mamba2Lm::with_step_threads).
    pub fn with_step_threads(mut self, threads: usize) -> Self {
        self.step_threads = threads.max(1);
        self
    }

    /// Forecasts the next `horizon` steps from a lookback window.
    ///
    /// # Shapes
    /// - x: `[b, lookback, n_inputs]`
    /// - returns `[b, horizon, n_targets]`
    pub fn forward(&self, x: Tensor<B, 3>) -> crate::Result<Tensor<B, 3>> {
        check_shape(
            "x",
            &x.dims(),
            &[None, None, Some(self.n_inputs)],
            "b, lookback, n_inputs",
        )?;
        let [b, l, c] = x.dims();
        // RevIN: per window and variable statistics over the lookback
        let (x, stats) = match &self.revin {
            Some(rev) => {
                let mean = x.clone().mean_dim(1); // [b, 1, c]
                let centered = x - mean.clone();
                let var = centered.clone().square().mean_dim(1);
                let inv_std = (var.clone() + 1e-5).powf_scalar(-0.5);
                let std = (var + 1e-5).sqrt();
                let w = rev.weight.val().reshape([1, 1, c]);
                let bias = rev.bias.val().reshape([1, 1, c]);
                (centered * inv_std * w + bias, Some((mean, std)))
            }
            None => (x, None),
        };
        let y = if self.channel_independent {
            // [b, l, c] -> [b·c, l, 1]
            let seq = x.swap_dims(1, 2).reshape([b * c, l, 1]);
            let (h, _) = self.backbone.forward(self.input.forward(seq), None)?;
            let last = h
                .narrow(1, l - 1, 1)
                .reshape([b * c, self.backbone.d_model()]);
            self.head
                .forward(last)
                .reshape([b, c, self.horizon])
                .swap_dims(1, 2)
        } else {
            let (h, _) = self.backbone.forward(self.input.forward(x), None)?;
            let last = h.narrow(1, l - 1, 1).reshape([b, self.backbone.d_model()]);
            self.head
                .forward(last)
                .reshape([b, self.horizon, self.n_targets])
        };
        Ok(match (&self.revin, stats) {
            (Some(rev), Some((mean, std))) => {
                let w = rev.weight.val().reshape([1, 1, c]);
                let bias = rev.bias.val().reshape([1, 1, c]);
                // invert the affine map, then the statistics; the reciprocal is an exact
                // division with a constant numerator (see `activation::sigmoid`)
                let one = Tensor::<B, 3>::ones([1, 1, 1], &w.device());
                let inv_w = one / (w + 1e-10);
                (y - bias) * inv_w * std + mean
            }
            _ => y,
        })
    }

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
}
