#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod activation;
pub mod backbone;
#[cfg(feature = "blas")]
pub mod blas;
pub mod block;
pub mod checkpoint;
pub mod cpu;
pub mod data;
pub mod documents;
pub mod error;
pub mod forecaster;
pub mod lm;
pub mod mixer;
pub mod norm;
pub mod regressor;
pub mod sampling;
pub mod ssd;
pub mod state;
pub mod streaming;
pub mod train;

pub use backbone::{Mamba2Backbone, Mamba2BackboneConfig};
pub use block::{Mamba2Block, Mamba2BlockConfig};
pub use checkpoint::{
    load_backbone, load_lm, pytorch_name, read_config, save_lm, CheckpointFormat,
};
pub use documents::Documents;
pub use error::{Mamba2Error, Result};
pub use forecaster::{ForecastHead, Mamba2Forecaster, Mamba2ForecasterConfig};
pub use lm::{Mamba2Lm, Mamba2LmConfig};
pub use mixer::{DtLimit, Mamba2, Mamba2Config};
pub use regressor::{Mamba2Regressor, Mamba2RegressorConfig};
pub use state::{BackboneState, Mamba2State};
pub use streaming::StreamingForecaster;

/// A trainable parameter from an initial value, which may be computed (it is detached first,
/// so that it becomes a leaf of the autodiff graph).
pub(crate) fn param<B: burn::tensor::backend::Backend, const D: usize>(
    value: burn::tensor::Tensor<B, D>,
) -> burn::module::Param<burn::tensor::Tensor<B, D>> {
    burn::module::Param::from_tensor(value.detach())
}

/// A `Linear` initialised as PyTorch's `nn.Linear` default that state-spaces keeps: weight
/// `U(±1/√d_in)` (stored `[d_in, d_out]`), and a zero bias when `bias` is set.
pub(crate) fn linear<B: burn::tensor::backend::Backend>(
    d_in: usize,
    d_out: usize,
    bias: bool,
    device: &B::Device,
) -> burn::nn::Linear<B> {
    let bound = 1.0 / (d_in as f64).sqrt();
    burn::nn::Linear {
        weight: param(burn::tensor::Tensor::random(
            [d_in, d_out],
            burn::tensor::Distribution::Uniform(-bound, bound),
            device,
        )),
        bias: bias.then(|| param(burn::tensor::Tensor::zeros([d_out], device))),
    }
}
