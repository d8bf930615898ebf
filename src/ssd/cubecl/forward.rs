//! The forward of the fused scan as matrix products: every contraction but those of the
//! output goes through Burn's matmul on the `CubeBackend` (cubek: tensor cores on CUDA, tiled
//! register products on Vulkan); custom kernels where no product fits (the decays, the state
//! passing, the layouts) and for the output, whose decay is applied inside the tiles of its
//! products. Per chunk `j` (dimension letters as in [`crate::ssd`]):
//!
//! 1. the log-decays `dA`, their inclusive sums `cs` and the decay to the chunk's end;
//! 2. the chunk layouts: `x·dt·to_end` per group, `B` and `C` (the gradient also lays out
//!    `dy·exp(cs)`): with step 1, one launch ([`kernels::chunk_prep`]);
//! 3. the scores `C·Bᵀ`, once per group (a product);
//! 4. the chunk states from zero, `(x·dt·to_end)ᵀ · B` per group (a product);
//! 5. the states entering each chunk ([`kernels::pass_states`]);
//! 6. `y = M·x + exp(cs) · C·S_inᵀ` in the input's layout, `M = (C·Bᵀ) ⊙ L ⊙ dt` each head's
//!    intra-chunk matrix with `L` the decay matrix, computed tile by tile in shared memory and
//!    never stored ([`kernels::chunk_scan`], one launch).
//!
//! Types: the products' operands (the layouts of `x`, `B`, `C` and `dy`, `M`, the states as an
//! operand) are in the model's type, `f16` or `bf16` where it is half precision, `f32`
//! otherwise; the products accumulate and write `f32`; the decays, the states and every sum
//! of the kernels are `f32`.

use burn::tensor::{DType, Tensor};
use burn_cubecl::kernel::matmul::{matmul, MatmulStrategy};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::inputs::Inputs;
use super::kernels;
use super::launch::{empty, empty_as, launch, types, unused};
use crate::ssd::backend::{float, primitive};

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

/// The product `lhs · rhs` of two `[.., m, k]`, `[.., k, n]` tensors of the operand type through
/// Burn's matmul (autotuned; tensor cores where the device has them), accumulated and written
/// in `f32`.
pub(super) fn product<R, F, I, BT>(
    lhs: Tensor<CubeBackend<R, F, I, BT>, 5>,
    rhs: Tensor<CubeBackend<R, F, I, BT>, 5>,
) -> CubeTensor<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let (lhs_dims, rhs_dims) = (lhs.dims(), rhs.dims());
    matmul(
        primitive(lhs),
        primitive(rhs),
        None,
        MatmulStrategy::default(),
        DType::F32,
    )
    .unwrap_or_else(|e| panic!("the scan's product {lhs_dims:?} · {rhs_dims:?}: {e:?}"))
}

/// The log-decays in forward time: `dA`, their inclusive sums within each chunk and the decay
/// from each position to its chunk's end, `[b, h, c·q]` each.
pub(super) struct Decays<R: CubeRuntime> {
    pub(super) da: CubeTensor<R>,
    pub(super) cs: CubeTensor<R>,
    pub(super) to_end: CubeTensor<R>,
}

/// The chunk layouts, of the operand type: `x·dt·to_end` and, given the output's gradient
/// `dy`, `dy·exp(cs)`, per group `[b, c, g, q, r·p]`; `B` and `C` `[b, c, g, q, n]`.
pub(super) struct Layouts<R: CubeRuntime> {
    pub(super) xw: CubeTensor<R>,
    pub(super) dyw: Option<CubeTensor<R>>,
    pub(super) bc: CubeTensor<R>,
    pub(super) cc: CubeTensor<R>,
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
    let per_group = [d.b, d.c, d.g, d.q, d.r * d.p];
    let xw = empty_as(&x, per_group, d.e);
    let with_dy = grad_y.is_some();
    let (grad_y, dyw) = match grad_y {
        Some(dy) => (dy.clone(), empty_as(&x, per_group, d.e)),
        None => (unused(&x), unused(&x)),
    };
    let bc = empty_as(&x, [d.b, d.c, d.g, d.q, d.n], d.e);
    let cc = empty_as(&x, [d.b, d.c, d.g, d.q, d.n], d.e);
    launch!(
        chunk_prep, tiles d.b * d.c * d.h;
        x, dt, a, starts, grad_y, b_mat, c_mat, da, cs, to_end, xw, dyw, bc, cc;
        d.sizes(), has_starts, with_dy, types(d.e),
    );
    (
        Decays { da, cs, to_end },
        Layouts {
            xw,
            dyw: with_dy.then_some(dyw),
            bc,
            cc,
        },
    )
}

/// Step 5: the states entering each chunk and the final one, `[b, c+1, h, p, n]`, from the
/// chunk states from zero `[b, c, h, p, n]` ([`kernels::pass_states`]): in `f32`, of the
/// operand type (the same tensor when that is `f32`), and the final state alone
/// `[b, h, p, n]`.
pub(super) fn pass_states<R: CubeRuntime>(
    initial: Option<CubeTensor<R>>,
    cs: &CubeTensor<R>,
    chunk_states: CubeTensor<R>,
    d: Dims,
) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
    let states = empty(cs, [d.b, d.c + 1, d.h, d.p, d.n]);
    let (with_e, states_e) = operand_copy(&states, d);
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

/// Whether a recurrence writes its `f32` output `like` a second time in the operand type, and
/// the buffer it writes it to (a placeholder when the operand type is `f32`: the `f32` output
/// serves).
pub(super) fn operand_copy<R: CubeRuntime>(like: &CubeTensor<R>, d: Dims) -> (bool, CubeTensor<R>) {
    if d.e == DType::F32 {
        (false, unused(like))
    } else {
        (true, empty_as(like, like.meta.shape().clone(), d.e))
    }
}

/// Chunk slots `first..first + c` of a `[b, c+1, h, p, n]` recurrence, per group:
/// `[b, c, g, r·p, n]`, a view (reshaped while contiguous, then narrowed: no copy). Slot 0 on:
/// the states entering each chunk; slot 1 on: the adjoints of the states leaving them.
pub(super) fn chunk_slots<R, F, I, BT>(
    states: &CubeTensor<R>,
    first: usize,
    d: Dims,
) -> Tensor<CubeBackend<R, F, I, BT>, 5>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    rank5::<R, F, I, BT>(states.clone())
        .reshape([d.b, d.c + 1, d.g, d.r * d.p, d.n])
        .narrow(1, first, d.c)
}

/// What the backward recomputes of the forward: the decays, the chunk layouts, the scores
/// `C·Bᵀ` `[b, c, g, q, q]` and the states `[b, c+1, h, p, n]` (in `f32`, and of the operand
/// type).
pub(super) struct Recomputed<R: CubeRuntime> {
    pub(super) decays: Decays<R>,
    pub(super) layouts: Layouts<R>,
    pub(super) cb: CubeTensor<R>,
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
    let tensor = rank5::<R, F, I, BT>;
    let (decays, layouts) = prepare(f, grad_y, d);
    let (xw, bc, cc) = (&layouts.xw, &layouts.bc, &layouts.cc);
    // step 3: C·Bᵀ once per group
    let cb = product(tensor(cc.clone()), tensor(bc.clone()).swap_dims(3, 4));
    // step 4: the chunk states from zero, [b, c, g, r·p, n] = [b, c, h, p, n]
    let chunk_states = product(tensor(xw.clone()).swap_dims(3, 4), tensor(bc.clone()));
    let (states, states_e, last) = pass_states(
        f.initial.clone().map(primitive),
        &decays.cs,
        chunk_states,
        d,
    );
    Recomputed {
        decays,
        layouts,
        cb,
        states,
        states_e,
        last,
    }
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
    let (x, dt, c_mat) = (
        primitive(f.x.clone()),
        primitive(f.dt.clone()),
        primitive(f.c_mat.clone()),
    );
    // step 6
    let y = empty_as(&x, [d.b, d.l, d.h, d.p], d.e);
    let (cb, da, cs, states) = (&s.cb, &s.decays.da, &s.decays.cs, &s.states);
    let blocks = d.b * d.c * d.h * d.q.div_ceil(kernels::BLOCK) * d.p.div_ceil(kernels::BLOCK);
    launch!(
        chunk_scan, blocks blocks;
        x, dt, c_mat, cb, da, cs, states, y;
        d.sizes(), types(d.e),
    );
    (y, s.last)
}
