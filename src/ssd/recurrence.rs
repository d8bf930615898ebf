//! The SSD as its plain recurrence: one step per token, and the sequential scan the chunked
//! form is tested against.

use burn::tensor::{backend::Backend, Tensor};

use super::input::SsdInput;
use crate::precision::{cast_to, compute_dtype, upcast};

/// One step of the recurrence: `S ← exp(dt·A)·S + dt·x ⊗ B`, `y = S·C`.
///
/// # Shapes
/// - x: `[b, h, p]`, dt: `[b, h]`, a: `[h]`, b_mat, c_mat: `[b, g, n]`
/// - state: `[b, h, p, n]`
/// - returns y `[b, h, p]` and the new state `[b, h, p, n]`
pub fn ssd_step<B: Backend>(
    x: Tensor<B, 3>,
    dt: Tensor<B, 2>,
    a: Tensor<B, 1>,
    b_mat: Tensor<B, 3>,
    c_mat: Tensor<B, 3>,
    state: Tensor<B, 4>,
) -> (Tensor<B, 3>, Tensor<B, 4>) {
    let [b, h, p] = x.dims();
    let [_, g, n] = b_mat.dims();
    let r = h / g;
    let out_dtype = x.dtype();
    let (x, dt, a, b_mat, c_mat) = (
        upcast(x),
        upcast(dt),
        upcast(a),
        upcast(b_mat),
        upcast(c_mat),
    );
    let state = cast_to(state, x.dtype()).reshape([b, g, r, p, n]);

    let decay = (dt.clone() * a.unsqueeze::<2>())
        .exp()
        .reshape([b, g, r, 1, 1]);
    let x_dt = (x * dt.unsqueeze_dim::<3>(2)).reshape([b, g, r, p, 1]);
    let state = state * decay + x_dt * b_mat.reshape([b, g, 1, 1, n]);
    let y = (state.clone() * c_mat.reshape([b, g, 1, 1, n]))
        .sum_dim(4)
        .reshape([b, h, p]);
    (cast_to(y, out_dtype), state.reshape([b, h, p, n]))
}

/// The plain sequential recurrence, one [`ssd_step`] per position: the reference the chunked
/// form is tested against (O(l) small steps; not for training). With document starts the state
/// is multiplied by 0 at each start; the chunk size is not used.
///
/// # Shapes
/// - input: see [`SsdInput`]
/// - returns y `[b, l, h, p]` and the final state `[b, h, p, n]`
pub fn ssd_sequential<B: Backend>(input: SsdInput<B>) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let SsdInput {
        x,
        dt,
        a,
        b: b_mat,
        c: c_mat,
        initial_state,
        starts,
        ..
    } = input;
    let [b, l, h, p] = x.dims();
    let n = b_mat.dims()[3];
    let mut state = initial_state
        .unwrap_or_else(|| Tensor::zeros([b, h, p, n], (&x.device(), compute_dtype(x.dtype()))));
    let mut ys = Vec::with_capacity(l);
    for t in 0..l {
        if let Some(starts) = &starts {
            state = continue_rows(state, starts.clone().narrow(1, t, 1).reshape([b]));
        }
        let (y, s) = ssd_step(
            x.clone().narrow(1, t, 1).squeeze_dim::<3>(1),
            dt.clone().narrow(1, t, 1).squeeze_dim::<2>(1),
            a.clone(),
            b_mat.clone().narrow(1, t, 1).squeeze_dim::<3>(1),
            c_mat.clone().narrow(1, t, 1).squeeze_dim::<3>(1),
            state,
        );
        ys.push(y);
        state = s;
    }
    (Tensor::stack(ys, 1), state)
}

/// Keeps each row's state where `start` is 0 and drops it (zeros) where it is 1: a new
/// document begins in that row.
///
/// # Shapes
/// - state: `[b, ...]`, start: `[b]`; returns the shape of `state`
pub(crate) fn continue_rows<B: Backend, const D: usize>(
    state: Tensor<B, D>,
    start: Tensor<B, 1>,
) -> Tensor<B, D> {
    let mut shape = [1; D];
    shape[0] = start.dims()[0];
    let keep = (cast_to(start, state.dtype()).neg() + 1.0).reshape(shape);
    state * keep
}
