//! The Mamba-3 scan's recurrence, one token at a time: decoding's constant-time step.

use std::f64::consts::PI;

use burn::tensor::activation::sigmoid;
use burn::tensor::{backend::Backend, Tensor};

use super::heads::{biased_rotated, outer_sum, output, rank_inputs};
use super::input::{TrapezoidalInput, TrapezoidalState};
use crate::error::Mamba2Error;
use crate::precision::{cast_to, upcast};

/// One token of the Mamba-3 scan (SISO or MIMO) in its recurrent form, continuing from
/// `input.initial` (none: a fresh sequence): `θ ← θ + π tanh(angles) Δ`, `q` and `k` biased and
/// rotated, `h ← α h + β Σ_r v_prev,r k_prev,rᵀ + γ Σ_r v_r k_rᵀ` with the previous token's `x`
/// and keys from the state, `y_r = h q_r + D v_r`, then the output stage. The same inputs as
/// [`trapezoidal_scan`](super::trapezoidal_scan) with `l = 1` (`chunk_size` is not used) and
/// the same output and state. The angles it returns are reduced modulo 2π, as the scan's are,
/// so that they stay small however long the decoding runs.
///
/// # Shapes
/// - input: see [`TrapezoidalInput`], with `l = 1`
/// - returns y `[b, 1, h, p]` and the state after the token
pub fn trapezoidal_step<B: Backend>(
    input: TrapezoidalInput<B>,
) -> crate::error::Result<(Tensor<B, 4>, TrapezoidalState<B>)> {
    input.check()?;
    let [b, l, h, p] = input.v.dims();
    if l != 1 {
        return Err(Mamba2Error::InvalidInput {
            name: "v",
            reason: format!("the step takes one token, not {l}"),
        });
    }
    let r = input.rank();
    let out_dtype = input.v.dtype();
    let TrapezoidalInput {
        q,
        k,
        v,
        adt,
        dt,
        trap,
        q_bias,
        k_bias,
        angles,
        d,
        z,
        mimo,
        chunk_size: _,
        initial,
    } = input;
    let n = q.dims()[3];
    let s = angles.dims()[3];
    let state = match initial {
        Some(st) => TrapezoidalState {
            angle: upcast(st.angle),
            ssm: upcast(st.ssm),
            k: upcast(st.k),
            v: upcast(st.v),
        },
        None => TrapezoidalState::zeros([b, r, h, p, n, s], &v.device()),
    };
    let flat = |t: Tensor<B, 3>| upcast(t).reshape([b, h]);
    let (adt, dt, trap) = (flat(adt), flat(dt), flat(trap));
    let x = upcast(v);

    let step = upcast(angles).reshape([b, h, s]).tanh() * dt.clone().unsqueeze_dim::<3>(2) * PI;
    let theta = state.angle + step;
    let at = theta.clone().unsqueeze_dim::<4>(1);
    let halves = mimo.is_some();
    let q = biased_rotated(q, q_bias, at.clone(), h, r, halves).reshape([b, r, h, n]);
    let k = biased_rotated(k, k_bias, at, h, r, halves).reshape([b, r, h, n]);
    let v = rank_inputs(x.clone(), mimo.as_ref()).reshape([b, r, h, p]);
    let v_prev = rank_inputs(state.v.unsqueeze_dim::<4>(1), mimo.as_ref()).reshape([b, r, h, p]);

    // α = exp(AΔ), β = (1 − λ)Δα for the previous token's half, γ = λΔ for this token's
    let lambda = sigmoid(upcast(trap));
    let alpha = adt.exp();
    let gamma = dt.clone() * lambda.clone();
    let beta = dt * lambda.neg().add_scalar(1.0) * alpha.clone();
    let per_head = |t: Tensor<B, 2>| t.reshape([b, h, 1, 1]);
    let ssm = state.ssm * per_head(alpha)
        + outer_sum(v_prev, state.k) * per_head(beta)
        + outer_sum(v.clone(), k.clone()) * per_head(gamma);

    // y_r = h q_r, [b, h, p, r] → [b, r, h, p]
    let mut y = ssm
        .clone()
        .matmul(q.swap_dims(1, 2).swap_dims(2, 3))
        .permute([0, 3, 1, 2]);
    if let Some(d) = d {
        y = y + v * upcast(d).reshape([1, 1, h, 1]);
    }
    let y = output(y.unsqueeze_dim::<5>(1), z, mimo);
    let state = TrapezoidalState {
        angle: theta.remainder_scalar(2.0 * PI),
        ssm,
        k,
        v: x.reshape([b, h, p]),
    };
    Ok((cast_to(y, out_dtype), state))
}
