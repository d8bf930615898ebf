//! The gradient of the fused scan as matrix products and parallel kernels, from the inputs
//! alone: the forward's decays, layouts, scores `C·Bᵀ` and states are recomputed
//! ([`super::forward::recompute`]), nothing of `b·c·h·q²` elements is kept from the forward or
//! made here. Per chunk `j` and head, with `G[j]` the gradient of the state entering chunk `j`:
//!
//! - `D[j] = (dy·exp(cs))ᵀ · C`, the entering state's gradient through the chunk's outputs
//!   (in the product of the recomputed chunk states), and the adjoint recurrence `G[j] = D[j] +
//!   exp(Σ_chunk dA) · G[j+1]`, `G[c] = dS_final` ([`super::kernels::pass_adjoints`], which
//!   also lays out `G[j+1]` and `S[j]` as the products' operands, stacked); `G[0]` is the
//!   initial state's gradient;
//! - the per-head parts `B · G[j+1]ᵀ` and `C · S[j]ᵀ` per group (one product, stacked);
//! - `dx̃ = Mᵀ · dy + to_end · (B · G[j+1]ᵀ)`, `x̃ = x·dt` (`M` the intra-chunk matrix without
//!   `dt`, computed tile by tile and never stored), then `dx = dt · dx̃`, with the log-decays'
//!   terms at each position and `⟨G[j+1], S[j]⟩` ([`super::kernels::chunk_scan_grads`], one
//!   launch);
//! - `(dy · xᵀ) ⊙ L ⊙ dt` per head, tile by tile: summed over a group's heads, the gradient of
//!   the scores `C·Bᵀ`; times the scores, the pairs within the chunk that span each step
//!   ([`super::kernels::score_grads`], one launch);
//! - `dC = (dy·exp(cs)) · S_in + d(C·Bᵀ) · B`, `dB = d(C·Bᵀ)ᵀ · C + (x·dt·to_end) · G[j+1]`,
//!   per group (three products: the terms of `S_in` and `G[j+1]` stacked in one), then in their
//!   input layout ([`super::kernels::unchunk`], which also sums
//!   `A`'s gradient);
//! - the log-decays' gradient from the pairs that span each step ([`super::kernels::decay_scans`]),
//!   and from it those of `dt` and of `A` (per chunk).
//!
//! With the transient products, `Mᵀ · dy` and `dy · xᵀ` per head come from the matmul on
//! matrices written for the call ([`super::transient`]), and the two tiled kernels read them.
//!
//! Types as in the forward: the products' operands (the layouts, the states and adjoint states
//! as operands, the scores' gradient) in the model's type, every sum in `f32`; the
//! gradients of `x`, `B` and `C` in the model's type, the others in `f32`.

use burn::tensor::{DType, Tensor};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::dims::{part, rank5, rank6, Dims};
use super::forward::recompute;
use super::inputs::Inputs;
use super::launch::{empty, empty_as, f32_type, launch, types, unused, TileMode};
use super::product::product;
use super::transient::Scores;
use crate::ssd::geometry::{BLOCK, SPAN_WIDTH};
use crate::ssd::primitive::{float, primitive};

/// The gradients of the scan's inputs: those of `x`, `B` and `C` of the operand type, the
/// others in `f32`.
pub(super) struct Grads<B: burn::tensor::backend::Backend> {
    pub(super) x: Tensor<B, 4>,
    pub(super) dt: Tensor<B, 3>,
    pub(super) a: Tensor<B, 1>,
    pub(super) b_mat: Tensor<B, 4>,
    pub(super) c_mat: Tensor<B, 4>,
    pub(super) initial: Option<Tensor<B, 4>>,
}

/// The gradients of `f`'s inputs from those of `y` `[b, l, h, p]` (of the operand type) and of
/// the final state `[b, h, p, n]` (`f32`), both contiguous.
pub(super) fn backward<R, F, I, BT>(
    f: &Inputs<CubeBackend<R, F, I, BT>>,
    grad_y: Tensor<CubeBackend<R, F, I, BT>, 4>,
    grad_state: Tensor<CubeBackend<R, F, I, BT>, 4>,
) -> Grads<CubeBackend<R, F, I, BT>>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let d = Dims::of(f);
    let (b, l, h, g, r, p, n, q, c) = (d.b, d.l, d.h, d.g, d.r, d.p, d.n, d.q, d.c);
    let x = primitive(f.x.clone());
    let dt = primitive(f.dt.clone());
    let dy = primitive(grad_y);
    let s = recompute(f, d, Some(&dy));
    let layouts = &s.layouts;
    let part = |stacked: &CubeTensor<R>, which| part::<R, F, I, BT>(stacked, which);

    // the adjoint states, and the products' operands G[j+1] and S[j] per group
    let direct = s.direct.clone().expect("the entering states' gradients");
    let adjoints = empty(&x, [b, c + 1, h, p, n]);
    let operands = empty_as(&x, [2, b, c, g, r * p, n], d.e);
    let first = empty(&x, [b, h, p, n]);
    let grad_state = primitive(grad_state);
    let cs = s.decays.cs.clone();
    let states = &s.states;
    launch!(
        pass_adjoints, b * h * p * n;
        grad_state, cs, direct, states, adjoints, operands, first;
        d.sizes(), types(d.e),
    );
    let stacked = |t: &CubeTensor<R>| rank6::<R, F, I, BT>(t.clone());
    // the per-head parts [B; C] · [G[j+1]; S[j]]ᵀ per group, [2, b, c, g, q, r·p]: B·G[j+1]ᵀ
    // and C·S[j]ᵀ
    let parts = product(
        stacked(&layouts.bc),
        stacked(&operands).swap_dims(4, 5),
        d.e,
    );
    let (leaving, entering) = (primitive(part(&parts, 0)), primitive(part(&parts, 1)));

    // the intra-chunk products in the kernels, or read from the matmul's
    let mode = TileMode::of(&x, f.products, d.e);
    let (intra, dyx) = if mode.transient {
        let scores = Scores {
            cb: &s.cb,
            da: &s.decays.da,
        };
        super::transient::gradient::<R, F, I, BT>(&x, &dt, &dy, &scores, d)
    } else {
        (unused(&x), unused(&x))
    };

    // x, and the log-decays' terms at each position
    let grad_x = empty_as(&x, [b, l, h, p], d.e);
    let terms = empty(&x, [3, b, h, c * q, p.div_ceil(BLOCK)]);
    let outside = empty(&x, [b, c, h, p.div_ceil(BLOCK)]);
    let (da, to_end) = (&s.decays.da, &s.decays.to_end);
    let cb = &s.cb;
    launch!(
        chunk_scan_grads, blocks b * c * h * q.div_ceil(BLOCK) * p.div_ceil(BLOCK);
        x, dt, dy, cb, da, cs, to_end, entering, leaving, states, adjoints, intra, grad_x, terms,
        outside;
        d.sizes(), mode.transient, mode.fragments, mode.cmma, types(d.e),
    );

    // the scores' gradient (an operand), and the pairs within each chunk
    let grad_cb = empty_as(&x, [b, c, g, q, q], d.e);
    let rows = q.div_ceil(BLOCK);
    let spans = empty(&x, [b, c, h, rows * (rows + 1) / 2, SPAN_WIDTH]);
    launch!(
        score_grads, blocks b * c * g * rows * rows;
        x, dt, dy, cb, da, dyx, grad_cb, spans;
        d.sizes(), mode.transient, mode.fragments, mode.cmma, types(d.e),
    );

    // B and C
    let grad_cb = rank5::<R, F, I, BT>(grad_cb);
    // [x·dt·to_end; dy·exp(cs)] · [G[j+1]; S[j]], [2, b, c, g, q, n]: dB's second term and
    // dC's first
    let terms_bc = product(stacked(&layouts.xw), stacked(&operands), DType::F32);
    let (grad_b2, grad_c1) = (primitive(part(&terms_bc, 0)), primitive(part(&terms_bc, 1)));
    let grad_c2 = product(grad_cb.clone(), part(&layouts.bc, 0), DType::F32);
    let grad_b1 = product(grad_cb.swap_dims(3, 4), part(&layouts.bc, 1), DType::F32);
    // the log-decays, dt and A's parts per chunk
    let grad_da = empty(&x, [b, l, h]);
    let grad_dt = empty(&x, [b, l, h]);
    let parts_a = empty(&x, [b, c, h]);
    let a = primitive(f.a.clone());
    launch!(
        decay_scans, tiles b * h * c;
        a, dt, cs, terms, spans, outside, grad_da, grad_dt, parts_a;
        d.sizes(), f32_type(),
    );

    // B and C in their layout, A
    let grad_b = empty_as(&x, [b, l, g, n], d.e);
    let grad_c = empty_as(&x, [b, l, g, n], d.e);
    let grad_a = empty(&x, [h]);
    launch!(
        unchunk, (b * l * g * n).max(h);
        grad_b1, grad_b2, grad_c1, grad_c2, parts_a, grad_b, grad_c, grad_a;
        d.sizes(), types(d.e),
    );
    let grad_initial = f.initial.as_ref().map(|_| float(first));
    Grads {
        x: float(grad_x),
        dt: float(grad_dt),
        a: float(grad_a),
        b_mat: float(grad_b),
        c_mat: float(grad_c),
        initial: grad_initial,
    }
}
