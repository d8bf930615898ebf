mod activation;
mod base;
mod bool_tensor;
mod int_tensor;
mod module;
mod qtensor;
#[cfg(feature = "simd")]
mod simd;
mod tensor;
mod transaction;

pub(crate) mod adaptive_avgpool;
pub(crate) mod avgpool;
pub(crate) mod conv;
pub(crate) mod deform_conv;
pub(crate) mod exp;
pub(crate) mod grid_sample;
pub(crate) mod interpolate;
pub(crate) mod macros;
pub(crate) mod matmul;
pub(crate) mod maxpool;
pub(crate) mod padding;
pub(crate) mod quantization;

pub(crate) use base::*;
