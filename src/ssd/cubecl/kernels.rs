//! The CubeCL kernels of the fused chunked scan ([`super::forward`], [`super::backward`]), on
//! contiguous tensors: what no matrix product does (the decays, the decay-weighted scores, the
//! recurrences over chunks, the layouts). `F` is `f32`, the type of every decay, state, sum and
//! product output; `E` the products' operand type (the model's: `f32`, `f16` or `bf16`), the
//! type of the operands' layouts and of the outputs in the inputs' type. Each kernel computes
//! in `F` and rounds to `E` only when it writes an `E` tensor.
//!
//! Dimension letters as in [`crate::ssd`]: `b` batch, `l` length, `h` heads (`r` per group),
//! `p` the input's head dimension, `g` groups, `n` the state dimension, `q` chunk length, `c`
//! chunks. A position `t ≥ l` of the padded sequence of `c·q` positions is padding: no input,
//! no decay.
//!
//! Every segment of log-decays is summed from its own terms as a loop walks along it (never as
//! a difference of two prefix sums), as in [`crate::ssd::chunked::segment_sums`], so the
//! document starts' `-10⁴` cannot cancel small terms; the log-decays' gradient sums only the
//! pairs that span each step.

use cubecl::prelude::*;

/// The sizes of a scan, which every kernel takes (`super::forward::Dims` at launch): batch,
/// length, heads, groups, the head and state dimensions, chunks and chunk length.
#[derive(CubeLaunch, CubeType)]
pub(super) struct Sizes {
    pub(super) batch: usize,
    pub(super) len: usize,
    pub(super) heads: usize,
    pub(super) groups: usize,
    pub(super) dim_p: usize,
    pub(super) dim_n: usize,
    pub(super) chunks: usize,
    pub(super) q: usize,
}

/// The per-step log-decays `dA[t] = dt[t]·a + starts[t]·(-10⁴)` `[b, h, c·q]`, their inclusive
/// sums within each chunk `cs` and the decay from each position to its chunk's end,
/// `to_end[i] = exp(Σ_{k=i+1}^{q-1} dA[k])` (both `[b, h, c·q]`). One thread per
/// `(b, h, chunk)`.
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub(super) fn decays<F: Float>(
    dt: &Tensor<F>,         // [b, l, h]
    a: &Tensor<F>,          // [h]
    starts: &Tensor<F>,     // [b, l] (read when has_starts)
    da: &mut Tensor<F>,     // [b, h, c·q]
    cs: &mut Tensor<F>,     // [b, h, c·q]
    to_end: &mut Tensor<F>, // [b, h, c·q]
    z: Sizes,
    #[comptime] has_starts: bool,
    #[define(F)] _dtype: StorageType,
) {
    let len = z.len;
    let heads = z.heads;
    let chunks = z.chunks;
    let q = z.q;
    let id = ABSOLUTE_POS;
    if id >= z.batch * heads * chunks {
        terminate!();
    }
    let j = id % chunks;
    let h = (id / chunks) % heads;
    let b = id / (chunks * heads);
    let row = (b * heads + h) * chunks * q;
    let rate = a[h];
    let mut sum = F::new(0.0);
    for i in 0..q {
        let t = j * q + i;
        let mut d = F::new(0.0);
        if t < len {
            d = dt[(b * len + t) * heads + h] * rate;
            if has_starts {
                d += starts[b * len + t] * F::new(-1.0e4);
            }
        }
        da[row + t] = d;
        sum += d;
        cs[row + t] = sum;
    }
    let mut seg = F::new(0.0);
    for k in 0..q {
        let t = j * q + q - 1 - k;
        to_end[row + t] = seg.exp();
        seg += da[row + t];
    }
}

/// The chunk layouts of a `[b, l, h, p]` tensor `v` that the products read, zero-padded to
/// `c·q` positions: per head `vc` `[b, c, h, q, p]`, and per group, scaled, `vw` `[b, c, g, q,
/// r·p]` (the heads of a group side by side). The scale is `decay` (`exp(decay)` when
/// `exp_decay`), times `dt` when `times_dt`: `x·dt·to_end` for the chunk states' operand of the
/// forward, `dy·exp(cs)` for the entering states' gradients. With `with_bc`, also `B` and `C`
/// in the chunk layout `[b, c, g, q, n]`. One thread per element of `[b, c, q, h, p]` (and of
/// `[b, c, q, g, n]` with `with_bc`, the larger of the two counts).
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
// `with_bc` is known at compile time and the bound is not: the kernel macro takes them in two
// `if`s, not as one condition
#[allow(clippy::collapsible_if)]
pub(super) fn chunk_layouts<F: Float, E: Float>(
    v: &Tensor<E>,      // [b, l, h, p]
    dt: &Tensor<F>,     // [b, l, h] (read when times_dt)
    decay: &Tensor<F>,  // [b, h, c·q]
    b_mat: &Tensor<E>,  // [b, l, g, n] (read when with_bc)
    c_mat: &Tensor<E>,  // [b, l, g, n] (read when with_bc)
    vc: &mut Tensor<E>, // [b, c, h, q, p]
    vw: &mut Tensor<E>, // [b, c, g, q, r·p]
    bc: &mut Tensor<E>, // [b, c, g, q, n] (written when with_bc)
    cc: &mut Tensor<E>, // [b, c, g, q, n] (written when with_bc)
    z: Sizes,
    #[comptime] times_dt: bool,
    #[comptime] exp_decay: bool,
    #[comptime] with_bc: bool,
    #[define(F, E)] _dtypes: [StorageType; 2],
) {
    let len = z.len;
    let heads = z.heads;
    let groups = z.groups;
    let dim_p = z.dim_p;
    let dim_n = z.dim_n;
    let chunks = z.chunks;
    let q = z.q;
    let id = ABSOLUTE_POS;
    if id < z.batch * chunks * q * heads * dim_p {
        let pp = id % dim_p;
        let h = (id / dim_p) % heads;
        let i = (id / (dim_p * heads)) % q;
        let j = (id / (dim_p * heads * q)) % chunks;
        let b = id / (dim_p * heads * q * chunks);
        let t = j * q + i;
        let mut value = F::new(0.0);
        let mut scaled = F::new(0.0);
        if t < len {
            value = F::cast_from(v[((b * len + t) * heads + h) * dim_p + pp]);
            let mut scale = decay[(b * heads + h) * chunks * q + t];
            if exp_decay {
                scale = scale.exp();
            }
            if times_dt {
                scale *= dt[(b * len + t) * heads + h];
            }
            scaled = value * scale;
        }
        vc[(((b * chunks + j) * heads + h) * q + i) * dim_p + pp] = E::cast_from(value);
        let r = heads / groups;
        let g = h / r;
        vw[(((b * chunks + j) * groups + g) * q + i) * r * dim_p + (h % r) * dim_p + pp] =
            E::cast_from(scaled);
    }
    if with_bc {
        if id < z.batch * chunks * q * groups * dim_n {
            let nn = id % dim_n;
            let g = (id / dim_n) % groups;
            let i = (id / (dim_n * groups)) % q;
            let j = (id / (dim_n * groups * q)) % chunks;
            let b = id / (dim_n * groups * q * chunks);
            let t = j * q + i;
            let dst = (((b * chunks + j) * groups + g) * q + i) * dim_n + nn;
            if t < len {
                let src = ((b * len + t) * groups + g) * dim_n + nn;
                bc[dst] = b_mat[src];
                cc[dst] = c_mat[src];
            } else {
                bc[dst] = E::new(0.0);
                cc[dst] = E::new(0.0);
            }
        }
    }
}

/// The intra-chunk matrix of each head, `M[i, s] = (C_i · B_s) · exp(Σ_{k=s+1}^{i} dA[k])`,
/// times `dt_s` when `times_dt`, for `s ≤ i` and 0 above the diagonal `[b, c, h, q, q]`, from
/// the scores `C·Bᵀ` of its group: `y = M · x` within the chunk (`M · x̃` without `dt`). One
/// thread per column `(b, j, h, s)`, walking down the column so that the segment sum grows by
/// one term per row (from its own terms), and a row's threads write adjacent elements.
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub(super) fn decay_scores<F: Float, E: Float>(
    cb: &Tensor<F>,    // [b, c, g, q, q]
    da: &Tensor<F>,    // [b, h, c·q]
    dt: &Tensor<F>,    // [b, l, h] (read when times_dt)
    m: &mut Tensor<E>, // [b, c, h, q, q]
    z: Sizes,
    #[comptime] times_dt: bool,
    #[define(F, E)] _dtypes: [StorageType; 2],
) {
    let len = z.len;
    let heads = z.heads;
    let groups = z.groups;
    let chunks = z.chunks;
    let q = z.q;
    let id = ABSOLUTE_POS;
    if id >= z.batch * chunks * heads * q {
        terminate!();
    }
    let s = id % q;
    let h = (id / q) % heads;
    let j = (id / (q * heads)) % chunks;
    let b = id / (q * heads * chunks);
    let g = h / (heads / groups);
    let t_s = j * q + s;
    let mut step = F::new(1.0);
    if times_dt {
        step = F::new(0.0);
        if t_s < len {
            step = dt[(b * len + t_s) * heads + h];
        }
    }
    let cb_block = ((b * chunks + j) * groups + g) * q * q;
    let m_block = ((b * chunks + j) * heads + h) * q * q;
    let row = (b * heads + h) * chunks * q + j * q;
    for i in 0..s {
        m[m_block + i * q + s] = E::new(0.0);
    }
    m[m_block + s * q + s] = E::cast_from(cb[cb_block + s * q + s] * step);
    let mut seg = F::new(0.0);
    for k in 0..q - 1 - s {
        let i = s + 1 + k;
        seg += da[row + i];
        m[m_block + i * q + s] = E::cast_from(cb[cb_block + i * q + s] * seg.exp() * step);
    }
}

/// The inter-chunk recurrence from the chunk states from zero (a product of [`chunk_layouts`]' `vw` with `B`):
/// `S[0] = initial`, `S[j+1] = exp(Σ_chunk dA) · S[j] + chunk[j]` into `states`
/// `[b, c+1, h, p, n]` (slot `j` the state entering chunk `j`, slot `c` the final state). One
/// thread per `(b, h, p, n)`, looping over the chunks. With `with_e` (an operand type other than
/// `f32`) the states also in `E`, `states_e`, the operand of the products; the final state
/// alone, `last` (contiguous).
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub(super) fn pass_states<F: Float, E: Float>(
    initial: &Tensor<F>,      // [b, h, p, n] (read when has_initial)
    cs: &Tensor<F>,           // [b, h, c·q]
    chunk: &Tensor<F>,        // [b, c, h, p, n]
    states: &mut Tensor<F>,   // [b, c+1, h, p, n]
    states_e: &mut Tensor<E>, // [b, c+1, h, p, n] (written when with_e)
    last: &mut Tensor<F>,     // [b, h, p, n]
    z: Sizes,
    #[comptime] has_initial: bool,
    #[comptime] with_e: bool,
    #[define(F, E)] _dtypes: [StorageType; 2],
) {
    let heads = z.heads;
    let per_head = z.dim_p * z.dim_n;
    let chunks = z.chunks;
    let q = z.q;
    let id = ABSOLUTE_POS;
    if id >= z.batch * heads * per_head {
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
    let first = ((b * (chunks + 1)) * heads + h) * per_head + e;
    states[first] = s;
    if with_e {
        states_e[first] = E::cast_from(s);
    }
    for j in 0..chunks {
        let from = ((b * chunks + j) * heads + h) * per_head + e;
        s = cs[row + j * q + q - 1].exp() * s + chunk[from];
        let to = ((b * (chunks + 1) + j + 1) * heads + h) * per_head + e;
        states[to] = s;
        if with_e {
            states_e[to] = E::cast_from(s);
        }
    }
    last[id] = s;
}

/// The output `y_t = y_diag + exp(Σ_{k ≤ i} dA[k]) · y_off` at time `t` (position `i` of chunk
/// `j`), from the intra-chunk product `y_diag` `[b, c, h, q, p]` and the entering states' part
/// `y_off = C_t · S[j]` `[b, c, g, q, r·p]`. One thread per element of `y` `[b, l, h, p]`.
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub(super) fn combine_output<F: Float, E: Float>(
    y_diag: &Tensor<F>, // [b, c, h, q, p]
    y_off: &Tensor<F>,  // [b, c, g, q, r·p]
    cs: &Tensor<F>,     // [b, h, c·q]
    y: &mut Tensor<E>,  // [b, l, h, p]
    z: Sizes,
    #[define(F, E)] _dtypes: [StorageType; 2],
) {
    let len = z.len;
    let heads = z.heads;
    let groups = z.groups;
    let dim_p = z.dim_p;
    let chunks = z.chunks;
    let q = z.q;
    let id = ABSOLUTE_POS;
    if id >= z.batch * len * heads * dim_p {
        terminate!();
    }
    let pp = id % dim_p;
    let h = (id / dim_p) % heads;
    let t = (id / (dim_p * heads)) % len;
    let b = id / (dim_p * heads * len);
    let j = t / q;
    let i = t % q;
    let r = heads / groups;
    let g = h / r;
    let diag = y_diag[(((b * chunks + j) * heads + h) * q + i) * dim_p + pp];
    let off = y_off[(((b * chunks + j) * groups + g) * q + i) * r * dim_p + (h % r) * dim_p + pp];
    y[id] = E::cast_from(diag + cs[(b * heads + h) * chunks * q + t].exp() * off);
}

/// The adjoint of the inter-chunk recurrence: `G[c] = dS_final`, `G[j] = D[j] + exp(Σ_chunk
/// dA) · G[j+1]` into `adjoints` `[b, c+1, h, p, n]` (slot `j` the gradient of the state
/// entering chunk `j`; slot 0 that of the initial state), with `D[j]` the gradient of the
/// entering state through chunk `j`'s outputs. One thread per `(b, h, p, n)`, looping over the
/// chunks backwards. With `with_e` the adjoints also in `E`, `adjoints_e`, the operand of the
/// products; `G[0]` alone, `first` (contiguous: the initial state's gradient).
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub(super) fn pass_adjoints<F: Float, E: Float>(
    grad_final: &Tensor<F>,     // [b, h, p, n]
    cs: &Tensor<F>,             // [b, h, c·q]
    direct: &Tensor<F>,         // [b, c, h, p, n]
    adjoints: &mut Tensor<F>,   // [b, c+1, h, p, n]
    adjoints_e: &mut Tensor<E>, // [b, c+1, h, p, n] (written when with_e)
    first: &mut Tensor<F>,      // [b, h, p, n]
    z: Sizes,
    #[comptime] with_e: bool,
    #[define(F, E)] _dtypes: [StorageType; 2],
) {
    let heads = z.heads;
    let per_head = z.dim_p * z.dim_n;
    let chunks = z.chunks;
    let q = z.q;
    let id = ABSOLUTE_POS;
    if id >= z.batch * heads * per_head {
        terminate!();
    }
    let e = id % per_head;
    let h = (id / per_head) % heads;
    let b = id / (per_head * heads);
    let row = (b * heads + h) * chunks * q;
    let mut g = grad_final[id];
    let last = ((b * (chunks + 1) + chunks) * heads + h) * per_head + e;
    adjoints[last] = g;
    if with_e {
        adjoints_e[last] = E::cast_from(g);
    }
    for k in 0..chunks {
        let j = chunks - 1 - k;
        g = direct[((b * chunks + j) * heads + h) * per_head + e]
            + cs[row + j * q + q - 1].exp() * g;
        let to = ((b * (chunks + 1) + j) * heads + h) * per_head + e;
        adjoints[to] = g;
        if with_e {
            adjoints_e[to] = E::cast_from(g);
        }
    }
    first[id] = g;
}

/// The intra-chunk pairs' part of the gradients, per head, from `dyx[i, s] = dy_i · x_s`
/// `[b, c, h, q, q]` (overwritten): `T[i, s] = dyx[i, s] · L[i, s] · dt_s` for `s ≤ i`, 0 above
/// (summed over a group's heads, the gradient of its scores `C·Bᵀ`), and the spanning sums
/// `V[k, s] = Σ_{i ≥ k} T[i, s] · CB[i, s]` for `s < k`, 0 elsewhere, `[b, c, h, q, q]`: the
/// pairs `(s, i)` whose decay spans step `k` (`∂L/∂dA_k` has `Σ_s V[k, s]`). One thread per
/// column `(b, j, h, s)`: down the column for `L` (from its own terms), back up for `V`.
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub(super) fn pair_sums<F: Float>(
    dyx: &mut Tensor<F>, // [b, c, h, q, q]: dy·xᵀ in, T out
    cb: &Tensor<F>,      // [b, c, g, q, q]
    da: &Tensor<F>,      // [b, h, c·q]
    dt: &Tensor<F>,      // [b, l, h]
    v: &mut Tensor<F>,   // [b, c, h, q, q]
    z: Sizes,
    #[define(F)] _dtype: StorageType,
) {
    let len = z.len;
    let heads = z.heads;
    let groups = z.groups;
    let chunks = z.chunks;
    let q = z.q;
    let id = ABSOLUTE_POS;
    if id >= z.batch * chunks * heads * q {
        terminate!();
    }
    let s = id % q;
    let h = (id / q) % heads;
    let j = (id / (q * heads)) % chunks;
    let b = id / (q * heads * chunks);
    let g = h / (heads / groups);
    let t_s = j * q + s;
    let mut step = F::new(0.0);
    if t_s < len {
        step = dt[(b * len + t_s) * heads + h];
    }
    let cb_block = ((b * chunks + j) * groups + g) * q * q;
    let block = ((b * chunks + j) * heads + h) * q * q;
    let row = (b * heads + h) * chunks * q + j * q;
    for i in 0..s {
        dyx[block + i * q + s] = F::new(0.0);
    }
    for i in 0..s + 1 {
        v[block + i * q + s] = F::new(0.0);
    }
    dyx[block + s * q + s] *= step;
    let mut seg = F::new(0.0);
    for k in 0..q - 1 - s {
        let i = s + 1 + k;
        seg += da[row + i];
        dyx[block + i * q + s] *= seg.exp() * step;
    }
    let mut acc = F::new(0.0);
    for k in 0..q - 1 - s {
        let i = q - 1 - k;
        acc += dyx[block + i * q + s] * cb[cb_block + i * q + s];
        v[block + i * q + s] = acc;
    }
}

/// The gradients at each position: `dx̃ = dx̃_diag + to_end · (G · B)` (the intra-chunk
/// product's and the chunk state's), `dx = dt · dx̃` `[b, l, h, p]`, and three terms of the
/// log-decays' gradient `[b, h, c·q]`: `u_t = dy_t · y_off_t` (the entering state's output,
/// `exp(cs)` included), `w_t = to_end_t · dt_t · (x_t · (G · B)_t)` (the chunk state's
/// weight) and `xdx_t = x_t · dx̃_t` (`dt`'s gradient through `x̃`). One thread per `(b, t, h)`.
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub(super) fn position_grads<F: Float, E: Float>(
    x: &Tensor<E>,          // [b, l, h, p]
    dt: &Tensor<F>,         // [b, l, h]
    grad_y: &Tensor<E>,     // [b, l, h, p]
    y_off: &Tensor<F>,      // [b, c, g, q, r·p]: C · S_inᵀ, without exp(cs)
    cs: &Tensor<F>,         // [b, h, c·q]
    to_end: &Tensor<F>,     // [b, h, c·q]
    dx_diag: &Tensor<F>,    // [b, c, h, q, p]: Mᵀ · dy
    gb: &Tensor<F>,         // [b, c, g, q, r·p]: B · Gᵀ
    grad_x: &mut Tensor<E>, // [b, l, h, p]
    u: &mut Tensor<F>,      // [b, h, c·q]
    w: &mut Tensor<F>,      // [b, h, c·q]
    xdx: &mut Tensor<F>,    // [b, h, c·q]
    z: Sizes,
    #[define(F, E)] _dtypes: [StorageType; 2],
) {
    let len = z.len;
    let heads = z.heads;
    let groups = z.groups;
    let dim_p = z.dim_p;
    let chunks = z.chunks;
    let q = z.q;
    let id = ABSOLUTE_POS;
    if id >= z.batch * len * heads {
        terminate!();
    }
    let h = id % heads;
    let t = (id / heads) % len;
    let b = id / (heads * len);
    let j = t / q;
    let i = t % q;
    let r = heads / groups;
    let g = h / r;
    let at = (b * heads + h) * chunks * q + t;
    let decay_out = cs[at].exp();
    let decay_end = to_end[at];
    let step = dt[id];
    let base = id * dim_p;
    let diag = (((b * chunks + j) * heads + h) * q + i) * dim_p;
    let group = (((b * chunks + j) * groups + g) * q + i) * r * dim_p + (h % r) * dim_p;
    let mut sum_u = F::new(0.0);
    let mut sum_w = F::new(0.0);
    let mut sum_x = F::new(0.0);
    for pp in 0..dim_p {
        let xv = F::cast_from(x[base + pp]);
        let gbv = gb[group + pp];
        let dxt = dx_diag[diag + pp] + decay_end * gbv;
        grad_x[base + pp] = E::cast_from(step * dxt);
        sum_u += F::cast_from(grad_y[base + pp]) * y_off[group + pp];
        sum_w += xv * gbv;
        sum_x += xv * dxt;
    }
    u[at] = decay_out * sum_u;
    w[at] = decay_end * step * sum_w;
    xdx[at] = sum_x;
}

/// The gradient of each step's log-decay, from the pairs (source, target) whose decay spans
/// it, per chunk: `∂L/∂dA_k = Σ_{i ≥ k} u_i` (sources before the chunk) `+ Σ_{s < k} w_s`
/// (targets after it) `+ pairs_k` (both in it: `Σ_s V[k, s]`) `+ exp(Σ_chunk dA) · ⟨G[j+1],
/// S[j]⟩` (both outside); only spanning pairs are summed, so nothing cancels. Also the
/// gradient of `dt`, `A · ∂L/∂dA + x · dx̃`, and each chunk's part of `A`'s gradient,
/// `Σ_t ∂L/∂dA_t · dt_t` `[b, c, h]`. One thread per `(b, h, j)`, looping over the chunk twice.
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub(super) fn decay_scans<F: Float>(
    a: &Tensor<F>,           // [h]
    dt: &Tensor<F>,          // [b, l, h]
    cs: &Tensor<F>,          // [b, h, c·q]
    u: &Tensor<F>,           // [b, h, c·q]
    w: &Tensor<F>,           // [b, h, c·q]
    xdx: &Tensor<F>,         // [b, h, c·q]
    pairs: &Tensor<F>,       // [b, c, h, q]
    outside: &Tensor<F>,     // [b, c, h]: ⟨G[j+1], S[j]⟩
    grad_da: &mut Tensor<F>, // [b, l, h]
    grad_dt: &mut Tensor<F>, // [b, l, h]
    grad_a: &mut Tensor<F>,  // [b, c, h]: this chunk's part
    z: Sizes,
    #[define(F)] _dtype: StorageType,
) {
    let len = z.len;
    let heads = z.heads;
    let chunks = z.chunks;
    let q = z.q;
    let id = ABSOLUTE_POS;
    if id >= z.batch * heads * chunks {
        terminate!();
    }
    let j = id % chunks;
    let h = (id / chunks) % heads;
    let b = id / (chunks * heads);
    let row = (b * heads + h) * chunks * q + j * q;
    let both = ((b * chunks + j) * heads + h) * q;
    let out = outside[(b * chunks + j) * heads + h] * cs[row + q - 1].exp();
    // targets after the chunk: Σ_{s<k} w_s, written first
    // (padding, at the end, has no terms: `u`, `w` and `xdx` are not written there)
    let mut before = F::new(0.0);
    for i in 0..q {
        let t = j * q + i;
        if t < len {
            grad_da[(b * len + t) * heads + h] = before;
            before += w[row + i];
        }
    }
    // sources before the chunk: Σ_{i≥k} u_i; both in it; both outside
    let rate = a[h];
    let mut after = F::new(0.0);
    let mut part_a = F::new(0.0);
    for k in 0..q {
        let i = q - 1 - k;
        let t = j * q + i;
        if t < len {
            after += u[row + i];
            let at = (b * len + t) * heads + h;
            let g = grad_da[at] + after + pairs[both + i] + out;
            grad_da[at] = g;
            grad_dt[at] = g * rate + xdx[row + i];
            part_a += g * dt[at];
        }
    }
    grad_a[(b * chunks + j) * heads + h] = part_a;
}

/// The gradients of `B` and `C` in their input layout `[b, l, g, n]` from the chunk layout's
/// two parts each `[b, c, g, q, n]`. One thread per element of `[b, l, g, n]`.
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub(super) fn unchunk_bc<F: Float, E: Float>(
    grad_b1: &Tensor<F>,    // [b, c, g, q, n]
    grad_b2: &Tensor<F>,    // [b, c, g, q, n]
    grad_c1: &Tensor<F>,    // [b, c, g, q, n]
    grad_c2: &Tensor<F>,    // [b, c, g, q, n]
    grad_b: &mut Tensor<E>, // [b, l, g, n]
    grad_c: &mut Tensor<E>, // [b, l, g, n]
    z: Sizes,
    #[define(F, E)] _dtypes: [StorageType; 2],
) {
    let len = z.len;
    let groups = z.groups;
    let dim_n = z.dim_n;
    let chunks = z.chunks;
    let q = z.q;
    let id = ABSOLUTE_POS;
    if id >= z.batch * len * groups * dim_n {
        terminate!();
    }
    let nn = id % dim_n;
    let g = (id / dim_n) % groups;
    let t = (id / (dim_n * groups)) % len;
    let b = id / (dim_n * groups * len);
    let j = t / q;
    let i = t % q;
    let src = (((b * chunks + j) * groups + g) * q + i) * dim_n + nn;
    grad_b[id] = E::cast_from(grad_b1[src] + grad_b2[src]);
    grad_c[id] = E::cast_from(grad_c1[src] + grad_c2[src]);
}
