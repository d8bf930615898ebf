//! The mixer's projections (`in_proj`'s pieces, `out_proj`) as a backend operation of their own
//! ([`ProjectionBackend`]): Burn's `linear` by default, `gemm` products read in place on
//! NdArray.

use burn::tensor::{backend::Backend, ops::FloatTensor, DType, Tensor};

use super::fused::FusedKernels;
use super::primitive::{float, primitive};

/// A backend that runs the mixer's projections, `x · weight (+ bias)`: a supertrait of
/// [`SsdBackend`](super::SsdBackend).
///
/// Every method has a default (Burn's `linear`, differentiated by autodiff): another backend
/// implements it with `impl ProjectionBackend for MyBackend {}`.
pub trait ProjectionBackend: Backend {
    /// A projection: `x · weight (+ bias)`, Burn's `linear` on a matrix. The default is the backend's own `linear`; NdArray runs it (and
    /// its gradient, [`ProjectionBackend::projection_backward`]) as `gemm` products on the slices,
    /// read in place, so that a project on stock burn-ndarray gets the same products as this
    /// repository.
    ///
    /// # Shapes
    /// - x `[m, k]`, weight `[k, n]`, bias `[n]`; returns `[m, n]`
    fn projection(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        Self::linear(x, weight, bias)
    }

    /// Whether this backend runs [`ProjectionBackend::projection`] with a gradient of its own
    /// ([`ProjectionBackend::projection_backward`]) for inputs of type `dtype`. When it does not,
    /// autodiff differentiates the backend's `linear`.
    fn has_fused_projection(dtype: DType) -> bool {
        let _ = dtype;
        false
    }

    /// The gradients of [`ProjectionBackend::projection`]'s inputs from its output's, `grad` `[m, n]`;
    /// `bias` is the bias's type when there is one (its gradient comes in that type). Called
    /// only where [`ProjectionBackend::has_fused_projection`] holds.
    fn projection_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<DType>,
        grad: FloatTensor<Self>,
    ) -> ProjectionGrads<Self> {
        let _ = (x, weight, bias, grad);
        panic!("this backend has no fused projection gradient (has_fused_projection is false)")
    }
}

/// The gradients of [`ProjectionBackend::projection`]'s inputs, each in its input's shape and type.
#[derive(Debug)]
pub struct ProjectionGrads<B: Backend> {
    /// The gradient of `x`, `[m, k]`.
    pub x: FloatTensor<B>,
    /// The gradient of the weight, `[k, n]`.
    pub weight: FloatTensor<B>,
    /// The gradient of the bias, `[n]`, when there is one.
    pub bias: Option<FloatTensor<B>>,
}

/// `x · weight (+ bias)` through [`ProjectionBackend::projection`], or Burn's `linear` when
/// `kernels` (or the calling thread's [`override_fused_kernels`](super::override_fused_kernels))
/// is [`FusedKernels::Never`].
///
/// # Shapes
/// - x `[m, k]`, weight `[k, n]`, bias `[n]`; returns `[m, n]`
pub fn projection<B: ProjectionBackend>(
    x: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    kernels: FusedKernels,
) -> Tensor<B, 2> {
    if kernels.in_effect() == FusedKernels::Never {
        return burn::tensor::module::linear(x, weight, bias);
    }
    float(B::projection(
        primitive(x),
        primitive(weight),
        bias.map(primitive),
    ))
}
