//! The transient variant of the scan's intra-chunk products ([`ScanProducts::Transient`]): each
//! head's `q × q` matrices written to memory and multiplied through the matmul, in place of the
//! tiled kernels' decay-weighted tile products. The tiled kernels then read the products and do
//! the rest as in the other variant. What is written here lives until the call returns.
//!
//! [`ScanProducts::Transient`]: crate::ssd::ScanProducts::Transient

use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeRuntime, FloatElement, IntElement};

use super::dims::{rank5, Dims};
use super::launch::{empty_as, launch, types};
use super::product::product;
use crate::ssd::geometry::BLOCK;

/// The forward's decay inputs of the intra-chunk matrix: the scores `C·Bᵀ` `[b, c, g, q, q]`
/// and the log-decays `dA` `[b, h, c·q]`.
pub(super) struct Scores<'a, R: CubeRuntime> {
    pub(super) cb: &'a CubeTensor<R>,
    pub(super) da: &'a CubeTensor<R>,
}

/// Each head's intra-chunk matrix `M` `[b, c, h, q, q]` in the operand type, with `dt` folded
/// into its columns where `with_dt` ([`super::kernels::intra_weights`]).
fn weights<R: CubeRuntime>(
    dt: &CubeTensor<R>,
    s: &Scores<'_, R>,
    d: Dims,
    with_dt: bool,
) -> CubeTensor<R> {
    let (cb, da) = (s.cb, s.da);
    let weights = empty_as(dt, [d.b, d.c, d.h, d.q, d.q], d.e);
    let tiles = d.q.div_ceil(BLOCK);
    launch!(
        intra_weights, blocks d.b * d.c * d.h * tiles * tiles;
        dt, cb, da, weights;
        d.sizes(), with_dt, types(d.e),
    );
    weights
}

/// `t` `[b, l, h, p]` in the chunk layout `[b, c, h, q, p]`, zero-padded
/// ([`super::kernels::chunk_rows`]).
fn chunk_rows<R: CubeRuntime>(t: &CubeTensor<R>, d: Dims) -> CubeTensor<R> {
    let rows = empty_as(t, [d.b, d.c, d.h, d.q, d.p], d.e);
    launch!(
        chunk_rows, d.b * d.c * d.h * d.q * d.p;
        t, rows;
        d.sizes(), d.e.into(),
    );
    rows
}

/// The forward's intra-chunk part of the output, `M·x` per head `[b, c, h, q, p]` in `f32`.
pub(super) fn output<R, F, I, BT>(
    x: &CubeTensor<R>,
    dt: &CubeTensor<R>,
    s: &Scores<'_, R>,
    d: Dims,
) -> CubeTensor<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let m = rank5::<R, F, I, BT>(weights(dt, s, d, true));
    product(m, rank5::<R, F, I, BT>(chunk_rows(x, d)), DType::F32)
}

/// The gradient's intra-chunk products, per head in `f32`: `Mᵀ·dy` `[b, c, h, q, p]` (`M`
/// without `dt`) and `dy·xᵀ` `[b, c, h, q, q]`.
pub(super) fn gradient<R, F, I, BT>(
    x: &CubeTensor<R>,
    dt: &CubeTensor<R>,
    dy: &CubeTensor<R>,
    s: &Scores<'_, R>,
    d: Dims,
) -> (CubeTensor<R>, CubeTensor<R>)
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let m = rank5::<R, F, I, BT>(weights(dt, s, d, false));
    let dy = rank5::<R, F, I, BT>(chunk_rows(dy, d));
    let x = rank5::<R, F, I, BT>(chunk_rows(x, d));
    let m_dy = product(m.swap_dims(3, 4), dy.clone(), DType::F32);
    let dy_x = product(dy, x.swap_dims(3, 4), DType::F32);
    (m_dy, dy_x)
}
