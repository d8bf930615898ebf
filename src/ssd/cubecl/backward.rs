//! The gradient of the fused scan as matrix products and a few parallel kernels, from the
//! inputs alone: the forward's decays, layouts, scores `C·Bᵀ` and states are recomputed
//! ([`super::forward::recompute`]), nothing of `b·c·h·q²` elements is kept from the forward.
//! Per chunk `j` and head, with `G[j]` the gradient of the state entering chunk `j`:
//!
//! - `D[j] = (dy·exp(cs))ᵀ · C`, the entering state's gradient through the chunk's outputs,
//!   and the adjoint recurrence `G[j] = D[j] + exp(Σ_chunk dA) · G[j+1]`, `G[c] = dS_final`
//!   ([`super::kernels::pass_adjoints`]); `G[0]` is the initial state's gradient;
//! - `dx̃ = Mᵀ · dy + to_end · (B · G[j+1]ᵀ)`, `x̃ = x·dt` (`M` the intra-chunk matrix without
//!   `dt`), then `dx = dt · dx̃` ([`super::kernels::position_grads`]);
//! - `dy · xᵀ` per head, which weighted by the decays gives the gradient of the scores `C·Bᵀ`
//!   (summed over a group's heads) and the intra-chunk pairs' part of the log-decays' gradient
//!   ([`super::kernels::pair_sums`]);
//! - `dC = (dy·exp(cs)) · S_in + d(C·Bᵀ) · B`, `dB = d(C·Bᵀ)ᵀ · C + (x·dt·to_end) · G[j+1]`,
//!   per group ([`super::kernels::unchunk_bc`]);
//! - the log-decays' gradient from the pairs that span each step ([`super::kernels::decay_scans`]),
//!   and from it those of `dt` and `A`.
//!
//! Types as in the forward: the products' operands (the layouts, `M`, the states and adjoint
//! states as operands, the scores' gradient) in the model's type, every sum in `f32`; the
//! gradients of `x`, `B` and `C` in the model's type, the others in `f32`.

use burn::tensor::Tensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::forward::{
    chunk_slots, from_entering, layouts, operand_copy, product, rank5, recompute, scores, Dims,
};
use super::inputs::Inputs;
use super::launch::{empty, empty_as, f32_type, launch, types};
use crate::precision::cast_to;
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
    let (b, l, h, g, r, p, n, q, c) = (d.b, d.l, d.h, d.g, d.r, d.p, d.n, d.q, d.c);
    let s = recompute(f, d);
    let x = primitive(f.x.clone());
    let dt = primitive(f.dt.clone());
    let dy = primitive(grad_y);

    // the intra-chunk matrix without dt, and the entering states' output without exp(cs)
    let m = scores(&s.cb, &s.decays.da, None, d);
    let y_off = from_entering::<R, F, I, BT>(&s, d);
    // dy per head, and per group times exp(cs)
    let (dyc, dye) = layouts(&dy, None, &s.decays.cs, true, d);

    // the adjoint states
    let direct = product(tensor(dye.clone()).swap_dims(3, 4), tensor(s.cc.clone()));
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
    // G[j+1] and S[j] per group, [b, c, g, r·p, n] (views), in f32 and of the operand type
    let slots = chunk_slots::<R, F, I, BT>;
    let (leaving, leaving_e) = (slots(&adjoints, 1, d), slots(&adjoints_e, 1, d));
    let (s_in, s_in_e) = (slots(&s.states, 0, d), slots(&s.states_e, 0, d));

    // the products of the gradients
    let gb = product(tensor(s.bc.clone()), leaving_e.clone().swap_dims(3, 4));
    let dx_diag = product(tensor(m).swap_dims(3, 4), tensor(dyc.clone()));
    let dyx = product(tensor(dyc), tensor(s.xc.clone()).swap_dims(3, 4));
    let v = empty(&x, [b, c, h, q, q]);
    let (cb, da) = (&s.cb, &s.decays.da);
    launch!(pair_sums, b * c * h * q; dyx, cb, da, dt, v; d.sizes(), f32_type());
    // the scores' gradient, summed over each group's heads, [b, c, g, q, q], an operand
    let grad_cb = cast_to(
        tensor(dyx)
            .reshape([b, c, g, r, q * q])
            .sum_dim(3)
            .reshape([b, c, g, q, q]),
        d.e,
    );
    let pairs = primitive(tensor(v).sum_dim(4));
    // ⟨G[j+1], S[j]⟩ per (b, j, h)
    let outside = primitive(
        (leaving.clone() * s_in.clone())
            .reshape([b, c, h, p * n])
            .sum_dim(3),
    );

    // B and C
    let grad_c1 = product(tensor(dye), s_in_e);
    let grad_c2 = product(grad_cb.clone(), tensor(s.bc));
    let grad_b1 = product(grad_cb.swap_dims(3, 4), tensor(s.cc));
    let grad_b2 = product(tensor(s.xw), leaving_e);
    let grad_b = empty_as(&x, [b, l, g, n], d.e);
    let grad_c = empty_as(&x, [b, l, g, n], d.e);
    launch!(
        unchunk_bc, b * l * g * n;
        grad_b1, grad_b2, grad_c1, grad_c2, grad_b, grad_c;
        d.sizes(), types(d.e),
    );

    // x, and the log-decays' terms at each position
    let grad_x = empty_as(&x, [b, l, h, p], d.e);
    let (u, w, xdx) = (
        empty(&x, [b, h, c * q]),
        empty(&x, [b, h, c * q]),
        empty(&x, [b, h, c * q]),
    );
    let to_end = &s.decays.to_end;
    launch!(
        position_grads, b * l * h;
        x, dt, dy, y_off, cs, to_end, dx_diag, gb, grad_x, u, w, xdx;
        d.sizes(), types(d.e),
    );

    // the log-decays, dt and A
    let grad_da = empty(&x, [b, l, h]);
    let grad_dt = empty(&x, [b, l, h]);
    let grad_a = empty(&x, [b, c, h]);
    let a = primitive(f.a.clone());
    launch!(
        decay_scans, b * h * c;
        a, dt, cs, u, w, xdx, pairs, outside, grad_da, grad_dt, grad_a;
        d.sizes(), f32_type(),
    );
    // A's gradient, Σ over rows and chunks of each chunk's part
    let grad_a = float::<CubeBackend<R, F, I, BT>, 3>(grad_a)
        .reshape([b * c, h])
        .sum_dim(0)
        .reshape([h]);
    let grad_initial = f.initial.as_ref().map(|_| float(first));
    Grads {
        x: float(grad_x),
        dt: float(grad_dt),
        a: grad_a,
        b_mat: float(grad_b),
        c_mat: float(grad_c),
        initial: grad_initial,
    }
}
