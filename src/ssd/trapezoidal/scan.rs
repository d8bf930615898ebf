//! The Mamba-3 scan over a sequence: the chunked SSD's steps on the trapezoid's inputs.

use std::f64::consts::PI;

use burn::tensor::activation::sigmoid;
use burn::tensor::{backend::Backend, Tensor};

use super::heads::{biased_rotated, outer_sum, output, rank_inputs};
use super::input::{TrapezoidalInput, TrapezoidalState};
use crate::precision::{cast_to, upcast};
use crate::ssd::chunked::{chunk, chunk_steps};

/// The Mamba-3 scan over a sequence, SISO or MIMO, continuing from `input.initial`: the output
/// and the state after the last token. Runs the chunked SSD's tensor operations over the
/// sequence of each token's ranks (any backend; Burn's autodiff gives the gradients), in `f32`
/// or wider.
///
/// # Shapes
/// - input: see [`TrapezoidalInput`]
/// - returns y `[b, l, h, p]` and the state after the last token
pub fn trapezoidal_scan<B: Backend>(
    input: TrapezoidalInput<B>,
) -> crate::error::Result<(Tensor<B, 4>, TrapezoidalState<B>)> {
    input.check()?;
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
        chunk_size,
        initial,
    } = input;
    let [b, l, h, p] = v.dims();
    let n = q.dims()[3];
    let (x, adt, dt) = (upcast(v), upcast(adt), upcast(dt));
    let device = x.device();

    // the angles reached at each token, [b, l, h, s]
    let steps = upcast(angles).tanh() * dt.clone().unsqueeze_dim::<4>(3).mul_scalar(PI);
    let mut theta = steps.cumsum(1);
    if let Some(init) = &initial {
        theta = theta + upcast(init.angle.clone()).unsqueeze_dim::<4>(1);
    }
    let halves = mimo.is_some();
    let q = biased_rotated(q, q_bias, theta.clone(), h, r, halves); // [b, l, r, h, n]
    let k = biased_rotated(k, k_bias, theta.clone(), h, r, halves);
    let v = rank_inputs(x.clone(), mimo.as_ref()); // [b, l, r, h, p]

    // the trapezoid's weights: γ_t = λ_t Δ_t within a token, c_t = γ_t + (1 − λ_{t+1}) Δ_{t+1}
    // from a token to the later ones
    let lambda = sigmoid(upcast(trap));
    let gamma = dt.clone() * lambda.clone();
    let before = dt.clone() * lambda.neg().add_scalar(1.0); // (1 − λ_t) Δ_t
    let next = if l > 1 {
        Tensor::cat(
            vec![
                before.clone().narrow(1, 1, l - 1),
                Tensor::zeros([b, 1, h], (&device, dt.dtype())),
            ],
            1,
        )
    } else {
        Tensor::zeros([b, 1, h], (&device, dt.dtype()))
    };
    let scale = gamma.clone() + next;

    // the state carried into the first chunk holds the previous token's half of the first
    // step: h0 + (1 − λ_0) Δ_0 · Σ_r v_prev,r k_prev,rᵀ
    let initial_ssm = initial.as_ref().map(|init| {
        let c0 = before.clone().narrow(1, 0, 1).reshape([b, h, 1, 1]);
        let v_prev = rank_inputs(upcast(init.v.clone()).unsqueeze_dim::<4>(1), mimo.as_ref());
        let outer = outer_sum(v_prev.reshape([b, r, h, p]), upcast(init.k.clone()));
        upcast(init.ssm.clone()) + outer * c0
    });

    // the sequence of (t, r) in order: the token's decay on its first rank, none between its
    // ranks, and every rank's input scaled by c_t
    let adt_ranks = if r == 1 {
        adt
    } else {
        Tensor::cat(
            vec![
                adt.unsqueeze_dim::<4>(2),
                Tensor::zeros([b, l, r - 1, h], (&device, dt.dtype())),
            ],
            2,
        )
        .reshape([b, l * r, h])
    };
    let x_scaled = v.clone() * scale.clone().reshape([b, l, 1, h, 1]);
    let (y, ssm) = scan(
        q.clone().reshape([b, l * r, h, n]),
        k.clone().reshape([b, l * r, h, n]),
        x_scaled.reshape([b, l * r, h, p]),
        adt_ranks,
        (chunk_size * r).min(l * r),
        initial_ssm,
    );

    // within a token every pair of ranks carries γ_t, where the scan gave c_t to r' ≤ r:
    // add Σ_{r'} (γ_t − c_t [r' ≤ r]) (q_{t,r} · k_{t,r'}) v_{t,r'}
    let qk = q
        .swap_dims(2, 3)
        .matmul(k.clone().swap_dims(2, 3).swap_dims(3, 4)); // [b, l, h, r, r']
    let lower = Tensor::<B, 2>::ones([r, r], (&device, dt.dtype()))
        .tril(0)
        .reshape([1, 1, 1, r, r]);
    let weight = gamma.reshape([b, l, h, 1, 1]) - lower * scale.reshape([b, l, h, 1, 1]);
    let within = (qk * weight)
        .matmul(v.clone().swap_dims(2, 3))
        .swap_dims(2, 3); // [b, l, r, h, p]
    let mut y = y.reshape([b, l, r, h, p]) + within;
    if let Some(d) = d {
        y = y + v * upcast(d).reshape([1, 1, 1, h, 1]);
    }
    let y = output(y, z, mimo);

    let s = theta.dims()[3];
    let state = TrapezoidalState {
        angle: theta
            .narrow(1, l - 1, 1)
            .reshape([b, h, s])
            .remainder_scalar(2.0 * PI),
        ssm,
        k: k.narrow(1, l - 1, 1).reshape([b, r, h, n]),
        v: x.narrow(1, l - 1, 1).reshape([b, h, p]),
    };
    Ok((cast_to(y, out_dtype), state))
}

/// `Σ_{s ≤ t} exp(Σ_{u=s+1..t} adt_u) (q_t · k_s) x̃_s` with the state carried from `initial`:
/// the chunked SSD's steps, one head per group.
///
/// # Shapes
/// - q, k: `[b, l, h, n]`, x_scaled: `[b, l, h, p]`, adt: `[b, l, h]`, initial: `[b, h, p, n]`
/// - returns y `[b, l, h, p]` and the final state `[b, h, p, n]`
fn scan<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    x_scaled: Tensor<B, 4>,
    adt: Tensor<B, 3>,
    chunk_len: usize,
    initial: Option<Tensor<B, 4>>,
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let [b, l, h, p] = x_scaled.dims();
    let n = q.dims()[3];
    // with one head per group the chunk layout's (g, r) is (h, 1)
    let (x, da, k_t, q_c) = chunk(x_scaled, adt, k, q, chunk_len);
    let initial = match initial {
        Some(s) => s.reshape([b, h, 1, p, n]).swap_dims(3, 4),
        None => Tensor::zeros([b, h, 1, n, p], (&x.device(), x.dtype())),
    };
    let (y, final_state) = chunk_steps(x, da, k_t, q_c, initial, l);
    (y, final_state.swap_dims(3, 4).reshape([b, h, p, n]))
}
