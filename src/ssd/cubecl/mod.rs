//! The fused SSD on CubeCL backends: [`SsdBackend`] for `CubeBackend` and for `Fusion<B>` (a
//! custom operation of the fusion stream that runs `B`'s kernels).
//!
//! The forward ([`forward`]) and the gradient ([`backward`]) are matrix products through
//! Burn's matmul (the scores `C·Bᵀ` once per group, the chunk states, the entering states'
//! part of the output; in the gradient also the per-head parts and the terms of `B`'s and
//! `C`'s gradients) and a few kernels ([`kernels`]) where no product fits: the decays, the
//! state passing, and the intra-chunk products, tiled kernels that apply the decay inside
//! their tiles so that no per-head `q × q` matrix reaches memory. The gradient recomputes what
//! it needs of the forward from the inputs: nothing of the forward is kept but its inputs.
//! With [`ScanProducts::Transient`](crate::ssd::ScanProducts::Transient) the intra-chunk
//! products go through the matmul instead, on each head's matrices written for the call
//! ([`transient`]).

mod backward;
mod dims;
mod forward;
mod fusion;
mod inputs;
mod kernels;
mod launch;
mod product;
#[cfg(all(test, feature = "ndarray", any(feature = "wgpu", feature = "cuda")))]
mod tests;
mod transient;

use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, TensorMetadata};
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use crate::precision::cast_to;
use crate::ssd::backend::{tensor_ops, SsdBackend, SsdGrads, SsdPrimitives};
use crate::ssd::fused::FusedKernels;
use crate::ssd::geometry::TILE;
use crate::ssd::primitive::{float, primitive};
use crate::ssd::projection::ProjectionBackend;
use inputs::{contiguous_as, InputTypes, Inputs};

/// The longest chunk the fused scan takes (the longest it is tested with, and the reference
/// kernels' default); longer chunks run the tensor operations.
pub(crate) const FUSED_MAX_CHUNK: usize = 256;
// `kernels::chunk_prep` runs a thread per position of a chunk in one cube of `TILE²` threads
const _: () = assert!(FUSED_MAX_CHUNK <= TILE * TILE);

/// Whether the fused scan was measured at least as fast as the tensor operations on runtime
/// `R` for inputs of type `dtype`, training and forward (`docs/fused-scan.md`, "Default path"):
/// on Wgpu in `f32` and `f16`, measured on Mesa's lavapipe (`bench --device wgpu --ssd fused`
/// against `--ssd tensor-ops`, alternating; lavapipe has no `bf16`). Not yet on Cuda or any
/// other runtime: no GPU has run it (`scripts/cuda-check.sh` measures both).
fn measured<R: CubeRuntime>(dtype: DType) -> bool {
    is_wgpu::<R>() && matches!(dtype, DType::F32 | DType::F16)
}

/// Whether `R` is Wgpu's runtime (known with the `wgpu` feature; without it, `false`).
#[cfg_attr(not(feature = "wgpu"), allow(clippy::extra_unused_type_parameters))]
fn is_wgpu<R: CubeRuntime>() -> bool {
    #[cfg(feature = "wgpu")]
    {
        std::any::TypeId::of::<R>() == std::any::TypeId::of::<burn::backend::wgpu::WgpuRuntime>()
    }
    #[cfg(not(feature = "wgpu"))]
    false
}

/// The projections on Burn's own `linear` (its matmul and fusion serve them).
impl<R, F, I, BT> ProjectionBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
}

impl<R, F, I, BT> SsdBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn ssd_chunked(inputs: SsdPrimitives<Self>) -> (FloatTensor<Self>, FloatTensor<Self>) {
        if !Self::has_fused_ssd(inputs.x.dtype(), inputs.chunk_size, inputs.kernels) {
            return tensor_ops(inputs);
        }
        let out_dtype = inputs.x.dtype();
        let f = Inputs::<Self>::new(inputs);
        let (y, last) = forward::forward(&f);
        (primitive(cast_to(float::<Self, 4>(y), out_dtype)), last)
    }

    fn has_fused_ssd(dtype: DType, chunk_size: usize, kernels: FusedKernels) -> bool {
        matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
            && chunk_size <= FUSED_MAX_CHUNK
            && kernels.runs(measured::<R>(dtype))
    }

    fn ssd_chunked_backward(
        inputs: SsdPrimitives<Self>,
        grad_y: FloatTensor<Self>,
        grad_state: FloatTensor<Self>,
    ) -> SsdGrads<Self> {
        let dtypes = InputTypes::of(&inputs);
        let f = Inputs::<Self>::new(inputs);
        let grad_y = contiguous_as(float::<Self, 4>(grad_y), f.operand);
        let grad_state = contiguous_as(float::<Self, 4>(grad_state), DType::F32);
        let g = backward::backward(&f, grad_y, grad_state);
        SsdGrads {
            x: primitive(cast_to(g.x, dtypes.x)),
            dt: primitive(cast_to(g.dt, dtypes.dt)),
            a: primitive(cast_to(g.a, dtypes.a)),
            b: primitive(cast_to(g.b_mat, dtypes.b_mat)),
            c: primitive(cast_to(g.c_mat, dtypes.c_mat)),
            initial_state: g
                .initial
                .zip(dtypes.initial_state)
                .map(|(t, dtype)| primitive(cast_to(t, dtype))),
        }
    }
}
