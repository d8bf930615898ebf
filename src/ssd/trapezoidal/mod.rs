//! The Mamba-3 scan (Lahoti et al. 2026; `mamba_ssm` 2.3's `mamba3_siso_combined` and
//! `mamba3_mimo`): the exponential-trapezoidal recurrence over queries and keys rotated by
//! data-dependent angles, per head `h` and token `t`, with `r` the rank (1 for single-input
//! single-output, SISO; `R` for MIMO):
//!
//! - `θ_t = θ_{t-1} + π · tanh(angles_t) · Δ_t` (`s` angles a head), and
//!   `q_{t,r} = Rot(θ_t)(C_{t,r} + C_bias_r)`, `k_{t,r} = Rot(θ_t)(B_{t,r} + B_bias_r)`, rotating
//!   the interleaved pairs `(2i, 2i+1)` (SISO) or the halves' pairs `(i, n/2 + i)` (MIMO), `i < s`,
//!   and leaving the other dimensions as they are;
//! - `v_{t,r} = x_t ⊙ mimo_x_r` (SISO: `x_t`);
//! - `λ_t = sigmoid(trap_t)`, `α_t = exp(A_t Δ_t)`, `β_t = (1 − λ_t) Δ_t α_t`, `γ_t = λ_t Δ_t`;
//! - `h_t = α_t h_{t-1} + β_t Σ_r v_{t-1,r} k_{t-1,r}ᵀ + γ_t Σ_r v_{t,r} k_{t,r}ᵀ` (state
//!   `[p, n]`);
//! - `y_{t,r} = h_t q_{t,r} + D v_{t,r}`, then the output stage: SISO `y_t · silu(z_t)`; MIMO
//!   `Σ_r mimo_o_r ⊙ norm(y_{t,r}) ⊙ silu(z_t ⊙ mimo_z_r)` (the norm per rank and head, where
//!   given).
//!
//! Unrolled, the pair `(t, s)` for `s < t` carries `exp(Σ_{u=s+1..t} A_uΔ_u) · c_s` with
//! `c_s = γ_s + (1 − λ_{s+1}) Δ_{s+1}` (0 for the shifted term at the sequence's last token),
//! and pairs within a token carry `γ_t` alone. That is the chunked SSD of Mamba-2 run over the
//! sequence of `(t, r)` in order, with per-token log-decays `A_tΔ_t` (0 between the ranks of a
//! token), inputs `c_t · v_{t,r}` and one head per B/C group (the rotation and the biases make
//! `q` and `k` per head), plus, within each token, `Σ_{r'} (γ_t − c_t [r' ≤ r]) (q_{t,r} ·
//! k_{t,r'}) v_{t,r'}`: the SSD's own chunked steps (`chunked::chunk_steps`) on those inputs
//! ([`trapezoidal_scan`]); the recurrence itself, one token at a time, is [`trapezoidal_step`].
//!
//! Dimension letters as in the [module](super) documentation; `s` the rotary angles, `r` the
//! rank.

mod heads;
mod input;
mod scan;
mod step;

pub use input::{Mimo, TrapezoidalInput, TrapezoidalState};
pub use scan::trapezoidal_scan;
pub use step::trapezoidal_step;
