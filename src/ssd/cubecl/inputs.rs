//! The scan's inputs as its kernels read them: in `f32`, contiguous, and the layouts derived
//! from them.

use burn::tensor::{DType, Tensor, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use crate::precision::cast_to;
use crate::ssd::backend::{float, primitive, SsdPrimitives};

/// The input types, which the gradients take.
pub(super) struct InputTypes {
    pub(super) x: DType,
    pub(super) dt: DType,
    pub(super) a: DType,
    pub(super) b_mat: DType,
    pub(super) c_mat: DType,
    pub(super) initial_state: Option<DType>,
}

impl InputTypes {
    pub(super) fn of<B: burn::tensor::backend::Backend>(inputs: &SsdPrimitives<B>) -> Self {
        Self {
            x: inputs.x.dtype(),
            dt: inputs.dt.dtype(),
            a: inputs.a.dtype(),
            b_mat: inputs.b_mat.dtype(),
            c_mat: inputs.c_mat.dtype(),
            initial_state: inputs.initial_state.as_ref().map(|t| t.dtype()),
        }
    }
}

/// The inputs in `f32`, contiguous, as the kernels read them.
pub(super) struct F32Inputs<B: burn::tensor::backend::Backend> {
    pub(super) x: Tensor<B, 4>,
    pub(super) dt: Tensor<B, 3>,
    pub(super) a: Tensor<B, 1>,
    pub(super) b_mat: Tensor<B, 4>,
    pub(super) c_mat: Tensor<B, 4>,
    pub(super) initial: Option<Tensor<B, 4>>,
    pub(super) starts: Option<Tensor<B, 2>>,
    pub(super) chunk_size: usize,
}

impl<R, F, I, BT> F32Inputs<CubeBackend<R, F, I, BT>>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    pub(super) fn new(inputs: SsdPrimitives<CubeBackend<R, F, I, BT>>) -> Self {
        Self {
            x: contiguous_f32(float(inputs.x)),
            dt: contiguous_f32(float(inputs.dt)),
            a: contiguous_f32(float(inputs.a)),
            b_mat: contiguous_f32(float(inputs.b_mat)),
            c_mat: contiguous_f32(float(inputs.c_mat)),
            initial: inputs.initial_state.map(|t| contiguous_f32(float(t))),
            starts: inputs.starts.map(|t| contiguous_f32(float(t))),
            chunk_size: inputs.chunk_size,
        }
    }
}

/// `t` in `f32` with a contiguous layout.
pub(super) fn contiguous_f32<R, F, I, BT, const D: usize>(
    t: Tensor<CubeBackend<R, F, I, BT>, D>,
) -> Tensor<CubeBackend<R, F, I, BT>, D>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    float(contiguous(cast_to(t, DType::F32)))
}

/// A tensor's primitive with a contiguous layout (a copy only where it is a view).
pub(super) fn contiguous<R, F, I, BT, const D: usize>(
    t: Tensor<CubeBackend<R, F, I, BT>, D>,
) -> CubeTensor<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    into_contiguous(primitive(t))
}
