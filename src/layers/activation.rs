//! Activations that are exact in every float type.
//!
//! Burn 0.21's default `sigmoid` (and so `silu`) computes in `f32` whatever the tensor's type,
//! which caps an `f64` model at `f32` accuracy, and its `softplus` overflows for large inputs.
//! These versions compute in the tensor's own type (half types in `f32`) and never overflow.

use burn::tensor::activation::relu;
use burn::tensor::{backend::Backend, Tensor};

use crate::precision::{cast_to, upcast};

/// Above this, `softplus(x) = x` to within `2e-9` (the reference kernels' threshold).
const SOFTPLUS_THRESHOLD: f64 = 20.0;

/// [`softplus`] of one `f32` (the CPU step's), with the same threshold.
pub(crate) fn softplus_f32(x: f32) -> f32 {
    let t = SOFTPLUS_THRESHOLD as f32;
    x.min(t).exp().ln_1p() + (x - t).max(0.0)
}

/// `softplus(x) = ln(1 + eˣ)`, as `ln(1 + e^min(x, 20)) + max(x - 20, 0)`: exact, never
/// overflowing, with the exact derivative `sigmoid(x)` everywhere but at the single point
/// `x = 20`.
///
/// With autodiff the derivative is supplied as `sigmoid(x)` (`with_derivative`) instead of
/// being left to the backward of `log1p`, which multiplies by `recip(1 + eˣ)`: burn-ndarray
/// computes `recip` with the approximate SIMD reciprocal (12 bits with AVX2, 14 with AVX-512),
/// and every gradient that flows through `dt` (`dt_bias`, `A_log`, the dt columns of in_proj)
/// would carry that error.
///
/// # Shapes
/// - any; returns the same shape
pub fn softplus<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    let dtype = x.dtype();
    let x = upcast(x);
    let value = softplus_value(x.clone().detach());
    let y = if B::ad_enabled(&x.device()) {
        let derivative = sigmoid(x.clone().detach());
        with_derivative(value, x, derivative)
    } else {
        value
    };
    cast_to(y, dtype)
}

/// The value of [`softplus`], untracked: `ln(1 + e^min(x, 20)) + max(x - 20, 0)`.
fn softplus_value<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    x.clone().clamp_max(SOFTPLUS_THRESHOLD).exp().log1p() + relu(x - SOFTPLUS_THRESHOLD)
}

/// `clamp(softplus(x), min, max)`, with the derivative `sigmoid(x)` where
/// `min ≤ softplus(x) ≤ max` and 0 elsewhere (PyTorch's clamp lets the gradient through at the
/// bounds too).
///
/// The derivative is supplied whole (`with_derivative`), as for [`softplus`]: the clamp's
/// mask is folded into it instead of going through the backward of Burn's `clamp` (a
/// `mask_fill` per bound), so the clamped `dt` costs no more graph than the plain one.
///
/// # Shapes
/// - any; returns the same shape
pub fn softplus_clamped<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    min: f64,
    max: f64,
) -> Tensor<B, D> {
    let dtype = x.dtype();
    let x = upcast(x);
    let detached = x.clone().detach();
    let softplus_x = softplus_value(detached.clone());
    let value = softplus_x.clone().clamp(min, max);
    let y = if B::ad_enabled(&x.device()) {
        let inside = softplus_x.clone().greater_equal_elem(min).float()
            * softplus_x.lower_equal_elem(max).float();
        let derivative = sigmoid(detached) * cast_to(inside, x.dtype());
        with_derivative(value, x, derivative)
    } else {
        value
    };
    cast_to(y, dtype)
}

/// `log_softmax(x)` along `dim`: `x - max - ln Σ exp(x - max)`, with the exact gradient.
///
/// Burn's `log_softmax` takes the log of the row sums, whose backward multiplies by their
/// `recip` (approximate on burn-ndarray, see [`softplus`]). Here the log-sum-exp gets its
/// derivative, the softmax `exp(x - lse)`, supplied directly (`with_derivative`), so the
/// gradient involves no reciprocal at all.
///
/// # Shapes
/// - any; returns the same shape
pub fn log_softmax<B: Backend, const D: usize>(x: Tensor<B, D>, dim: usize) -> Tensor<B, D> {
    let detached = x.clone().detach();
    let max = detached.clone().max_dim(dim);
    let shifted = detached - max.clone();
    let lse = shifted.clone().exp().sum_dim(dim).log() + max;
    if !B::ad_enabled(&x.device()) {
        return x - lse;
    }
    // d lse / d x = softmax(x) = exp(x - lse), summed into the row's log-sum-exp
    let softmax = (x.clone().detach() - lse.clone()).exp();
    let lse = lse + ((x.clone() - x.clone().detach()) * softmax).sum_dim(dim);
    x - lse
}

/// `softmax(x)` along `dim`, as `exp(log_softmax(x))`: its gradient goes through
/// [`log_softmax`]'s exact one, never through a reciprocal.
///
/// # Shapes
/// - any; returns the same shape
pub fn softmax<B: Backend, const D: usize>(x: Tensor<B, D>, dim: usize) -> Tensor<B, D> {
    log_softmax(x, dim).exp()
}

/// `value` (computed from `x` without tracking) made differentiable in `x` with the given
/// element-wise derivative: `value + (x - x̄) · derivative`, `x̄` being `x` detached. The second
/// term is exactly zero (so the result equals `value` bit for bit) and its gradient is
/// `derivative · grad`. Only first derivatives are right (the derivative itself is constant to
/// autodiff), which is all training needs.
///
/// # Shapes
/// - value, x, derivative: one shape (or broadcastable to `x`'s); returns `x`'s shape
fn with_derivative<B: Backend, const D: usize>(
    value: Tensor<B, D>,
    x: Tensor<B, D>,
    derivative: Tensor<B, D>,
) -> Tensor<B, D> {
    let zero = (x.clone() - x.detach()) * derivative.detach();
    value.detach() + zero
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
    // of one shape, which burn-ndarray vectorises (a broadcast one-element numerator takes its
    // generic element-by-element path)
    cast_to(denominator.ones_like() / denominator, dtype)
}

/// Mamba-3's heavy-tailed activation of its data-dependent `A` (`mamba_ssm`'s
/// `heavy_tail_activation`): `1 + x` for `x ≥ 0`, `1 / (1 − x)` for `x < 0`, as
/// `relu(x) + 1 / (1 − min(x, 0))`: positive, continuous with a continuous slope, linear on one
/// side and decaying like `1/|x|` on the other.
///
/// The quotient has a constant numerator, as in [`sigmoid`], so that its gradient is an exact
/// division and never burn-ndarray's approximate `recip`.
///
/// # Shapes
/// - any; returns the same shape
pub fn heavy_tail<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    let dtype = x.dtype();
    let x = upcast(x);
    let denominator = x.clone().clamp_max(0.0).neg() + 1.0;
    cast_to(relu(x) + denominator.ones_like() / denominator, dtype)
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
