//! What the Mamba-3 scan and its step share: each head's and rank's queries and keys (the
//! group's, biased, rotated), each rank's inputs, and the output stage.

use burn::tensor::activation::silu;
use burn::tensor::{backend::Backend, Tensor};

use super::input::Mimo;
use crate::precision::upcast;

/// Each head's and rank's `q` or `k`: its group's (head `i` reads group `i / (h / g)`), plus the
/// head's bias, rotated by the head's angles, in interleaved pairs (SISO) or the halves' pairs
/// (MIMO, `halves`).
///
/// # Shapes
/// - t: `[b, l, r·g, n]` (rank-major), bias: `[h, r, n]`, theta: `[b, l, h, s]`
/// - returns `[b, l, r, h, n]`
pub(super) fn biased_rotated<B: Backend>(
    t: Tensor<B, 4>,
    bias: Tensor<B, 3>,
    theta: Tensor<B, 4>,
    h: usize,
    r: usize,
    halves: bool,
) -> Tensor<B, 5> {
    let [b, l, rg, n] = t.dims();
    let g = rg / r;
    let t = upcast(t)
        .reshape([b, l, r, g, 1, n])
        .repeat_dim(4, h / g)
        .reshape([b, l, r, h, n]);
    let t = t + upcast(bias).swap_dims(0, 1).unsqueeze::<5>();
    let theta = theta.unsqueeze_dim::<5>(2);
    if halves {
        rotate_halves(t, theta)
    } else {
        rotate_pairs(t, theta)
    }
}

/// Rotates the interleaved pairs `(2i, 2i+1)`, `i < s`, of the last axis by `theta[.., i]`:
/// `[a, b] → [a cos θ − b sin θ, a sin θ + b cos θ]`; the dimensions past `2s` pass through.
///
/// # Shapes
/// - x: `[b, l, r, h, n]`, theta: `[b, l, 1, h, s]` (every rank the token's); returns x's
fn rotate_pairs<B: Backend>(x: Tensor<B, 5>, theta: Tensor<B, 5>) -> Tensor<B, 5> {
    let [b, l, r, h, n] = x.dims();
    let s = theta.dims()[4];
    if s == 0 {
        return x;
    }
    let pairs = x.clone().narrow(4, 0, 2 * s).reshape([b, l, r, h, s, 2]);
    let (first, second) = (pairs.clone().narrow(5, 0, 1), pairs.narrow(5, 1, 1));
    let (cos, sin) = (
        theta.clone().cos().unsqueeze_dim::<6>(5),
        theta.sin().unsqueeze_dim::<6>(5),
    );
    let rotated = Tensor::cat(
        vec![
            first.clone() * cos.clone() - second.clone() * sin.clone(),
            first * sin + second * cos,
        ],
        5,
    )
    .reshape([b, l, r, h, 2 * s]);
    if 2 * s == n {
        rotated
    } else {
        Tensor::cat(vec![rotated, x.narrow(4, 2 * s, n - 2 * s)], 4)
    }
}

/// Rotates the pairs `(i, n/2 + i)`, `i < s`, of the last axis by `theta[.., i]` (MIMO's
/// convention, `mamba_ssm`'s TileLang kernels); the other dimensions pass through.
///
/// # Shapes
/// - x: `[b, l, r, h, n]` (`n` even), theta: `[b, l, 1, h, s]`; returns x's
fn rotate_halves<B: Backend>(x: Tensor<B, 5>, theta: Tensor<B, 5>) -> Tensor<B, 5> {
    let n = x.dims()[4];
    let (s, half) = (theta.dims()[4], n / 2);
    if s == 0 {
        return x;
    }
    let (first, second) = (x.clone().narrow(4, 0, s), x.clone().narrow(4, half, s));
    let (cos, sin) = (theta.clone().cos(), theta.sin());
    let mut parts = vec![first.clone() * cos.clone() - second.clone() * sin.clone()];
    if s < half {
        parts.push(x.clone().narrow(4, s, half - s));
    }
    parts.push(first * sin + second * cos);
    if s < half {
        parts.push(x.narrow(4, half + s, half - s));
    }
    Tensor::cat(parts, 4)
}

/// Each rank's input `v_{t,r} = x_t ⊙ mimo_x_r` (SISO: `x_t`).
///
/// # Shapes
/// - x: `[b, l, h, p]`, mimo.x: `[h, r, p]`; returns `[b, l, r, h, p]`
pub(super) fn rank_inputs<B: Backend>(x: Tensor<B, 4>, mimo: Option<&Mimo<B>>) -> Tensor<B, 5> {
    let x = x.unsqueeze_dim::<5>(2);
    match mimo {
        Some(m) => x * upcast(m.x.clone()).swap_dims(0, 1).unsqueeze::<5>(),
        None => x,
    }
}

/// `Σ_r v_r k_rᵀ` per head.
///
/// # Shapes
/// - v: `[b, r, h, p]`, k: `[b, r, h, n]`; returns `[b, h, p, n]`
pub(super) fn outer_sum<B: Backend>(v: Tensor<B, 4>, k: Tensor<B, 4>) -> Tensor<B, 4> {
    v.permute([0, 2, 3, 1]).matmul(k.swap_dims(1, 2))
}

/// The output stage of each rank's `y` (`D·v` added): SISO `y · silu(z)`; MIMO
/// `Σ_r mimo_o_r ⊙ norm(y_r) ⊙ silu(z ⊙ mimo_z_r)`, the norm (where given) an RMSNorm of each
/// rank's and head's `p` values. Without `z`, no gate.
///
/// # Shapes
/// - y: `[b, l, r, h, p]`, z: `[b, l, h, p]`; returns `[b, l, h, p]`
pub(super) fn output<B: Backend>(
    y: Tensor<B, 5>,
    z: Option<Tensor<B, 4>>,
    mimo: Option<Mimo<B>>,
) -> Tensor<B, 4> {
    let [b, l, _, h, p] = y.dims();
    let Some(mimo) = mimo else {
        let y = y.reshape([b, l, h, p]);
        return match z {
            Some(z) => y * silu(upcast(z)),
            None => y,
        };
    };
    let per_rank = |t: Tensor<B, 3>| upcast(t).swap_dims(0, 1).unsqueeze::<5>(); // [1, 1, r, h, p]
    let mut y = y;
    if let Some((weight, eps)) = mimo.norm {
        // y · (mean(y²) + eps)^(-1/2): a power, never burn-ndarray's approximate `recip`
        let inv_rms = (y.clone().square().mean_dim(4) + eps).powf_scalar(-0.5);
        y = y * inv_rms * upcast(weight).unsqueeze::<5>();
    }
    if let Some(z) = z {
        y = y * silu(upcast(z).unsqueeze_dim::<5>(2) * per_rank(mimo.z));
    }
    (y * per_rank(mimo.out)).sum_dim(2).reshape([b, l, h, p])
}
