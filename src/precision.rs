//! The float types the crate computes in: half-precision inputs are computed in `f32` where
//! precision matters (the SSD's decays and states, the norms' statistics, the residual stream),
//! and the helpers that move tensors between types and layouts.

use burn::tensor::{backend::Backend, DType, Tensor};

/// The float type the SSD computes in for inputs of type `dtype`: `f32` for half types,
/// the type itself otherwise.
pub(crate) fn compute_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 => DType::F32,
        other => other,
    }
}

/// Casts `t` to its compute type (a no-op for `f32` and `f64`).
pub(crate) fn upcast<B: Backend, const D: usize>(t: Tensor<B, D>) -> Tensor<B, D> {
    let target = compute_dtype(t.dtype());
    if t.dtype() == target {
        t
    } else {
        t.cast(target)
    }
}

/// Casts `t` to `dtype` when it differs.
pub(crate) fn cast_to<B: Backend, const D: usize>(t: Tensor<B, D>, dtype: DType) -> Tensor<B, D> {
    if t.dtype() == dtype {
        t
    } else {
        t.cast(dtype)
    }
}

/// `t.reshape(shape)` through a flat copy: the same values, and safe where the tensor may be a
/// strided view whose last axes have size 1. Burn 0.21's view reshape (`burn_std`'s
/// `split_strides`, which burn-cubecl uses) gives such a view wrong strides when the reshape
/// adds axes: `[4, 1, 3]` permuted to `[3, 4, 1]` and reshaped to `[3, 4, 1, 1]` reads wrong
/// elements on Wgpu and Cuda. Flattening first makes the data contiguous (a copy only where
/// it is a strided view), and both reshapes, and their backward, then go through a shape
/// without unit axes.
///
/// # Shapes
/// - t: any; returns `shape` (same number of elements)
pub(crate) fn reshape_via_flat<B: Backend, const D: usize, const D2: usize>(
    t: Tensor<B, D>,
    shape: [usize; D2],
) -> Tensor<B, D2> {
    let n = t.shape().num_elements();
    t.reshape([n]).reshape(shape)
}
