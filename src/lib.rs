//! Mamba-2 (the state-space duality model of Dao & Gu, 2024) as Burn modules, generic over the
//! backend: the same code trains on CUDA or Wgpu and runs on the CPU (`NdArray`), and Burn's
//! autodiff computes every gradient.
//!
//! - [`Mamba2`] is the mixer (the SSD layer), [`Mamba2Block`] a pre-norm residual block,
//!   [`Mamba2Backbone`] a stack; [`Mamba2Lm`], [`Mamba2Regressor`] and [`Mamba2Forecaster`] are
//!   models over it. Every `forward` takes an optional state and returns the state after its
//!   last token, and `step` continues it one token at a time; [`Documents`] packs several
//!   sequences into one row.
//! - [`ssd`] holds the math: the chunked scan, the sequential recurrence and the single step.
//! - [`load_lm`] reads Hugging Face and state-spaces checkpoint folders; [`train`] has the
//!   `TrainStep` / `InferenceStep` impls, the optimizer and complete training runs with Burn's
//!   `Learner`; [`StreamingForecaster`] and [`cpu`] run the recurrent step on the CPU for one
//!   stream at a time.
//!
//! ```
//! use burn::backend::NdArray;
//! use burn::tensor::{Int, Tensor};
//! use mamba2_burn::{Mamba2BackboneConfig, Mamba2Config, Mamba2LmConfig};
//!
//! # fn main() -> Result<(), mamba2_burn::Mamba2Error> {
//! let device = Default::default();
//! let mixer = Mamba2Config::new(64).with_d_state(16).with_headdim(32).with_chunk_size(32);
//! let lm = Mamba2LmConfig::new(Mamba2BackboneConfig::new(2, mixer), 256).init::<NdArray>(&device)?;
//! let ids = Tensor::<NdArray, 2, Int>::from_data([[1, 2, 3, 4, 5]], &device);
//! let (logits, state) = lm.forward(ids, None)?; // logits [1, 5, 256]
//! let next = Tensor::<NdArray, 1, Int>::from_data([6], &device);
//! let (next_logits, _state) = lm.step(next, state)?; // [1, 256], constant time per token
//! assert_eq!((logits.dims(), next_logits.dims()), ([1, 5, 256], [1, 256]));
//! # Ok(())
//! # }
//! ```
//!
//! The README covers training, checkpoints, time series, backends, measurements and tests.
#![warn(missing_docs)]

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

pub mod activation;
mod backbone;
#[cfg(feature = "blas")]
pub mod blas;
mod block;
mod checkpoint;
pub mod cpu;
#[cfg(feature = "train")]
pub mod data;
mod documents;
mod error;
mod forecaster;
mod lm;
mod mixer;
mod norm;
mod recorder;
mod regressor;
pub mod sampling;
pub mod ssd;
mod ssd_autodiff;
mod ssd_backend;
#[cfg(feature = "cubecl")]
mod ssd_cube;
mod state;
mod streaming;
#[cfg(feature = "train")]
pub mod train;

pub use backbone::*;
pub use block::*;
pub use checkpoint::*;
pub use documents::*;
pub use error::*;
pub use forecaster::*;
pub use lm::*;
pub use mixer::*;
pub use norm::*;
pub use recorder::{AtomicFileRecorder, CheckpointRecorder};
pub use regressor::*;
pub use ssd_backend::{SsdAutodiffBackend, SsdBackend, SsdGrads, SsdInputs};
pub use state::*;
pub use streaming::*;

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
