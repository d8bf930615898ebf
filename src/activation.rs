//! Activations that are exact in every float type.
//!
//! Burn 0.21's default `sigmoid` (and so `silu`) computes in `f32` whatever the tensor's type,
//! which caps an `f64` model at `f32` accuracy, and its `softplus` overflows for large inputs.
//! These versions compute in the tensor's own type (half types in `f32`) and never overflow.

use burn::tensor::activation::relu;
use burn::tensor::{backend::Backend, Tensor};

use crate::ssd::{cast_to, upcast};

/// Above this, `softplus(x) = x` to within `2e-9` (the reference kernels' threshold).
const SOFTPLUS_THRESHOLD: f64 = 20.0;

/// `softplus(x) = ln(1 + eˣ)`, as `ln(1 + e^min(x, 20)) + max(x - 20, 0)`: exact, with the
/// exact derivative everywhere but at the single point `x = 20`.
///
/// # Shapes
/// - any; returns the same shape
pub fn softplus<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    let dtype = x.dtype();
    let x = upcast(x);
    let y = x.clone().clamp_max(SOFTPLUS_THRESHOLD).exp().log1p() + relu(x - SOFTPLUS_THRESHOLD);
    cast_to(y, dtype)
}

/// `sigmoid(x) = 1 / (1 + e⁻ˣ)`.
///
/// The quotient has a constant numerator on purpose: the gradient then flows only through the
/// denominator (`-1 / (1 + e⁻ˣ)²`, an exact division), never through `recip`, which
/// burn-ndarray computes with an approximate 12–14-bit SIMD instruction. For `x → -∞`,
/// `e⁻ˣ = ∞` and the result is exactly 0, with a zero gradient.
///
/// # Shapes
/// - any; returns the same shape
pub fn sigmoid<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    let dtype = x.dtype();
    let x = upcast(x);
    let denominator = x.neg().exp() + 1.0;
    // a full-size numerator, so that the quotient is an element-wise division of two tensors
    // of one shape, which burn-ndarray vectorises (a broadcast one-element numerator took its
    // generic path: with it `silu` of 1,048,576 values took 1.73 ms instead of 1.06)
    cast_to(denominator.ones_like() / denominator, dtype)
}

/// `silu(x) = x · sigmoid(x)` (also called swish). Without autodiff it is computed as
/// `x / (1 + e⁻ˣ)` (one rounding less; the gradient of that quotient would go through
/// burn-ndarray's approximate `recip`, see [`sigmoid`]).
///
/// # Shapes
/// - any; returns the same shape
pub fn silu<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    if B::ad_enabled(&x.device()) {
        return x.clone() * sigmoid(x);
    }
    // without a gradient to keep exact, one division instead of a quotient and a product
    let dtype = x.dtype();
    let x = upcast(x);
    let denominator = x.clone().neg().exp() + 1.0;
    cast_to(x / denominator, dtype)
}
