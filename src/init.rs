//! The reference initialisation of parameters that Burn's own initialisers do not give.

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::{backend::Backend, Distribution, Tensor};

/// A trainable parameter from an initial value, which may be computed (it is detached first,
/// so that it becomes a leaf of the autodiff graph).
pub(crate) fn param<B: Backend, const D: usize>(value: Tensor<B, D>) -> Param<Tensor<B, D>> {
    Param::from_tensor(value.detach())
}

/// A `Linear` initialised as PyTorch's `nn.Linear` default that state-spaces keeps: weight
/// `U(±1/√d_in)` (stored `[d_in, d_out]`), and a zero bias when `bias` is set.
pub(crate) fn linear<B: Backend>(
    d_in: usize,
    d_out: usize,
    bias: bool,
    device: &B::Device,
) -> Linear<B> {
    let bound = 1.0 / (d_in as f64).sqrt();
    Linear {
        weight: param(Tensor::random(
            [d_in, d_out],
            Distribution::Uniform(-bound, bound),
            device,
        )),
        bias: bias.then(|| param(Tensor::zeros([d_out], device))),
    }
}
