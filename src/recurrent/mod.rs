//! A dedicated CPU path for the recurrent step: one token of one sequence through the whole
//! backbone in plain `f32` loops over host memory, with no tensor dispatch and no allocation
//! per token.
//!
//! It computes exactly what [`Mamba2::step`](crate::Mamba2::step) and
//! [`Mamba2Backbone::step`](crate::Mamba2Backbone::step) compute (the tests check it against
//! them and against the chunked forward), for models of any backend: the weights are copied to
//! `f32` host vectors once, by [`CpuBackbone::from_backbone`]. Use it to score a live stream
//! tick by tick or to decode on a CPU; train and prefill with the tensor modules.
//!
//! Dimension letters as in [`ssd`](crate::ssd): `h` heads, `p` head dimension, `n` state size,
//! `g` groups, `k` convolution width.
//!
//! On x86-64 the matrix-vector products and the state update run in a version compiled for
//! AVX2 + FMA when the processor has them (checked once, at run time), and in portable code
//! otherwise.
//!
//! [`StreamingForecaster`] runs a trained forecaster on the same
//! step, one observation at a time.

mod backbone;
mod lm;
mod simd;
mod streaming;

pub use backbone::*;
pub use lm::{CpuLm, CpuLmState};
pub use streaming::StreamingForecaster;
