//! The forward of the fused scan as matrix products: every contraction but those of the
//! output goes through cubek's matmul (`product`: a fixed tensor-core kernel on CUDA, Burn's
//! autotune where the device has no tensor cores); custom kernels where no product fits (the
//! decays, the state passing, the layouts) and for the output, whose decay is applied inside
//! the tiles of its products. Per chunk `j` (dimension letters as in [`crate::ssd`]):
//!
//! 1. the log-decays `dA`, their inclusive sums `cs` and the decay to the chunk's end;
//! 2. the chunk layouts: `x·dt·to_end` per group, `B` and `C` (the gradient also lays out
//!    `dy·exp(cs)`): with step 1, one launch ([`kernels::chunk_prep`]);
//! 3. the scores `C·Bᵀ`, once per group (a product);
//! 4. the chunk states from zero, `(x·dt·to_end)ᵀ · B` per group (a product; the gradient's
//!    `(dy·exp(cs))ᵀ · C` in the same one, the two layouts stacked);
//! 5. the states entering each chunk ([`kernels::pass_states`]);
//! 6. the entering states' part of the output, `C·S_inᵀ` per group (a product);
//! 7. `y = M·x + exp(cs) · C·S_inᵀ` in the input's layout, `M = (C·Bᵀ) ⊙ L ⊙ dt` each head's
//!    intra-chunk matrix with `L` the decay matrix, computed tile by tile in shared memory and
//!    never stored ([`kernels::chunk_scan`], one launch); with the transient products, `M`
//!    written per head and `M·x` through the matmul, which the same launch reads
//!    ([`super::transient`]).
//!
//! Types: the products' operands (the layouts of `x`, `B`, `C` and `dy`, `M`, the states as an
//! operand) are in the model's type, `f16` or `bf16` where it is half precision, `f32`
//! otherwise; the products accumulate in `f32` and write `f32`, but for the per-head parts
//! that the tiled kernels read once (`C·S_inᵀ`, and in the gradient `B·G_outᵀ`): those are
//! transient, of the size of `x`, and in the model's type; the decays, the states and every
//! sum of the kernels are `f32`.

use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::dims::{part, rank5, rank6, Dims};
use super::inputs::Inputs;
use super::launch::{empty, empty_as, launch, types, unused, TileMode};
use super::product::product;
use super::transient::Scores;
use crate::ssd::geometry::BLOCK;
use crate::ssd::primitive::primitive;

/// The log-decays in forward time: `dA`, their inclusive sums within each chunk and the decay
/// from each position to its chunk's end, `[b, h, c·q]` each.
pub(super) struct Decays<R: CubeRuntime> {
    pub(super) da: CubeTensor<R>,
    pub(super) cs: CubeTensor<R>,
    pub(super) to_end: CubeTensor<R>,
}

/// The chunk layouts, of the operand type, each stacked with its partner in the products:
/// `x·dt·to_end` and, given the output's gradient `dy`, `dy·exp(cs)`, per group, `xw` `[1 +
/// with_dy, b, c, g, q, r·p]`; `B` and `C`, `bc` `[2, b, c, g, q, n]` ([`part`] takes one).
pub(super) struct Layouts<R: CubeRuntime> {
    pub(super) xw: CubeTensor<R>,
    pub(super) bc: CubeTensor<R>,
}

/// Steps 1 and 2 in one launch ([`kernels::chunk_prep`]).
fn prepare<R, F, I, BT>(
    f: &Inputs<CubeBackend<R, F, I, BT>>,
    grad_y: Option<&CubeTensor<R>>,
    d: Dims,
) -> (Decays<R>, Layouts<R>)
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let (x, dt, a) = (
        primitive(f.x.clone()),
        primitive(f.dt.clone()),
        primitive(f.a.clone()),
    );
    let (b_mat, c_mat) = (primitive(f.b_mat.clone()), primitive(f.c_mat.clone()));
    let has_starts = f.starts.is_some();
    let starts = f.starts.clone().map_or_else(|| unused(&dt), primitive);
    let size = [d.b, d.h, d.c * d.q];
    let (da, cs, to_end) = (empty(&dt, size), empty(&dt, size), empty(&dt, size));
    let with_dy = grad_y.is_some();
    let grad_y = grad_y.cloned().unwrap_or_else(|| unused(&x));
    let stack = 1 + usize::from(with_dy);
    let xw = empty_as(&x, [stack, d.b, d.c, d.g, d.q, d.r * d.p], d.e);
    let bc = empty_as(&x, [2, d.b, d.c, d.g, d.q, d.n], d.e);
    launch!(
        chunk_prep, tiles d.b * d.c * d.h;
        x, dt, a, starts, grad_y, b_mat, c_mat, da, cs, to_end, xw, bc;
        d.sizes(), has_starts, with_dy, types(d.e),
    );
    (Decays { da, cs, to_end }, Layouts { xw, bc })
}

/// Step 5: the states entering each chunk and the final one, `[b, c+1, h, p, n]`, from the
/// chunk states from zero `[b, c, h, p, n]` ([`kernels::pass_states`]): in `f32`; with
/// `operand`, of the operand type too (the same tensor when that is `f32`; without, the `f32`
/// tensor twice); and the final state alone `[b, h, p, n]`.
pub(super) fn pass_states<R: CubeRuntime>(
    initial: Option<CubeTensor<R>>,
    cs: &CubeTensor<R>,
    chunk_states: CubeTensor<R>,
    operand: bool,
    d: Dims,
) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
    let states = empty(cs, [d.b, d.c + 1, d.h, d.p, d.n]);
    // a second copy in the operand type where that is not f32 (else the f32 states serve)
    let with_e = operand && d.e != DType::F32;
    let states_e = if with_e {
        empty_as(cs, [d.b, d.c + 1, d.h, d.p, d.n], d.e)
    } else {
        unused(cs)
    };
    let last = empty(cs, [d.b, d.h, d.p, d.n]);
    let has_initial = initial.is_some();
    let initial = initial.unwrap_or_else(|| unused(cs));
    launch!(
        pass_states, d.b * d.h * d.p * d.n;
        initial, cs, chunk_states, states, states_e, last;
        d.sizes(), has_initial, with_e, types(d.e),
    );
    (states.clone(), if with_e { states_e } else { states }, last)
}

/// What the backward recomputes of the forward: the decays, the chunk layouts, the scores
/// `C·Bᵀ` `[b, c, g, q, q]` and the states `[b, c+1, h, p, n]` (in `f32`, and in the forward of
/// the operand type); given `dy`, the entering states' gradients through the chunks' outputs, `(dy·
/// exp(cs))ᵀ · C` `[b, c, g, r·p, n]`.
pub(super) struct Recomputed<R: CubeRuntime> {
    pub(super) decays: Decays<R>,
    pub(super) layouts: Layouts<R>,
    pub(super) cb: CubeTensor<R>,
    pub(super) direct: Option<CubeTensor<R>>,
    pub(super) states: CubeTensor<R>,
    pub(super) states_e: CubeTensor<R>,
    /// the final state `[b, h, p, n]`
    pub(super) last: CubeTensor<R>,
}

/// Steps 1 to 5; given the output's gradient `dy`, its layout in the same launch as the
/// others.
pub(super) fn recompute<R, F, I, BT>(
    f: &Inputs<CubeBackend<R, F, I, BT>>,
    d: Dims,
    grad_y: Option<&CubeTensor<R>>,
) -> Recomputed<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let (decays, layouts) = prepare(f, grad_y, d);
    let (xw, bc) = (&layouts.xw, &layouts.bc);
    let (b_part, c_part) = (part::<R, F, I, BT>(bc, 0), part::<R, F, I, BT>(bc, 1));
    // step 3: C·Bᵀ once per group
    let cb = product(c_part, b_part.swap_dims(3, 4), DType::F32);
    // step 4: the chunk states from zero, [b, c, g, r·p, n] = [b, c, h, p, n], and with dy
    // the entering states' gradients (dy·exp(cs))ᵀ·C: [xw; dyw]ᵀ · [B; C], one product
    let stack = xw.meta.shape()[0];
    let sums = product(
        rank6::<R, F, I, BT>(xw.clone()).swap_dims(4, 5),
        rank6::<R, F, I, BT>(bc.clone()).narrow(0, 0, stack),
        DType::F32,
    );
    let chunk_states = primitive(part::<R, F, I, BT>(&sums, 0));
    let direct = (stack > 1).then(|| primitive(part::<R, F, I, BT>(&sums, 1)));
    // the states as an operand: of the forward's C·S_inᵀ (the gradient's products take
    // them from the adjoint recurrence)
    let (states, states_e, last) = pass_states(
        f.initial.clone().map(primitive),
        &decays.cs,
        chunk_states,
        grad_y.is_none(),
        d,
    );
    Recomputed {
        decays,
        layouts,
        cb,
        direct,
        states,
        states_e,
        last,
    }
}

/// Step 6: the entering states' part of the output, `C·S_inᵀ` per group `[b, c, g, q, r·p]`,
/// of the operand type: the states' slots `0..c` per group `[b, c, g, r·p, n]` are a view
/// (reshaped while contiguous, then narrowed: no copy).
fn entering_part<R, F, I, BT>(s: &Recomputed<R>, d: Dims) -> CubeTensor<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let s_in = rank5::<R, F, I, BT>(s.states_e.clone())
        .reshape([d.b, d.c + 1, d.g, d.r * d.p, d.n])
        .narrow(1, 0, d.c);
    let c_part = part::<R, F, I, BT>(&s.layouts.bc, 1);
    product(c_part, s_in.swap_dims(3, 4), d.e)
}

/// The chunked SSD's forward: `y` `[b, l, h, p]` of the operand type, and the final state
/// `[b, h, p, n]` in `f32`.
pub(super) fn forward<R, F, I, BT>(
    f: &Inputs<CubeBackend<R, F, I, BT>>,
) -> (CubeTensor<R>, CubeTensor<R>)
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let d = Dims::of(f);
    let s = recompute(f, d, None);
    let (x, dt) = (primitive(f.x.clone()), primitive(f.dt.clone()));
    // step 6
    let entering = entering_part::<R, F, I, BT>(&s, d);
    // step 7 (the intra-chunk products in the kernel, or read from the matmul's)
    let mode = TileMode::of(&x, f.products, d.e);
    let intra = if mode.transient {
        let scores = Scores {
            cb: &s.cb,
            da: &s.decays.da,
        };
        super::transient::output::<R, F, I, BT>(&x, &dt, &scores, d)
    } else {
        unused(&x)
    };
    let y = empty_as(&x, [d.b, d.l, d.h, d.p], d.e);
    let (cb, da, cs) = (&s.cb, &s.decays.da, &s.decays.cs);
    let blocks = d.b * d.c * d.h * d.q.div_ceil(BLOCK) * d.p.div_ceil(BLOCK);
    launch!(
        chunk_scan, blocks blocks;
        x, dt, cb, entering, da, cs, intra, y;
        d.sizes(), mode.transient, mode.fragments, mode.cmma, types(d.e),
    );
    (y, s.last)
}
