//! The sizes of one scan and the views of its stacked layouts that the products take, shared
//! by the forward, the gradient and the transient products.

use burn::tensor::{DType, Tensor};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::inputs::Inputs;
use super::kernels;
use crate::ssd::primitive::float;

/// The sizes of one scan: batch `b`, length `l`, heads `h`, groups `g` (`r = h / g` heads
/// each), head dimension `p`, state dimension `n`, chunk length `q` and chunks `c = ⌈l / q⌉`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Dims {
    pub(super) b: usize,
    pub(super) l: usize,
    pub(super) h: usize,
    pub(super) g: usize,
    pub(super) r: usize,
    pub(super) p: usize,
    pub(super) n: usize,
    pub(super) q: usize,
    pub(super) c: usize,
    /// The products' operand type.
    pub(super) e: DType,
}

impl Dims {
    pub(super) fn of<B: burn::tensor::backend::Backend>(f: &Inputs<B>) -> Self {
        let [b, l, h, p] = f.x.dims();
        let [_, _, g, n] = f.b_mat.dims();
        let q = f.chunk_size;
        Self {
            b,
            l,
            h,
            g,
            r: h / g,
            p,
            n,
            q,
            c: l.div_ceil(q),
            e: f.operand,
        }
    }

    /// The sizes as the kernels take them.
    pub(super) fn sizes<R: CubeRuntime>(&self) -> kernels::SizesLaunch<R> {
        kernels::SizesLaunch::new(
            self.b, self.l, self.h, self.g, self.p, self.n, self.c, self.q,
        )
    }
}

/// A `[.., ..]` tensor of rank 5 of the `CubeBackend`, for the products.
pub(super) fn rank5<R, F, I, BT>(t: CubeTensor<R>) -> Tensor<CubeBackend<R, F, I, BT>, 5>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    float::<CubeBackend<R, F, I, BT>, 5>(t)
}

/// A stacked `[k, ..]` tensor of rank 6 of the `CubeBackend`, for the stacked products.
pub(super) fn rank6<R, F, I, BT>(t: CubeTensor<R>) -> Tensor<CubeBackend<R, F, I, BT>, 6>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    float::<CubeBackend<R, F, I, BT>, 6>(t)
}

/// Part `which` of a stacked `[k, b, c, g, q, w]` tensor, `[b, c, g, q, w]`: a view (narrowed
/// along the stack, then reshaped while contiguous; a copy only where the part's offset breaks
/// the device's alignment).
pub(super) fn part<R, F, I, BT>(
    stacked: &CubeTensor<R>,
    which: usize,
) -> Tensor<CubeBackend<R, F, I, BT>, 5>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let t = rank6::<R, F, I, BT>(stacked.clone());
    let [_, b, c, g, q, w] = t.dims();
    t.narrow(0, which, 1).reshape([b, c, g, q, w])
}
