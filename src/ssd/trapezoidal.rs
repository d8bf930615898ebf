//! The Mamba-3 scan, single-input single-output (SISO; Lahoti et al. 2026, `mamba_ssm` 2.3's
//! `mamba3_siso_combined`): the exponential-trapezoidal recurrence over queries and keys rotated
//! by data-dependent angles, per head `h` and token `t`:
//!
//! - `θ_t = θ_{t-1} + π · tanh(angles_t) · Δ_t` (`s` angles a head), and `q_t = Rot(θ_t)(C_t +
//!   C_bias)`, `k_t = Rot(θ_t)(B_t + B_bias)`, rotating the interleaved pairs `(2i, 2i+1)`,
//!   `i < s`, and leaving the other dimensions as they are;
//! - `λ_t = sigmoid(trap_t)`, `α_t = exp(A_t Δ_t)`, `β_t = (1 − λ_t) Δ_t α_t`, `γ_t = λ_t Δ_t`;
//! - `h_t = α_t h_{t-1} + β_t x_{t-1} k_{t-1}ᵀ + γ_t x_t k_tᵀ` (state `[p, n]`);
//! - `y_t = (h_t q_t + D x_t) · silu(z_t)`.
//!
//! Unrolled, the pair `(t, s)` for `s < t` carries `exp(Σ_{u=s+1..t} A_uΔ_u) · c_s` with
//! `c_s = γ_s + (1 − λ_{s+1}) Δ_{s+1}` (0 for the shifted term at the sequence's last token),
//! and the diagonal carries `γ_t` alone. That is the chunked SSD of Mamba-2 with per-token
//! log-decays `A_tΔ_t`, inputs `c_s · x_s` and one head per B/C group (the rotation and the biases
//! make `q` and `k` per head), less `(c_t − γ_t)(q_t · k_t) x_t` on the diagonal: this module
//! runs the SSD's own chunked steps (`chunked::chunk_steps`) on those inputs.
//!
//! Dimension letters as in the [module](super) documentation; `s` the rotary angles.

use std::f64::consts::PI;

use burn::tensor::activation::{sigmoid, silu};
use burn::tensor::{backend::Backend, Tensor};

use super::chunked::{chunk, chunk_steps};
use crate::error::{check_shape, Mamba2Error};
use crate::precision::{cast_to, upcast};

/// The state of the Mamba-3 scan after a token: what the next token's step needs.
#[derive(Clone, Debug)]
pub struct TrapezoidalState<B: Backend> {
    /// The rotary angles `θ` reached, `[b, h, s]` (reduced modulo 2π by the scan).
    pub angle: Tensor<B, 3>,
    /// The state `h`, `[b, h, p, n]`.
    pub ssm: Tensor<B, 4>,
    /// The last token's key, biased and rotated, `[b, h, n]`.
    pub k: Tensor<B, 3>,
    /// The last token's input `x`, `[b, h, p]`.
    pub v: Tensor<B, 3>,
}

impl<B: Backend> TrapezoidalState<B> {
    /// The state of a fresh sequence (all zeros), in `f32`.
    ///
    /// # Shapes
    /// - `[b, h, s]`, `[b, h, p, n]`, `[b, h, n]`, `[b, h, p]` for `[b, h, p, n, s]`
    pub fn zeros(dims: [usize; 5], device: &B::Device) -> Self {
        let [b, h, p, n, s] = dims;
        let f32 = (device, burn::tensor::DType::F32);
        Self {
            angle: Tensor::zeros([b, h, s], f32),
            ssm: Tensor::zeros([b, h, p, n], f32),
            k: Tensor::zeros([b, h, n], f32),
            v: Tensor::zeros([b, h, p], f32),
        }
    }
}

/// The inputs of [`trapezoidal_scan`] and [`trapezoidal_step`].
#[derive(Clone, Debug)]
pub struct TrapezoidalInput<B: Backend> {
    /// `C` after its norm, before its bias, `[b, l, g, n]` (head `i` reads group `i / (h / g)`).
    pub q: Tensor<B, 4>,
    /// `B` after its norm, before its bias, `[b, l, g, n]`.
    pub k: Tensor<B, 4>,
    /// `x`, `[b, l, h, p]`.
    pub v: Tensor<B, 4>,
    /// `A_t · Δ_t` (≤ 0), `[b, l, h]`.
    pub adt: Tensor<B, 3>,
    /// `Δ_t`, `[b, l, h]`.
    pub dt: Tensor<B, 3>,
    /// `λ_t` before its sigmoid, `[b, l, h]`.
    pub trap: Tensor<B, 3>,
    /// `C_bias`, `[h, n]`.
    pub q_bias: Tensor<B, 2>,
    /// `B_bias`, `[h, n]`.
    pub k_bias: Tensor<B, 2>,
    /// The angle inputs before their tanh, `[b, l, h, s]` (`2s ≤ n`).
    pub angles: Tensor<B, 4>,
    /// The skip `D`, `[h]` (none: 0).
    pub d: Option<Tensor<B, 1>>,
    /// The gate `z` of `silu(z)`, `[b, l, h, p]` (none: no gate).
    pub z: Option<Tensor<B, 4>>,
    /// Tokens per chunk (results do not depend on it).
    pub chunk_size: usize,
    /// The state before the first token (none: a fresh sequence).
    pub initial: Option<TrapezoidalState<B>>,
}

impl<B: Backend> TrapezoidalInput<B> {
    /// Checks every shape against `v`'s `[b, l, h, p]`, `q`'s `[.., g, n]` and `angles`' `s`.
    fn check(&self) -> crate::error::Result<()> {
        let [b, l, h, p] = self.v.dims();
        let [_, _, g, n] = self.q.dims();
        let s = self.angles.dims()[3];
        let (b, l, h, p, g, n, s) = (
            Some(b),
            Some(l),
            Some(h),
            Some(p),
            Some(g),
            Some(n),
            Some(s),
        );
        check_shape("q", &self.q.dims(), &[b, l, g, n], "b, l, g, n")?;
        check_shape("k", &self.k.dims(), &[b, l, g, n], "b, l, g, n")?;
        for (name, t) in [("adt", &self.adt), ("dt", &self.dt), ("trap", &self.trap)] {
            check_shape(name, &t.dims(), &[b, l, h], "b, l, h")?;
        }
        check_shape("q_bias", &self.q_bias.dims(), &[h, n], "h, n")?;
        check_shape("k_bias", &self.k_bias.dims(), &[h, n], "h, n")?;
        check_shape("angles", &self.angles.dims(), &[b, l, h, s], "b, l, h, s")?;
        if let Some(d) = &self.d {
            check_shape("d", &d.dims(), &[h], "h")?;
        }
        if let Some(z) = &self.z {
            check_shape("z", &z.dims(), &[b, l, h, p], "b, l, h, p")?;
        }
        if let Some(init) = &self.initial {
            check_shape("initial.angle", &init.angle.dims(), &[b, h, s], "b, h, s")?;
            check_shape("initial.ssm", &init.ssm.dims(), &[b, h, p, n], "b, h, p, n")?;
            check_shape("initial.k", &init.k.dims(), &[b, h, n], "b, h, n")?;
            check_shape("initial.v", &init.v.dims(), &[b, h, p], "b, h, p")?;
        }
        let (h, g, n, s, l) = (h.unwrap(), g.unwrap(), n.unwrap(), s.unwrap(), l.unwrap());
        if g == 0 || h % g != 0 {
            return Err(Mamba2Error::InvalidInput {
                name: "q",
                reason: format!("{g} B/C groups do not divide {h} heads"),
            });
        }
        if 2 * s > n {
            return Err(Mamba2Error::InvalidInput {
                name: "angles",
                reason: format!("{s} angles rotate {} dimensions of {n}", 2 * s),
            });
        }
        if l == 0 || self.chunk_size == 0 {
            return Err(Mamba2Error::InvalidInput {
                name: if l == 0 { "v" } else { "chunk_size" },
                reason: "must be at least 1".into(),
            });
        }
        Ok(())
    }
}

/// The Mamba-3 SISO scan over a sequence, continuing from `input.initial`: the output and the
/// state after the last token. Runs the chunked SSD's tensor operations (any backend; Burn's
/// autodiff gives the gradients), in `f32` or wider.
///
/// # Shapes
/// - input: see [`TrapezoidalInput`]
/// - returns y `[b, l, h, p]` and the state after the last token
pub fn trapezoidal_scan<B: Backend>(
    input: TrapezoidalInput<B>,
) -> crate::error::Result<(Tensor<B, 4>, TrapezoidalState<B>)> {
    input.check()?;
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
        chunk_size,
        initial,
    } = input;
    let [b, l, h, _] = v.dims();
    let (v, adt, dt) = (upcast(v), upcast(adt), upcast(dt));

    // the angles reached at each token, [b, l, h, s]
    let steps = upcast(angles).tanh() * dt.clone().unsqueeze_dim::<4>(3).mul_scalar(PI);
    let mut theta = steps.cumsum(1);
    if let Some(init) = &initial {
        theta = theta + upcast(init.angle.clone()).unsqueeze_dim::<4>(1);
    }
    let q = biased_rotated(q, q_bias, theta.clone(), h);
    let k = biased_rotated(k, k_bias, theta.clone(), h);

    // the trapezoid's weights: γ_t = λ_t Δ_t on the diagonal, c_t = γ_t + (1 − λ_{t+1}) Δ_{t+1}
    // below it
    let lambda = sigmoid(upcast(trap));
    let gamma = dt.clone() * lambda.clone();
    let before = dt.clone() * lambda.clone().neg().add_scalar(1.0); // (1 − λ_t) Δ_t
    let shifted = if l > 1 {
        Tensor::cat(
            vec![
                before.clone().narrow(1, 1, l - 1),
                Tensor::zeros([b, 1, h], (&dt.device(), dt.dtype())),
            ],
            1,
        )
    } else {
        Tensor::zeros([b, 1, h], (&dt.device(), dt.dtype()))
    };
    let scale = gamma + shifted.clone();

    // the state carried into the first chunk holds the previous token's half of the first
    // step: h0 + (1 − λ_0) Δ_0 · x_prev k_prevᵀ
    let initial_ssm = initial.as_ref().map(|init| {
        let c0 = before.clone().narrow(1, 0, 1).reshape([b, h, 1, 1]);
        let outer = upcast(init.v.clone()).unsqueeze_dim::<4>(3)
            * upcast(init.k.clone()).unsqueeze_dim::<4>(2);
        upcast(init.ssm.clone()) + outer * c0
    });

    let (y, ssm) = scan(
        q.clone(),
        k.clone(),
        v.clone() * scale.unsqueeze_dim::<4>(3),
        adt,
        chunk_size.min(l),
        initial_ssm,
    );
    // the diagonal carries γ_t, not c_t: less (c_t − γ_t)(q_t · k_t) x_t
    let qk = (q * k.clone()).sum_dim(3); // [b, l, h, 1]
    let mut y = y - v.clone() * qk * shifted.unsqueeze_dim::<4>(3);
    if let Some(d) = d {
        y = y + v.clone() * upcast(d).reshape([1, 1, h, 1]);
    }
    if let Some(z) = z {
        y = y * silu(upcast(z));
    }
    let last = |t: Tensor<B, 4>| {
        let [_, _, h, m] = t.dims();
        t.narrow(1, l - 1, 1).reshape([b, h, m])
    };
    let state = TrapezoidalState {
        angle: last(theta).remainder_scalar(2.0 * PI),
        ssm,
        k: last(k),
        v: last(v),
    };
    Ok((cast_to(y, out_dtype), state))
}

/// One token of the Mamba-3 SISO scan in its recurrent form, continuing from `input.initial`
/// (none: a fresh sequence): `θ ← θ + π tanh(angles) Δ`, `q` and `k` biased and rotated,
/// `h ← α h + β x_prev k_prevᵀ + γ x kᵀ` with the previous token's `x` and `k` from the state,
/// `y = h q + D x`, gated. The same inputs as [`trapezoidal_scan`] with `l = 1` (`chunk_size`
/// is not used) and the same output and state: decoding's constant-time step. The angles it
/// returns are reduced modulo 2π, as the scan's are, so that they stay small however long the
/// decoding runs.
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
        None => TrapezoidalState::zeros([b, h, p, n, s], &v.device()),
    };
    let flat = |t: Tensor<B, 3>| upcast(t).reshape([b, h]);
    let (adt, dt, trap) = (flat(adt), flat(dt), flat(trap));
    let v = upcast(v).reshape([b, h, p]);

    let step = upcast(angles).reshape([b, h, s]).tanh() * dt.clone().unsqueeze_dim::<3>(2) * PI;
    let theta = state.angle + step;
    let at = theta.clone().unsqueeze_dim::<4>(1);
    let q = biased_rotated(q, q_bias, at.clone(), h).reshape([b, h, n]);
    let k = biased_rotated(k, k_bias, at, h).reshape([b, h, n]);

    // α = exp(AΔ), β = (1 − λ)Δα for the previous token's half, γ = λΔ for this token's
    let lambda = sigmoid(upcast(trap));
    let alpha = adt.exp();
    let gamma = dt.clone() * lambda.clone();
    let beta = dt * lambda.neg().add_scalar(1.0) * alpha.clone();
    let per_head = |t: Tensor<B, 2>| t.reshape([b, h, 1, 1]);
    let outer =
        |v: Tensor<B, 3>, k: Tensor<B, 3>| v.unsqueeze_dim::<4>(3) * k.unsqueeze_dim::<4>(2);
    let ssm = state.ssm * per_head(alpha)
        + outer(state.v, state.k) * per_head(beta)
        + outer(v.clone(), k.clone()) * per_head(gamma);

    let mut y = ssm
        .clone()
        .matmul(q.unsqueeze_dim::<4>(3))
        .reshape([b, h, p]);
    if let Some(d) = d {
        y = y + v.clone() * upcast(d).reshape([1, h, 1]);
    }
    if let Some(z) = z {
        y = y * silu(upcast(z).reshape([b, h, p]));
    }
    let state = TrapezoidalState {
        angle: theta.remainder_scalar(2.0 * PI),
        ssm,
        k,
        v,
    };
    Ok((cast_to(y.reshape([b, 1, h, p]), out_dtype), state))
}

/// Each head's `q` or `k`: its group's (head `i` reads group `i / (h / g)`), plus the head's
/// bias, rotated by the head's angles.
///
/// # Shapes
/// - t: `[b, l, g, n]`, bias: `[h, n]`, theta: `[b, l, h, s]`; returns `[b, l, h, n]`
fn biased_rotated<B: Backend>(
    t: Tensor<B, 4>,
    bias: Tensor<B, 2>,
    theta: Tensor<B, 4>,
    h: usize,
) -> Tensor<B, 4> {
    let [b, l, g, n] = t.dims();
    let t = upcast(t)
        .unsqueeze_dim::<5>(3)
        .repeat_dim(3, h / g)
        .reshape([b, l, h, n]);
    rotate_pairs(t + upcast(bias).unsqueeze::<4>(), theta)
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

/// Rotates the interleaved pairs `(2i, 2i+1)`, `i < s`, of the last axis by `theta[.., i]`:
/// `[a, b] → [a cos θ − b sin θ, a sin θ + b cos θ]`; the dimensions past `2s` pass through.
///
/// # Shapes
/// - x: `[b, l, h, n]`, theta: `[b, l, h, s]`; returns `[b, l, h, n]`
pub(crate) fn rotate_pairs<B: Backend>(x: Tensor<B, 4>, theta: Tensor<B, 4>) -> Tensor<B, 4> {
    let [b, l, h, n] = x.dims();
    let s = theta.dims()[3];
    if s == 0 {
        return x;
    }
    let pairs = x.clone().narrow(3, 0, 2 * s).reshape([b, l, h, s, 2]);
    let (first, second) = (
        pairs.clone().narrow(4, 0, 1),
        pairs.narrow(4, 1, 1), // [b, l, h, s, 1]
    );
    let (cos, sin) = (
        theta.clone().cos().unsqueeze_dim::<5>(4),
        theta.sin().unsqueeze_dim::<5>(4),
    );
    let rotated = Tensor::cat(
        vec![
            first.clone() * cos.clone() - second.clone() * sin.clone(),
            first * sin + second * cos,
        ],
        4,
    )
    .reshape([b, l, h, 2 * s]);
    if 2 * s == n {
        rotated
    } else {
        Tensor::cat(vec![rotated, x.narrow(3, 2 * s, n - 2 * s)], 3)
    }
}
