//! The scan's inputs as its kernels read them: contiguous, the products' operands (`x`, `B`,
//! `C`) in the model's type, the rest in `f32`.

use burn::tensor::{DType, Tensor, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use crate::precision::cast_to;
use crate::ssd::backend::SsdPrimitives;
use crate::ssd::fused::ScanProducts;
use crate::ssd::primitive::{float, primitive};

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
            b_mat: inputs.b.dtype(),
            c_mat: inputs.c.dtype(),
            initial_state: inputs.initial_state.as_ref().map(|t| t.dtype()),
        }
    }
}

/// The inputs as the kernels read them, contiguous: `x`, `B` and `C` in the operand type of the
/// products, `dt`, `A`, the initial state and the starts in `f32`.
pub(super) struct Inputs<B: burn::tensor::backend::Backend> {
    pub(super) x: Tensor<B, 4>,
    pub(super) dt: Tensor<B, 3>,
    pub(super) a: Tensor<B, 1>,
    pub(super) b_mat: Tensor<B, 4>,
    pub(super) c_mat: Tensor<B, 4>,
    pub(super) initial: Option<Tensor<B, 4>>,
    pub(super) starts: Option<Tensor<B, 2>>,
    pub(super) chunk_size: usize,
    /// The products' operand type: `x`'s where it is `f16` or `bf16`, `f32` otherwise.
    pub(super) operand: DType,
    /// How the intra-chunk products are computed.
    pub(super) products: ScanProducts,
}

impl<R, F, I, BT> Inputs<CubeBackend<R, F, I, BT>>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    pub(super) fn new(inputs: SsdPrimitives<CubeBackend<R, F, I, BT>>) -> Self {
        let operand = operand_type(inputs.x.dtype());
        Self {
            x: contiguous_as(float(inputs.x), operand),
            dt: contiguous_as(float(inputs.dt), DType::F32),
            a: contiguous_as(float(inputs.a), DType::F32),
            b_mat: contiguous_as(float(inputs.b), operand),
            c_mat: contiguous_as(float(inputs.c), operand),
            initial: inputs
                .initial_state
                .map(|t| contiguous_as(float(t), DType::F32)),
            starts: inputs.starts.map(|t| contiguous_as(float(t), DType::F32)),
            chunk_size: inputs.chunk_size,
            operand,
            products: inputs.products,
        }
    }
}

/// The products' operand type for inputs of type `dtype`: half precision stays half (tensor
/// cores take it, and it halves the bytes of every layout), anything else is `f32`.
pub(super) fn operand_type(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 => dtype,
        _ => DType::F32,
    }
}

/// `t` in `dtype` with a contiguous layout.
pub(super) fn contiguous_as<R, F, I, BT, const D: usize>(
    t: Tensor<CubeBackend<R, F, I, BT>, D>,
    dtype: DType,
) -> Tensor<CubeBackend<R, F, I, BT>, D>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    float(contiguous(cast_to(t, dtype)))
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
