//! A sequence regressor for time series: a linear input layer, the backbone, a linear output.

use crate::precision::cast_to;
use crate::ssd::SsdBackend;
use burn::config::Config;
use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::{backend::Backend, Tensor};

use crate::error::{check_shape, Mamba2Error};
use crate::layers::backbone::{Mamba2Backbone, Mamba2BackboneConfig};
use crate::layers::state::BackboneState;

/// Configuration of a [`Mamba2Regressor`].
#[derive(Config, Debug)]
pub struct Mamba2RegressorConfig {
    /// Features per time step of the input.
    pub n_features: usize,
    /// Outputs per time step.
    pub n_outputs: usize,
    /// The backbone.
    pub backbone: Mamba2BackboneConfig,
}

impl Mamba2RegressorConfig {
    /// Builds the regressor: both linear layers `U(±1/√fan_in)` with zero bias.
    pub fn init<B: Backend>(&self, device: &B::Device) -> crate::error::Result<Mamba2Regressor<B>> {
        for (field, v) in [
            ("n_features", self.n_features),
            ("n_outputs", self.n_outputs),
        ] {
            if v == 0 {
                return Err(Mamba2Error::config(field, "must be at least 1"));
            }
        }
        let linear = |d_in: usize, d_out: usize| crate::init::linear(d_in, d_out, true, device);
        let d_model = self.backbone.mixer.d_model;
        Ok(Mamba2Regressor {
            input: linear(self.n_features, d_model),
            backbone: self.backbone.init(device)?,
            output: linear(d_model, self.n_outputs),
        })
    }
}

/// `Linear(n_features → d_model)`, backbone, `Linear(d_model → n_outputs)`, applied at every
/// time step (causal: the output at `t` sees inputs up to `t`).
#[derive(Module, Debug)]
pub struct Mamba2Regressor<B: Backend> {
    /// Input projection.
    pub input: Linear<B>,
    /// Blocks and final norm.
    pub backbone: Mamba2Backbone<B>,
    /// Output projection.
    pub output: Linear<B>,
}

impl<B: Backend> Mamba2Regressor<B> {
    /// Number of input features.
    pub fn n_features(&self) -> usize
    where
        B: SsdBackend,
    {
        self.input.weight.dims()[0]
    }

    /// # Shapes
    /// - x: `[b, l, n_features]`; returns `[b, l, n_outputs]` and the new state
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        state: Option<BackboneState<B>>,
    ) -> crate::error::Result<(Tensor<B, 3>, BackboneState<B>)>
    where
        B: SsdBackend,
    {
        check_shape(
            "x",
            &x.dims(),
            &[None, None, Some(self.n_features())],
            "b, l, n_features",
        )?;
        // in the weights' type (mixed precision casts them), the output in the input's
        let io = x.dtype();
        let x = cast_to(x, self.input.weight.val().dtype());
        let (h, state) = self.backbone.forward(self.input.forward(x), state)?;
        Ok((cast_to(self.output.forward(h), io), state))
    }

    /// # Shapes
    /// - x: `[b, n_features]`; returns `[b, n_outputs]` and the new state
    pub fn step(
        &self,
        x: Tensor<B, 2>,
        state: BackboneState<B>,
    ) -> crate::error::Result<(Tensor<B, 2>, BackboneState<B>)>
    where
        B: SsdBackend,
    {
        check_shape(
            "x",
            &x.dims(),
            &[None, Some(self.n_features())],
            "b, n_features",
        )?;
        let (h, state) = self.backbone.step(self.input.forward(x), state)?;
        Ok((self.output.forward(h), state))
    }
}
