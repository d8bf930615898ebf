//! What every launch of the fused scan shares: buffers in `f32` and the launch grid.

use burn::tensor::{DType, Shape};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

/// Threads per cube of every kernel.
pub(super) const CUBE_SIZE: u32 = 64;

/// An uninitialised contiguous `f32` tensor on `like`'s device.
pub(super) fn empty<R: CubeRuntime>(
    like: &CubeTensor<R>,
    shape: impl Into<Shape>,
) -> CubeTensor<R> {
    empty_device_contiguous_dtype(
        like.client.clone(),
        like.device.clone(),
        shape.into(),
        DType::F32,
    )
}

/// A one-element placeholder for an argument a kernel does not read.
pub(super) fn unused<R: CubeRuntime>(like: &CubeTensor<R>) -> CubeTensor<R> {
    empty(like, [1])
}

/// The launch grid of one thread per element of `count`.
pub(super) fn grid<R: CubeRuntime>(like: &CubeTensor<R>, count: usize) -> (CubeCount, CubeDim) {
    let dim = CubeDim::new_1d(CUBE_SIZE);
    (
        cubecl::calculate_cube_count_elemwise(&like.client, count, dim),
        dim,
    )
}
