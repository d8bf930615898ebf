//! The gradient of the fused scan as matrix products and a few parallel kernels, from the
//! inputs alone: the forward's decays, layouts, scores `C·Bᵀ` and states are recomputed
//! ([`super::forward::recompute`]), nothing of `b·c·h·q²` elements is kept from the forward.
//! Per chunk `j` and head, with `G[j]` the gradient of the state entering chunk `j`:
//!
//! - `D[j] = (dy·exp(cs))ᵀ · C`, the entering state's gradient through the chunk's outputs,
//!   and the adjoint recurrence `G[j] = D[j] + exp(Σ_chunk dA) · G[j+1]`, `G[c] = dS_final`
//!   ([`kernels::pass_adjoints`]); `G[0]` is the initial state's gradient;
//! - `dx̃ = Mᵀ · dy + to_end · (B · G[j+1]ᵀ)`, `x̃ = x·dt` (`M` the intra-chunk matrix without
//!   `dt`), then `dx = dt · dx̃` ([`kernels::position_grads`]);
//! - `dy · xᵀ` per head, which weighted by the decays gives the gradient of the scores `C·Bᵀ`
//!   (summed over a group's heads) and the intra-chunk pairs' part of the log-decays' gradient
//!   ([`kernels::pair_sums`]);
//! - `dC = (dy·exp(cs)) · S_in + d(C·Bᵀ) · B`, `dB = d(C·Bᵀ)ᵀ · C + (x·dt·to_end) · G[j+1]`,
//!   per group ([`kernels::unchunk_bc`]);
//! - the log-decays' gradient from the pairs that span each step ([`kernels::decay_scans`]),
//!   and from it those of `dt` and `A`.

use burn::tensor::{DType, Tensor};
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::forward::{entering, from_entering, layouts, rank5, recompute, scores, Dims};
use super::inputs::F32Inputs;
use super::kernels;
use super::launch::{empty, grid};
use crate::ssd::backend::{float, primitive};

/// The gradients of the scan's inputs, in `f32`.
pub(super) struct F32Grads<B: burn::tensor::backend::Backend> {
    pub(super) x: Tensor<B, 4>,
    pub(super) dt: Tensor<B, 3>,
    pub(super) a: Tensor<B, 1>,
    pub(super) b_mat: Tensor<B, 4>,
    pub(super) c_mat: Tensor<B, 4>,
    pub(super) initial: Option<Tensor<B, 4>>,
}

/// The gradients of `f`'s inputs from those of `y` `[b, l, h, p]` and of the final state
/// `[b, h, p, n]` (both `f32`, contiguous).
pub(super) fn backward<R, F, I, BT>(
    f: &F32Inputs<CubeBackend<R, F, I, BT>>,
    grad_y: Tensor<CubeBackend<R, F, I, BT>, 4>,
    grad_state: Tensor<CubeBackend<R, F, I, BT>, 4>,
) -> F32Grads<CubeBackend<R, F, I, BT>>
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
    let client = x.client.clone();
    let dtype = DType::F32.into();

    // the intra-chunk matrix without dt, and the entering states' output without exp(cs)
    let m = scores(&s.cb, &s.decays.da, None, d);
    let y_off = from_entering::<R, F, I, BT>(&s, d);
    // dy per head, and per group times exp(cs)
    let (dyc, dye) = layouts(&dy, None, &s.decays.cs, true, d);

    // the adjoint states
    let direct = primitive(
        tensor(dye.clone())
            .swap_dims(3, 4)
            .matmul(tensor(s.cc.clone())),
    );
    let adjoints = empty(&x, [b, c + 1, h, p, n]);
    let (count, dim) = grid(&x, b * h * p * n);
    // SAFETY: every index is within its tensor: the kernels check their thread position
    // against the element count and derive each index from the shapes
    unsafe {
        kernels::pass_adjoints::launch_unchecked::<R>(
            &client,
            count,
            dim,
            primitive(grad_state).into_tensor_arg(),
            s.decays.cs.clone().into_tensor_arg(),
            direct.into_tensor_arg(),
            adjoints.clone().into_tensor_arg(),
            d.sizes(),
            dtype,
        );
    }
    // G[j+1] per group, [b, c, g, r·p, n] (a view)
    let leaving = tensor(adjoints.clone())
        .reshape([b, c + 1, g, r * p, n])
        .narrow(1, 1, c);
    let s_in = entering::<R, F, I, BT>(&s.states, d);

    // the products of the gradients
    let gb = primitive(tensor(s.bc.clone()).matmul(leaving.clone().swap_dims(3, 4)));
    let dx_diag = primitive(tensor(m).swap_dims(3, 4).matmul(tensor(dyc.clone())));
    let dyx = primitive(tensor(dyc).matmul(tensor(s.xc.clone()).swap_dims(3, 4)));
    let v = empty(&x, [b, c, h, q, q]);
    let (count, dim) = grid(&x, b * c * h * q);
    // SAFETY: as above
    unsafe {
        kernels::pair_sums::launch_unchecked::<R>(
            &client,
            count,
            dim,
            dyx.clone().into_tensor_arg(),
            s.cb.clone().into_tensor_arg(),
            s.decays.da.clone().into_tensor_arg(),
            dt.clone().into_tensor_arg(),
            v.clone().into_tensor_arg(),
            d.sizes(),
            dtype,
        );
    }
    // the scores' gradient, summed over each group's heads, [b, c, g, q, q]
    let grad_cb = tensor(dyx)
        .reshape([b, c, g, r, q * q])
        .sum_dim(3)
        .reshape([b, c, g, q, q]);
    let pairs = primitive(tensor(v).sum_dim(4));
    // ⟨G[j+1], S[j]⟩ per (b, j, h)
    let outside = primitive(
        (leaving.clone() * s_in.clone())
            .reshape([b, c, h, p * n])
            .sum_dim(3),
    );

    // B and C
    let grad_c1 = primitive(tensor(dye).matmul(s_in));
    let grad_c2 = primitive(grad_cb.clone().matmul(tensor(s.bc)));
    let grad_b1 = primitive(grad_cb.swap_dims(3, 4).matmul(tensor(s.cc)));
    let grad_b2 = primitive(tensor(s.xw).matmul(leaving));
    let grad_b = empty(&x, [b, l, g, n]);
    let grad_c = empty(&x, [b, l, g, n]);
    let (count, dim) = grid(&x, b * l * g * n);
    // SAFETY: as above
    unsafe {
        kernels::unchunk_bc::launch_unchecked::<R>(
            &client,
            count,
            dim,
            grad_b1.into_tensor_arg(),
            grad_b2.into_tensor_arg(),
            grad_c1.into_tensor_arg(),
            grad_c2.into_tensor_arg(),
            grad_b.clone().into_tensor_arg(),
            grad_c.clone().into_tensor_arg(),
            d.sizes(),
            dtype,
        );
    }

    // x, and the log-decays' terms at each position
    let grad_x = empty(&x, [b, l, h, p]);
    let (u, w, xdx) = (
        empty(&x, [b, h, c * q]),
        empty(&x, [b, h, c * q]),
        empty(&x, [b, h, c * q]),
    );
    let (count, dim) = grid(&x, b * l * h);
    // SAFETY: as above
    unsafe {
        kernels::position_grads::launch_unchecked::<R>(
            &client,
            count,
            dim,
            x.clone().into_tensor_arg(),
            dt.clone().into_tensor_arg(),
            dy.into_tensor_arg(),
            y_off.into_tensor_arg(),
            s.decays.cs.clone().into_tensor_arg(),
            s.decays.to_end.clone().into_tensor_arg(),
            dx_diag.into_tensor_arg(),
            gb.into_tensor_arg(),
            grad_x.clone().into_tensor_arg(),
            u.clone().into_tensor_arg(),
            w.clone().into_tensor_arg(),
            xdx.clone().into_tensor_arg(),
            d.sizes(),
            dtype,
        );
    }

    // the log-decays, dt and A
    let grad_da = empty(&x, [b, l, h]);
    let grad_dt = empty(&x, [b, l, h]);
    let (count, dim) = grid(&x, b * h * c);
    // SAFETY: as above
    unsafe {
        kernels::decay_scans::launch_unchecked::<R>(
            &client,
            count,
            dim,
            primitive(f.a.clone()).into_tensor_arg(),
            s.decays.cs.into_tensor_arg(),
            u.into_tensor_arg(),
            w.into_tensor_arg(),
            xdx.into_tensor_arg(),
            pairs.into_tensor_arg(),
            outside.into_tensor_arg(),
            grad_da.clone().into_tensor_arg(),
            grad_dt.clone().into_tensor_arg(),
            d.sizes(),
            dtype,
        );
    }
    let grad_a = (float::<CubeBackend<R, F, I, BT>, 3>(grad_da) * f.dt.clone())
        .sum_dim(0)
        .sum_dim(1)
        .reshape([h]);
    let grad_initial = f.initial.as_ref().map(|_| {
        float::<CubeBackend<R, F, I, BT>, 5>(adjoints)
            .narrow(1, 0, 1)
            .reshape([b, h, p, n])
    });
    F32Grads {
        x: float(grad_x),
        dt: float(grad_dt),
        a: grad_a,
        b_mat: float(grad_b),
        c_mat: float(grad_c),
        initial: grad_initial,
    }
}
