//! The gradient of the fused scan as matrix products and parallel kernels, from the inputs
//! alone: the forward's decays, layouts, scores `C·Bᵀ` and states are recomputed
//! ([`super::forward::recompute`]), nothing of `b·c·h·q²` elements is kept from the forward or
//! made here. Per chunk `j` and head, with `G[j]` the gradient of the state entering chunk `j`:
//!
//! - `D[j] = (dy·exp(cs))ᵀ · C`, the entering state's gradient through the chunk's outputs,
//!   and the adjoint recurrence `G[j] = D[j] + exp(Σ_chunk dA) · G[j+1]`, `G[c] = dS_final`
//!   ([`super::kernels::pass_adjoints`]); `G[0]` is the initial state's gradient;
//! - `dx̃ = Mᵀ · dy + to_end · (B · G[j+1]ᵀ)`, `x̃ = x·dt` (`M` the intra-chunk matrix without
//!   `dt`, computed tile by tile and never stored), then `dx = dt · dx̃`, with the log-decays'
//!   terms at each position and `⟨G[j+1], S[j]⟩` ([`super::kernels::chunk_scan_grads`], one
//!   launch);
//! - `(dy · xᵀ) ⊙ L ⊙ dt` per head, tile by tile: summed over a group's heads, the gradient of
//!   the scores `C·Bᵀ`; times the scores, the pairs within the chunk that span each step
//!   ([`super::kernels::score_grads`], one launch);
//! - `dC = (dy·exp(cs)) · S_in + d(C·Bᵀ) · B`, `dB = d(C·Bᵀ)ᵀ · C + (x·dt·to_end) · G[j+1]`,
//!   per group, then in their input layout ([`super::kernels::unchunk`], which also sums
//!   `A`'s gradient);
//! - the log-decays' gradient from the pairs that span each step ([`super::kernels::decay_scans`]),
//!   and from it those of `dt` and of `A` (per chunk).
//!
//! Types as in the forward: the products' operands (the layouts, the states and adjoint states
//! as operands, the scores' gradient) in the model's type, every sum in `f32`; the
//! gradients of `x`, `B` and `C` in the model's type, the others in `f32`.

use burn::tensor::Tensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::forward::{chunk_slots, operand_copy, product, rank5, recompute, Dims};
use super::inputs::Inputs;
use super::kernels::{BLOCK, SPAN_WIDTH};
use super::launch::{empty, empty_as, f32_type, launch, types};
use crate::ssd::backend::{float, primitive};

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
    let tensor = rank5::<R, F, I, BT>;
    let d = Dims::of(f);
    let (b, l, h, g, p, n, q, c) = (d.b, d.l, d.h, d.g, d.p, d.n, d.q, d.c);
    let x = primitive(f.x.clone());
    let dt = primitive(f.dt.clone());
    let dy = primitive(grad_y);
    let s = recompute(f, d, Some(&dy));
    let layouts = &s.layouts;
    // dy·exp(cs) per group
    let dyw = layouts.dyw.clone().expect("dy's layout");

    // the adjoint states
    let direct = product(
        tensor(dyw.clone()).swap_dims(3, 4),
        tensor(layouts.cc.clone()),
    );
    let adjoints = empty(&x, [b, c + 1, h, p, n]);
    let (with_e, adjoints_e) = operand_copy(&adjoints, d);
    let first = empty(&x, [b, h, p, n]);
    let grad_state = primitive(grad_state);
    let cs = s.decays.cs.clone();
    launch!(
        pass_adjoints, b * h * p * n;
        grad_state, cs, direct, adjoints, adjoints_e, first;
        d.sizes(), with_e, types(d.e),
    );
    let adjoints_e = if with_e { adjoints_e } else { adjoints.clone() };
    // G[j+1] and S[j] per group, [b, c, g, r·p, n] (views) of the operand type
    let leaving_e = chunk_slots::<R, F, I, BT>(&adjoints_e, 1, d);
    let s_in_e = chunk_slots::<R, F, I, BT>(&s.states_e, 0, d);

    // x, and the log-decays' terms at each position
    let grad_x = empty_as(&x, [b, l, h, p], d.e);
    let terms = empty(&x, [3, b, h, c * q, p.div_ceil(BLOCK)]);
    let outside = empty(&x, [b, c, h, p.div_ceil(BLOCK)]);
    let (b_mat, c_mat) = (primitive(f.b_mat.clone()), primitive(f.c_mat.clone()));
    let (states, adjoints_f32) = (&s.states, &adjoints);
    let (da, to_end) = (&s.decays.da, &s.decays.to_end);
    let cb = &s.cb;
    launch!(
        chunk_scan_grads, blocks b * c * h * q.div_ceil(BLOCK) * p.div_ceil(BLOCK);
        x, dt, dy, b_mat, c_mat, cb, da, cs, to_end, states, adjoints_f32, grad_x, terms, outside;
        d.sizes(), types(d.e),
    );

    // the scores' gradient (an operand), and the pairs within each chunk
    let grad_cb = empty_as(&x, [b, c, g, q, q], d.e);
    let rows = q.div_ceil(BLOCK);
    let spans = empty(&x, [b, c, h, rows * (rows + 1) / 2, SPAN_WIDTH]);
    launch!(
        score_grads, blocks b * c * g * rows * rows;
        x, dt, dy, cb, da, grad_cb, spans;
        d.sizes(), types(d.e),
    );

    // B and C
    let grad_cb = tensor(grad_cb);
    let grad_c1 = product(tensor(dyw), s_in_e);
    let grad_c2 = product(grad_cb.clone(), tensor(layouts.bc.clone()));
    let grad_b1 = product(grad_cb.swap_dims(3, 4), tensor(layouts.cc.clone()));
    let grad_b2 = product(tensor(layouts.xw.clone()), leaving_e);
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
