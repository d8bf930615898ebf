//! The CubeCL kernels of the fused chunked scan, in `f32`, on contiguous tensors.
//!
//! Dimension letters as in [`crate::ssd`]: `b` batch, `l` length, `h` heads, `p` the input's
//! head dimension, `g` groups, `n` the state dimension, `q` chunk length, `c` chunks. The
//! kernels walk the padded sequence of `c·q` positions in *logical* order `τ`: forward, `τ`
//! is the time `t`; in reverse (the adjoint scan of the backward), `t = c·q - 1 - τ`, and the
//! decay applied at `τ` is that of `t + 1`. A position `t ≥ l` is padding: no input, no decay.
//!
//! Every segment of log-decays is summed from its own terms as the loop walks back from its
//! end (never as a difference of two prefix sums), as in [`crate::ssd::chunked::segment_sums`], so the
//! document starts' `-10⁴` cannot cancel small terms.

use cubecl::prelude::*;

/// The time of logical position `tau` in a padded sequence of `padded` positions.
#[cube]
fn time_of(tau: usize, padded: usize, #[comptime] reverse: bool) -> usize {
    if reverse {
        padded - 1 - tau
    } else {
        tau
    }
}

/// The per-step log-decays `dA` `[b, h, c·q]`, their inclusive cumulative sums within each
/// chunk `cs` and the decay from each position to its chunk's end,
/// `to_end[i] = exp(Σ_{k=i+1}^{q-1} dA[k])` (both `[b, h, c·q]`), in logical order. One thread
/// per `(b, h, chunk)`.
///
/// `dA[t] = dt[t]·a + starts[t]·(-10⁴)` (forward) or that of `t + 1` (reverse).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(super) fn decays<F: Float>(
    dt: &Tensor<F>,         // [b, l, h]
    a: &Tensor<F>,          // [h]
    starts: &Tensor<F>,     // [b, l] (read when has_starts)
    da: &mut Tensor<F>,     // [b, h, c·q]
    cs: &mut Tensor<F>,     // [b, h, c·q]
    to_end: &mut Tensor<F>, // [b, h, c·q]
    batch: u32,
    len: u32,
    heads: u32,
    chunks: u32,
    q: u32,
    #[comptime] has_starts: bool,
    #[comptime] reverse: bool,
    #[define(F)] _dtype: StorageType,
) {
    let len = len as usize;
    let heads = heads as usize;
    let chunks = chunks as usize;
    let q = q as usize;
    let id = ABSOLUTE_POS;
    if id >= batch as usize * heads * chunks {
        terminate!();
    }
    let j = id % chunks;
    let h = (id / chunks) % heads;
    let b = id / (chunks * heads);
    let padded = chunks * q;
    let rate = a[h];
    let row = (b * heads + h) * padded;
    let mut sum = F::new(0.0);
    for i in 0..q {
        let tau = j * q + i;
        let mut src = tau;
        if reverse {
            src = padded - tau;
        }
        let mut d = F::new(0.0);
        if src < len {
            d = dt[(b * len + src) * heads + h] * rate;
            if has_starts {
                d += starts[b * len + src] * F::new(-1.0e4);
            }
        }
        da[row + tau] = d;
        sum += d;
        cs[row + tau] = sum;
    }
    let mut seg = F::new(0.0);
    for k in 0..q {
        let tau = j * q + q - 1 - k;
        to_end[row + tau] = seg.exp();
        seg += da[row + tau];
    }
}

/// The chunk states, assuming a zero state at each chunk's start:
/// `states[j] = Σ_s to_end[s] · x̃_s ⊗ B_s`, written to slot `j + 1` of
/// `out` `[b, c+1, h, p, n]` (slot 0 is the initial state's, filled by [`state_passing`]).
/// `x̃ = x·dt` when `scaled`, else `x`. One thread per `(b, j, h, p, n)`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(super) fn chunk_states<F: Float>(
    x: &Tensor<F>,       // [b, l, h, p]
    dt: &Tensor<F>,      // [b, l, h] (read when scaled)
    b_mat: &Tensor<F>,   // [b, l, g, n]
    to_end: &Tensor<F>,  // [b, h, c·q]
    out: &mut Tensor<F>, // [b, c+1, h, p, n]
    batch: u32,
    len: u32,
    heads: u32,
    groups: u32,
    dim_p: u32,
    dim_n: u32,
    chunks: u32,
    q: u32,
    #[comptime] scaled: bool,
    #[comptime] reverse: bool,
    #[define(F)] _dtype: StorageType,
) {
    let len = len as usize;
    let heads = heads as usize;
    let groups = groups as usize;
    let dim_p = dim_p as usize;
    let dim_n = dim_n as usize;
    let chunks = chunks as usize;
    let q = q as usize;
    let id = ABSOLUTE_POS;
    if id >= batch as usize * chunks * heads * dim_p * dim_n {
        terminate!();
    }
    let nn = id % dim_n;
    let pp = (id / dim_n) % dim_p;
    let h = (id / (dim_n * dim_p)) % heads;
    let j = (id / (dim_n * dim_p * heads)) % chunks;
    let b = id / (dim_n * dim_p * heads * chunks);
    let g = h / (heads / groups);
    let padded = chunks * q;
    let row = (b * heads + h) * padded;
    let mut acc = F::new(0.0);
    for i in 0..q {
        let tau = j * q + i;
        let t = time_of(tau, padded, reverse);
        if t < len {
            let mut w = to_end[row + tau]
                * x[((b * len + t) * heads + h) * dim_p + pp]
                * b_mat[((b * len + t) * groups + g) * dim_n + nn];
            if scaled {
                w *= dt[(b * len + t) * heads + h];
            }
            acc += w;
        }
    }
    out[(((b * (chunks + 1) + j + 1) * heads + h) * dim_p + pp) * dim_n + nn] = acc;
}

/// The inter-chunk recurrence, in place: slot 0 of `states` becomes the initial state, slot
/// `j + 1` (the state of chunk `j` from zero) becomes the state after chunk `j`,
/// `S[j+1] = exp(Σ_chunk dA) · S[j] + states[j]`. One thread per `(b, h, p, n)`, looping over
/// the chunks.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(super) fn state_passing<F: Float>(
    initial: &Tensor<F>,    // [b, h, p, n] (read when has_initial)
    cs: &Tensor<F>,         // [b, h, c·q]
    states: &mut Tensor<F>, // [b, c+1, h, p, n]
    batch: u32,
    heads: u32,
    dim_p: u32,
    dim_n: u32,
    chunks: u32,
    q: u32,
    #[comptime] has_initial: bool,
    #[define(F)] _dtype: StorageType,
) {
    let heads = heads as usize;
    let dim_p = dim_p as usize;
    let dim_n = dim_n as usize;
    let chunks = chunks as usize;
    let q = q as usize;
    let id = ABSOLUTE_POS;
    let per_head = dim_p * dim_n;
    if id >= batch as usize * heads * per_head {
        terminate!();
    }
    let e = id % per_head;
    let h = (id / per_head) % heads;
    let b = id / (per_head * heads);
    let mut s = F::new(0.0);
    if has_initial {
        s = initial[id];
    }
    let row = (b * heads + h) * chunks * q;
    states[((b * (chunks + 1)) * heads + h) * per_head + e] = s;
    for j in 0..chunks {
        let slot = ((b * (chunks + 1) + j + 1) * heads + h) * per_head + e;
        s = cs[row + j * q + q - 1].exp() * s + states[slot];
        states[slot] = s;
    }
}

/// The intra-chunk scores `M[i, s] = exp(Σ_{k=s+1}^{i} dA[k]) · (C_i · B_s)` for `s ≤ i`
/// `[b, c, h, q, q]` (the upper triangle is not written: readers stop at the diagonal). One
/// thread per `(b, j, h, i)`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(super) fn chunk_scores<F: Float>(
    b_mat: &Tensor<F>,      // [b, l, g, n]
    c_mat: &Tensor<F>,      // [b, l, g, n]
    da: &Tensor<F>,         // [b, h, c·q]
    scores: &mut Tensor<F>, // [b, c, h, q, q]
    batch: u32,
    len: u32,
    heads: u32,
    groups: u32,
    dim_n: u32,
    chunks: u32,
    q: u32,
    #[comptime] reverse: bool,
    #[define(F)] _dtype: StorageType,
) {
    let len = len as usize;
    let heads = heads as usize;
    let groups = groups as usize;
    let dim_n = dim_n as usize;
    let chunks = chunks as usize;
    let q = q as usize;
    let id = ABSOLUTE_POS;
    if id >= batch as usize * chunks * heads * q {
        terminate!();
    }
    let i = id % q;
    let h = (id / q) % heads;
    let j = (id / (q * heads)) % chunks;
    let b = id / (q * heads * chunks);
    let g = h / (heads / groups);
    let padded = chunks * q;
    let t_i = time_of(j * q + i, padded, reverse);
    if t_i >= len {
        terminate!();
    }
    let row = (b * heads + h) * padded;
    let c_row = ((b * len + t_i) * groups + g) * dim_n;
    let out = id * q;
    let mut seg = F::new(0.0);
    for k in 0..i + 1 {
        let s = i - k;
        let tau_s = j * q + s;
        let t_s = time_of(tau_s, padded, reverse);
        let mut dot = F::new(0.0);
        if t_s < len {
            let b_row = ((b * len + t_s) * groups + g) * dim_n;
            for nn in 0..dim_n {
                dot += c_mat[c_row + nn] * b_mat[b_row + nn];
            }
        }
        scores[out + s] = seg.exp() * dot;
        seg += da[row + tau_s];
    }
}

/// The output, `y_i = exp(Σ_{k ≤ i} dA[k]) · S_in · C_i + Σ_{s ≤ i} M[i, s] · x̃_s`, written at
/// time `t` of `y` `[b, l, h, p]`, and its first term (the entering state's part) in `y_off`
/// when `split`. One thread per `(b, j, h, i, p)`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(super) fn chunk_output<F: Float>(
    x: &Tensor<F>,         // [b, l, h, p]
    dt: &Tensor<F>,        // [b, l, h] (read when scaled)
    c_mat: &Tensor<F>,     // [b, l, g, n]
    cs: &Tensor<F>,        // [b, h, c·q]
    states: &Tensor<F>,    // [b, c+1, h, p, n]: slot j is the state entering chunk j
    scores: &Tensor<F>,    // [b, c, h, q, q]
    y: &mut Tensor<F>,     // [b, l, h, p]
    y_off: &mut Tensor<F>, // [b, l, h, p]: the entering state's part (written when split)
    batch: u32,
    len: u32,
    heads: u32,
    groups: u32,
    dim_p: u32,
    dim_n: u32,
    chunks: u32,
    q: u32,
    #[comptime] scaled: bool,
    #[comptime] reverse: bool,
    #[comptime] split: bool,
    #[define(F)] _dtype: StorageType,
) {
    let len = len as usize;
    let heads = heads as usize;
    let groups = groups as usize;
    let dim_p = dim_p as usize;
    let dim_n = dim_n as usize;
    let chunks = chunks as usize;
    let q = q as usize;
    let id = ABSOLUTE_POS;
    if id >= batch as usize * chunks * heads * q * dim_p {
        terminate!();
    }
    let pp = id % dim_p;
    let i = (id / dim_p) % q;
    let h = (id / (dim_p * q)) % heads;
    let j = (id / (dim_p * q * heads)) % chunks;
    let b = id / (dim_p * q * heads * chunks);
    let g = h / (heads / groups);
    let padded = chunks * q;
    let t = time_of(j * q + i, padded, reverse);
    if t >= len {
        terminate!();
    }
    let c_row = ((b * len + t) * groups + g) * dim_n;
    let s_row = (((b * (chunks + 1) + j) * heads + h) * dim_p + pp) * dim_n;
    let mut from_state = F::new(0.0);
    for nn in 0..dim_n {
        from_state += c_mat[c_row + nn] * states[s_row + nn];
    }
    let mut acc = cs[(b * heads + h) * padded + j * q + i].exp() * from_state;
    if split {
        y_off[((b * len + t) * heads + h) * dim_p + pp] = acc;
    }
    let m_row = (((b * chunks + j) * heads + h) * q + i) * q;
    for s in 0..i + 1 {
        let t_s = time_of(j * q + s, padded, reverse);
        if t_s < len {
            let mut v = x[((b * len + t_s) * heads + h) * dim_p + pp];
            if scaled {
                v *= dt[(b * len + t_s) * heads + h];
            }
            acc += scores[m_row + s] * v;
        }
    }
    y[((b * len + t) * heads + h) * dim_p + pp] = acc;
}

/// The spanning sums of the intra-chunk pairs, step 1, in place: column `s` of the forward's
/// scores `M` `[b, c, h, q, q]` becomes `V[u, s] = Σ_{u' ≥ u} M[u', s] · (dy_{u'} · x̃_s)` for
/// `u > s`, the weight of the pairs from source `s` to a target at or after `u`. One thread
/// per `(b, j, h, s)`, which alone reads and writes column `s`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(super) fn pair_columns<F: Float>(
    x: &Tensor<F>,          // [b, l, h, p]
    dt: &Tensor<F>,         // [b, l, h]
    grad_y: &Tensor<F>,     // [b, l, h, p]
    scores: &mut Tensor<F>, // [b, c, h, q, q]
    batch: u32,
    len: u32,
    heads: u32,
    dim_p: u32,
    chunks: u32,
    q: u32,
    #[define(F)] _dtype: StorageType,
) {
    let len = len as usize;
    let heads = heads as usize;
    let dim_p = dim_p as usize;
    let chunks = chunks as usize;
    let q = q as usize;
    let id = ABSOLUTE_POS;
    if id >= batch as usize * chunks * heads * q {
        terminate!();
    }
    let s = id % q;
    let h = (id / q) % heads;
    let j = (id / (q * heads)) % chunks;
    let b = id / (q * heads * chunks);
    let t_s = j * q + s;
    if t_s >= len {
        terminate!();
    }
    let x_row = ((b * len + t_s) * heads + h) * dim_p;
    let step = dt[(b * len + t_s) * heads + h];
    let block = ((b * chunks + j) * heads + h) * q * q;
    let mut acc = F::new(0.0);
    for k in 0..q - 1 - s {
        let u = q - 1 - k;
        let t_u = j * q + u;
        if t_u < len {
            let dy_row = ((b * len + t_u) * heads + h) * dim_p;
            let mut dot = F::new(0.0);
            for pp in 0..dim_p {
                dot += grad_y[dy_row + pp] * x[x_row + pp];
            }
            acc += scores[block + u * q + s] * dot * step;
        }
        scores[block + u * q + s] = acc;
    }
}

/// The gradient of each step's log-decay, from the pairs (source, target) whose decay spans
/// it, per chunk: `∂L/∂dA_k = Σ_{s<k} V[k, s]` (both in the chunk, [`pair_columns`])
/// `+ Σ_{u≥k} dy_u · y_off_u` (sources before the chunk) `+ Σ_{s<k} x̃_s · dx̃_off_s` (targets
/// after it) `+ exp(Σ_chunk dA) · ⟨G_out, S_in⟩` (both outside), with `G_out` the adjoint
/// entering the chunk's end from later tokens (decayed by the next chunk's first step; the final
/// state's gradient after the last chunk) and `S_in` the state entering the chunk. Only
/// spanning pairs are summed, so nothing cancels. Also the gradient of `dt`:
/// `A · ∂L/∂dA + x · dx̃`. One thread per `(b, h, j)`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(super) fn decay_grads<F: Float>(
    x: &Tensor<F>,             // [b, l, h, p]
    dt: &Tensor<F>,            // [b, l, h]
    a: &Tensor<F>,             // [h]
    starts: &Tensor<F>,        // [b, l] (read when has_starts)
    y_off: &Tensor<F>,         // [b, l, h, p]: the forward's entering-state part
    grad_y: &Tensor<F>,        // [b, l, h, p]
    grad_x_dt: &Tensor<F>,     // [b, l, h, p]: dx̃
    grad_x_dt_off: &Tensor<F>, // [b, l, h, p]: the adjoint scan's entering-state part
    pairs: &Tensor<F>,         // [b, c, h, q, q]: V of pair_columns
    states: &Tensor<F>,        // [b, c+1, h, p, n]: forward, slot j the state entering chunk j
    adjoints: &Tensor<F>,      // [b, c+1, h, p, n]: reverse, slot c-1-j entering chunk j's end
    grad_da: &mut Tensor<F>,   // [b, l, h]
    grad_dt: &mut Tensor<F>,   // [b, l, h]
    batch: u32,
    len: u32,
    heads: u32,
    dim_p: u32,
    dim_n: u32,
    chunks: u32,
    q: u32,
    #[comptime] has_starts: bool,
    #[define(F)] _dtype: StorageType,
) {
    let len = len as usize;
    let heads = heads as usize;
    let dim_p = dim_p as usize;
    let dim_n = dim_n as usize;
    let chunks = chunks as usize;
    let q = q as usize;
    let id = ABSOLUTE_POS;
    if id >= batch as usize * heads * chunks {
        terminate!();
    }
    let j = id % chunks;
    let h = (id / chunks) % heads;
    let b = id / (chunks * heads);
    let per_head = dim_p * dim_n;
    let rate = a[h];
    // both ends outside the chunk: exp(T) ⟨G_out, S_in⟩, G_out decayed by the next chunk's
    // first step
    let s_row = ((b * (chunks + 1) + j) * heads + h) * per_head;
    let g_row = ((b * (chunks + 1) + chunks - 1 - j) * heads + h) * per_head;
    let mut outside = F::new(0.0);
    for e in 0..per_head {
        outside += states[s_row + e] * adjoints[g_row + e];
    }
    let mut total = F::new(0.0);
    for i in 0..q {
        let t = j * q + i;
        if t < len {
            let mut d = dt[(b * len + t) * heads + h] * rate;
            if has_starts {
                d += starts[b * len + t] * F::new(-1.0e4);
            }
            total += d;
        }
    }
    let next = (j + 1) * q;
    if next < len {
        let mut d = dt[(b * len + next) * heads + h] * rate;
        if has_starts {
            d += starts[b * len + next] * F::new(-1.0e4);
        }
        total += d;
    }
    outside *= total.exp();
    // targets after the chunk: Σ_{s<k} x̃_s · dx̃_off_s, written first, then added to
    let mut before = F::new(0.0);
    for i in 0..q {
        let t = j * q + i;
        if t < len {
            let base = ((b * len + t) * heads + h) * dim_p;
            grad_da[(b * len + t) * heads + h] = before;
            let mut term = F::new(0.0);
            for pp in 0..dim_p {
                term += x[base + pp] * grad_x_dt_off[base + pp];
            }
            before += dt[(b * len + t) * heads + h] * term;
        }
    }
    // sources before the chunk: Σ_{u≥k} dy_u · y_off_u; both in it: row k of V
    let block = ((b * chunks + j) * heads + h) * q * q;
    let mut after = F::new(0.0);
    for k in 0..q {
        let i = q - 1 - k;
        let t = j * q + i;
        if t < len {
            let base = ((b * len + t) * heads + h) * dim_p;
            let mut out_term = F::new(0.0);
            let mut in_term = F::new(0.0);
            for pp in 0..dim_p {
                out_term += grad_y[base + pp] * y_off[base + pp];
                in_term += x[base + pp] * grad_x_dt[base + pp];
            }
            after += out_term;
            let mut inside = F::new(0.0);
            for s in 0..i {
                inside += pairs[block + i * q + s];
            }
            let at = (b * len + t) * heads + h;
            let g = grad_da[at] + after + inside + outside;
            grad_da[at] = g;
            grad_dt[at] = g * rate + in_term;
        }
    }
}
