//! The chunked SSD as tensor operations ("4 steps", the ssd_minimal form), one function per
//! step: the chunk layout and discretisation, the intra-chunk (diagonal) blocks, the chunk
//! states, the inter-chunk recurrence and the off-diagonal blocks. It runs on any backend and
//! is what the fused kernels are tested against. Dimension letters as in the [module](super)
//! documentation.

use burn::tensor::{backend::Backend, Bool, DType, Tensor};

use super::input::SsdInput;
use crate::precision::{cast_to, upcast};

/// Step 0, the chunk layout: right-pads the sequence with zeros to a multiple of the chunk
/// length `q` and cuts it into `c` chunks, heads grouped by the B/C group they read. Padding is
/// exact: `dt = 0` there (decay 1) and `x = 0` (no input), so the final state is the state after
/// the last real token. The results are views where the layout allows: the next element-wise
/// step writes them out contiguously, so the products that follow read contiguous operands.
///
/// # Shapes
/// - x: `[b, l, h, p]`, dt: `[b, l, h]`, b_mat, c_mat: `[b, l, g, n]`
/// - returns x `[b, c, g, r, q, p]`, dt `[b, c, g, r, q]`, Bᵀ `[b, c, g, n, q]` and
///   C `[b, c, g, q, n]`
#[allow(clippy::type_complexity)]
pub(crate) fn chunk<B: Backend>(
    x: Tensor<B, 4>,
    dt: Tensor<B, 3>,
    b_mat: Tensor<B, 4>,
    c_mat: Tensor<B, 4>,
    q: usize,
) -> (Tensor<B, 6>, Tensor<B, 5>, Tensor<B, 5>, Tensor<B, 5>) {
    let [b, l, h, p] = x.dims();
    let [_, _, g, n] = b_mat.dims();
    let r = h / g;
    let c = l.div_ceil(q);
    let (x, dt) = (pad_time(x, q), pad_time(dt, q));
    let (b_mat, c_mat) = (pad_time(b_mat, q), pad_time(c_mat, q));
    let x = x.reshape([b, c, q, g, r, p]).permute([0, 1, 3, 4, 2, 5]);
    let dt = dt.reshape([b, c, q, g, r]).permute([0, 1, 3, 4, 2]);
    let b_t = b_mat.reshape([b, c, q, g, n]).permute([0, 1, 3, 4, 2]);
    let c_mat = c_mat.reshape([b, c, q, g, n]).swap_dims(2, 3);
    (x, dt, b_t, c_mat)
}

/// Discretisation (zero-order hold on A, Euler on B, as the reference does):
/// `x̃ = x · dt` and `dA = dt · A`, in the chunk layout of [`chunk`].
///
/// # Shapes
/// - x: `[b, c, g, r, q, p]`, dt: `[b, c, g, r, q]`, a: `[h]` with `h = g·r`
/// - returns x̃ `[b, c, g, r, q, p]` (contiguous) and dA `[b, c, g, r, q]` (the log of the
///   per-step decay, ≤ 0)
pub(crate) fn discretize<B: Backend>(
    x: Tensor<B, 6>,
    dt: Tensor<B, 5>,
    a: Tensor<B, 1>,
) -> (Tensor<B, 6>, Tensor<B, 5>) {
    let [_, _, g, r, _, _] = x.dims();
    // the broadcast operand first: the product is written out in the logical (chunk) order
    let x_dt = dt.clone().unsqueeze_dim::<6>(5) * x;
    let da = dt * a.reshape([1, 1, g, r, 1]);
    (x_dt, da)
}

/// The log-decay added at a document's first token in the chunked form: every decay across a
/// document start becomes `exp(≤ -10⁴) = 0` exactly, in `f32` and `f64`, with a zero gradient.
pub(crate) const DOCUMENT_START_LOG_DECAY: f64 = -1.0e4;

/// Document starts in the chunk layout: `dA + DOCUMENT_START_LOG_DECAY · start`.
///
/// # Shapes
/// - da: `[b, c, g, r, q]`, starts: `[b, l]` (1 at a document's first token, else 0; `l ≤ c·q`)
/// - returns `[b, c, g, r, q]`
pub(crate) fn start_documents<B: Backend>(da: Tensor<B, 5>, starts: Tensor<B, 2>) -> Tensor<B, 5> {
    let [b, c, _, _, q] = da.dims();
    let starts = pad_time(cast_to(starts, da.dtype()), q).reshape([b, c, 1, 1, q]);
    da + starts * DOCUMENT_START_LOG_DECAY
}

/// The log-decay from each position to the end of its chunk, `Σ_{k=l+1}^{q-1} dA[k]`, summed
/// from its own terms (one product with the strictly-lower-triangular matrix of ones), not as
/// the difference of two cumulative sums: a difference would cancel the large
/// [`DOCUMENT_START_LOG_DECAY`] terms and lose the small ones.
///
/// # Shapes
/// - da: `[b, c, g, r, q]`; returns the same shape
pub(crate) fn chunk_decay_to_end<B: Backend>(da: Tensor<B, 5>) -> Tensor<B, 5> {
    let [b, c, g, r, q] = da.dims();
    // later[k, l] = 1 for k > l
    let later = tril_ones::<B>(q, -1, da.dtype(), &da.device());
    da.reshape([b * c * g * r, q])
        .matmul(later)
        .reshape([b, c, g, r, q])
}

/// The inclusive cumulative sum of the log-decays within each chunk, `Acs[l] = Σ_{k ≤ l} dA[k]`,
/// as one product with the `q × q` upper-triangular matrix of ones: each entry sums exactly the
/// same terms as a running sum, and the whole tensor is one matrix multiplication, which
/// every backend runs as a tuned kernel (burn-ndarray's cumulative sum along the last axis is a
/// strided loop; burn-cubecl's re-reads each prefix).
///
/// # Shapes
/// - da: `[b, c, g, r, q]`; returns the same shape
pub(crate) fn chunk_cumsum<B: Backend>(da: Tensor<B, 5>) -> Tensor<B, 5> {
    let [b, c, g, r, q] = da.dims();
    // upper[k, i] = 1 for k ≤ i
    let upper = lower_mask::<B>(q, da.dtype(), &da.device()).transpose();
    da.reshape([b * c * g * r, q])
        .matmul(upper)
        .reshape([b, c, g, r, q])
}

/// The stable segment sums of a sequence of log-decays, below the diagonal:
/// `out[m, i, j] = Σ_{k=j+1}^{i} a[m, k]` for `i > j`, and 0 for `i ≤ j`.
///
/// Each entry is summed from the segment's own terms, never as a difference of two prefix
/// sums, so its error is relative to the segment, not to the whole sequence (the log-decays are
/// all ≤ 0: no cancellation). It is one batched product of the `t × t` lower-triangular matrix
/// of ones with the strictly-lower-triangular copies of `a`, `x[m, k, j] = a[m, k]` for
/// `j < k`: every product term is exact (a factor 1 or 0), and a matrix product runs well on
/// every backend, where a cumulative sum along an axis is a naive kernel on burn-cubecl (each
/// output re-reads its prefix; its backward runs it again). `exp` of it is the decay
/// matrix on and below the diagonal and exactly 1 above it, finite everywhere: callers zero the
/// upper triangle with a multiplicative mask ([`lower_mask`]), so no infinity ever enters the
/// graph and gradients stay finite.
///
/// # Shapes
/// - a: `[m, t]`
/// - returns `[m, t, t]`
pub(crate) fn segment_sums<B: Backend>(a: Tensor<B, 2>) -> Tensor<B, 3> {
    let t = a.dims()[1];
    let (dtype, device) = (a.dtype(), a.device());
    let strict_lower = tril_ones::<B>(t, -1, dtype, &device);
    let lower = lower_mask::<B>(t, dtype, &device);
    // x[m, k, j] = a[m, k] for j < k, else 0; out[m, i, j] = Σ_{k ≤ i} x[m, k, j]
    let x = a.unsqueeze_dim::<3>(2) * strict_lower.unsqueeze::<3>();
    lower.unsqueeze::<3>().matmul(x)
}

/// The causal mask of a `t × t` block: 1 for `j ≤ i`, 0 above the diagonal.
///
/// # Shapes
/// - returns `[t, t]`
pub(crate) fn lower_mask<B: Backend>(t: usize, dtype: DType, device: &B::Device) -> Tensor<B, 2> {
    tril_ones::<B>(t, 0, dtype, device)
}

/// 1 for `j ≤ i + diagonal`, 0 elsewhere, as floats of `dtype` (`diagonal` -1: the strict lower
/// triangle, 0: with the diagonal).
///
/// # Shapes
/// - returns `[t, t]`
fn tril_ones<B: Backend>(
    t: usize,
    diagonal: i64,
    dtype: DType,
    device: &B::Device,
) -> Tensor<B, 2> {
    // tril_mask marks the entries outside the triangle
    let mask = Tensor::<B, 2, Bool>::tril_mask([t, t], diagonal, device);
    cast_to(mask.bool_not().float(), dtype)
}

/// The stable segment sum, exponentiated: the 1-semiseparable decay matrix of a sequence of
/// log-decays.
///
/// `out[m, i, j] = exp(Σ_{k=j+1}^{i} a[m, k])` for `i ≥ j` (1 on the diagonal) and exactly 0
/// for `i < j` ([`segment_sums`], exponentiated and masked).
///
/// # Shapes
/// - a: `[m, t]`
/// - returns `[m, t, t]`
pub(crate) fn segsum_exp<B: Backend>(a: Tensor<B, 2>) -> Tensor<B, 3> {
    let t = a.dims()[1];
    let lower = lower_mask::<B>(t, a.dtype(), &a.device());
    decay_matrix(a) * lower.unsqueeze::<3>()
}

/// The decay matrix of each row of log-decays, on and below the diagonal, and exactly 1 above
/// it (finite everywhere; callers zero the upper triangle with [`lower_mask`]):
/// `out[m, i, j] = exp(Σ_{k=j+1}^{i} a[m, k])` for `i ≥ j`, `exp` of the stable
/// [`segment_sums`].
///
/// # Shapes
/// - a: `[m, t]`
/// - returns `[m, t, t]`
pub(crate) fn decay_matrix<B: Backend>(a: Tensor<B, 2>) -> Tensor<B, 3> {
    segment_sums(a).exp()
}

/// Right-pads the time axis (dim 1) with zeros to a multiple of `q`.
///
/// # Shapes
/// - t: `[b, l, ...]`; returns `[b, c·q, ...]` with `c = ⌈l / q⌉`
fn pad_time<B: Backend, const D: usize>(t: Tensor<B, D>, q: usize) -> Tensor<B, D> {
    let dims = t.dims();
    let l = dims[1];
    let pad = l.div_ceil(q) * q - l;
    if pad == 0 {
        return t;
    }
    let mut zero_dims = dims;
    zero_dims[1] = pad;
    let zeros = Tensor::<B, D>::zeros(zero_dims, (&t.device(), t.dtype()));
    Tensor::cat(vec![t, zeros], 1)
}

/// Step 1, the diagonal blocks ("attention mode"): the output of each chunk from the inputs of
/// the same chunk.
///
/// `y_diag[l] = Σ_{s ≤ l} (C_l · B_s) · exp(Σ_{k=s+1}^{l} dA_k) · x̃_s`
///
/// `C·Bᵀ` is computed once per group and masked there (the mask costs `r` times less than on
/// the per-head decay), then scales the per-head decay.
///
/// # Shapes
/// - x_dt: `[b, c, g, r, q, p]`, da: `[b, c, g, r, q]`, b_t: `[b, c, g, n, q]`,
///   c_mat: `[b, c, g, q, n]`
/// - returns `[b, c, g, r, q, p]`
pub(crate) fn chunk_diagonal<B: Backend>(
    x_dt: Tensor<B, 6>,
    da: Tensor<B, 5>,
    b_t: Tensor<B, 5>,
    c_mat: Tensor<B, 5>,
) -> Tensor<B, 6> {
    let [b, c, g, r, q] = da.dims();
    let lower = lower_mask::<B>(q, da.dtype(), &da.device());
    // causal C·Bᵀ per group: [b, c, g, 1, q(l), q(s)]. The mask is expanded to the product's
    // full shape: burn-fusion 0.21 fuses an element-wise op into the product that precedes it,
    // and got this product wrong when the mask was broadcast from `[1, 1, 1, q, q]` (Wgpu and
    // Cuda, with autodiff; an expanded view, or a fusion boundary between the two, is right).
    let cb = c_mat.matmul(b_t);
    let mask = lower.unsqueeze::<5>().expand(cb.dims());
    let cb = (cb * mask).unsqueeze_dim::<6>(3);
    // decay per head, 1 above the diagonal (zeroed by cb): [b, c, g, r, q, q]
    let decay = decay_matrix(da.reshape([b * c * g * r, q])).reshape([b, c, g, r, q, q]);
    (decay * cb).matmul(x_dt)
}

/// Step 2, the chunk states ("B terms"): the state at the end of each chunk, assuming a zero
/// state at its start, transposed (`n` before `p`, so that both products of the state read
/// contiguous operands).
///
/// `states[c]ᵀ = Σ_l exp(Σ_{k=l+1}^{q-1} dA[k]) · B_l ⊗ x̃_l`
///
/// # Shapes
/// - x_dt: `[b, c, g, r, q, p]`, to_end: `[b, c, g, r, q]` ([`chunk_decay_to_end`]),
///   b_t: `[b, c, g, n, q]`
/// - returns `[b, c, g, r, n, p]`
pub(crate) fn chunk_states<B: Backend>(
    x_dt: Tensor<B, 6>,
    to_end: Tensor<B, 5>,
    b_t: Tensor<B, 5>,
) -> Tensor<B, 6> {
    // [b, c, g, r, q, 1]
    let decay_to_end = to_end.exp().unsqueeze_dim::<6>(5);
    // Bᵀ of the group, shared by its r heads, times the decayed inputs
    b_t.unsqueeze_dim::<6>(3).matmul(x_dt * decay_to_end)
}

/// Up to this many chunks, [`state_passing`] uses the matrix form; beyond, the loop.
pub(crate) const STATE_PASSING_MATRIX_MAX_CHUNKS: usize = 128;

/// Step 3, the inter-chunk recurrence ("A terms"): the state entering every chunk, and the
/// final state.
///
/// `S_in[0] = S_init`, `S_in[j+1] = exp(Acs_j[q-1]) · S_in[j] + states[j]`, final = `S_in[c]`:
/// a scalar linear recurrence over the `c` chunks. On an autodiff backend, up to
/// [`STATE_PASSING_MATRIX_MAX_CHUNKS`] chunks, it runs in the spec's matrix form (one product
/// with the `(c+1)×(c+1)` decay matrix of the chunk boundaries, whose gradient needs no
/// per-chunk slicing); otherwise as a loop over the chunks (as the reference kernel's state
/// passing does), whose cost grows linearly with the sequence length.
///
/// # Shapes
/// - states: `[b, c, g, r, n, p]`, chunk_decay: `[b, g, r, c]` (sum of dA over each chunk, per
///   head),
///   initial: `[b, g, r, n, p]` (the state transposed, as [`chunk_states`] returns it; the
///   recurrence is element-wise in the last two dimensions, so either order works)
/// - returns the entering states `[b, c, g, r, n, p]` and the final state `[b, g, r, n, p]`
pub(crate) fn state_passing<B: Backend>(
    states: Tensor<B, 6>,
    chunk_decay: Tensor<B, 4>,
    initial: Tensor<B, 5>,
) -> (Tensor<B, 6>, Tensor<B, 5>) {
    // the matrix form costs O(c²) but its gradient needs no per-chunk slices; without autodiff
    // the loop's O(c) wins
    let c = states.dims()[1];
    let tracked = B::ad_enabled(&states.device());
    if tracked && c <= STATE_PASSING_MATRIX_MAX_CHUNKS {
        state_passing_matrix(states, chunk_decay, initial)
    } else {
        state_passing_loop(states, chunk_decay, initial)
    }
}

/// [`state_passing`] as a product: `S_in' = exp(segsum([0, T_0, …, T_{c-1}])) · [S_init,
/// states]`, with `S_in'[z]` the state entering chunk `z` and `S_in'[c]` the final state.
///
/// # Shapes
/// - as [`state_passing`]
pub(crate) fn state_passing_matrix<B: Backend>(
    states: Tensor<B, 6>,
    chunk_decay: Tensor<B, 4>,
    initial: Tensor<B, 5>,
) -> (Tensor<B, 6>, Tensor<B, 5>) {
    let [b, c, g, r, p, n] = states.dims();
    let m = b * g * r;
    // log-decays of the chunk boundaries, a leading 0 for the initial state: [b·g·r, c+1]
    let log_decay = chunk_decay.reshape([m, c]);
    let log_decay = Tensor::cat(
        vec![
            Tensor::zeros([m, 1], (&log_decay.device(), log_decay.dtype())),
            log_decay,
        ],
        1,
    );
    let decay = segsum_exp(log_decay).reshape([b, g, r, c + 1, c + 1]);
    // [S_init, states] as [b, g, r, c+1, p·n]
    let all = Tensor::cat(vec![initial.unsqueeze_dim::<6>(1), states], 1)
        .permute([0, 2, 3, 1, 4, 5])
        .reshape([b, g, r, c + 1, p * n]);
    // row z of the product: the state entering chunk z; row c: the final state
    let passed = decay.matmul(all);
    let entering = passed
        .clone()
        .narrow(3, 0, c)
        .reshape([b, g, r, c, p, n])
        .permute([0, 3, 1, 2, 4, 5]);
    let final_state = passed.narrow(3, c, 1).reshape([b, g, r, p, n]);
    (entering, final_state)
}

/// [`state_passing`] as a loop over the chunks.
///
/// # Shapes
/// - as [`state_passing`]
pub(crate) fn state_passing_loop<B: Backend>(
    states: Tensor<B, 6>,
    chunk_decay: Tensor<B, 4>,
    initial: Tensor<B, 5>,
) -> (Tensor<B, 6>, Tensor<B, 5>) {
    let [b, c, g, r, p, n] = states.dims();
    let decay = chunk_decay.exp(); // [b, g, r, c]
    let mut state = initial;
    let mut entering = Vec::with_capacity(c);
    for j in 0..c {
        entering.push(state.clone());
        let decay_j = decay.clone().narrow(3, j, 1).unsqueeze_dim::<5>(4);
        let states_j = states.clone().narrow(1, j, 1).reshape([b, g, r, p, n]);
        state = state * decay_j + states_j;
    }
    (Tensor::stack(entering, 1), state)
}

/// Step 4, state to output ("C terms"): the contribution of the state entering each chunk.
///
/// `y_off[l] = exp(Acs[l]) · S_in · C_l`
///
/// # Shapes
/// - entering: `[b, c, g, r, n, p]` (transposed states), a_cumsum: `[b, c, g, r, q]`,
///   c_mat: `[b, c, g, q, n]`
/// - returns `[b, c, g, r, q, p]`
pub(crate) fn chunk_state_output<B: Backend>(
    entering: Tensor<B, 6>,
    a_cumsum: Tensor<B, 5>,
    c_mat: Tensor<B, 5>,
) -> Tensor<B, 6> {
    let y = c_mat.unsqueeze_dim::<6>(3).matmul(entering);
    y * a_cumsum.exp().unsqueeze_dim::<6>(5)
}

/// Steps 1 to 4 on inputs in the chunk layout of [`chunk`]: the output of every token and the
/// final state, from the discretised inputs `x̃`, the log-decays `dA` (per token and head) and
/// the state entering the first chunk. Mamba-2's scan runs them on `dt · x` and `dt · A`,
/// Mamba-3's ([`trapezoidal_scan`](super::trapezoidal_scan)) on its trapezoid's inputs and
/// per-token decays.
///
/// # Shapes
/// - x_dt: `[b, c, g, r, q, p]`, da: `[b, c, g, r, q]`, b_t: `[b, c, g, n, q]`,
///   c_mat: `[b, c, g, q, n]`, initial: `[b, g, r, n, p]` (transposed), `l ≤ c·q` real tokens
/// - returns y `[b, l, g·r, p]` and the final state `[b, g, r, n, p]` (transposed)
pub(crate) fn chunk_steps<B: Backend>(
    x_dt: Tensor<B, 6>,
    da: Tensor<B, 5>,
    b_t: Tensor<B, 5>,
    c_mat: Tensor<B, 5>,
    initial: Tensor<B, 5>,
    l: usize,
) -> (Tensor<B, 4>, Tensor<B, 5>) {
    let [b, c, g, r, q, p] = x_dt.dims();
    let a_cumsum = chunk_cumsum(da.clone());
    // 1. diagonal blocks
    let y_diag = chunk_diagonal(x_dt.clone(), da.clone(), b_t.clone(), c_mat.clone());
    // 2. chunk states
    let states = chunk_states(x_dt, chunk_decay_to_end(da), b_t);
    // 3. inter-chunk recurrence, on transposed states.
    // The chunk totals per head, [b, g, r, c], sliced after the permutation, so that no reshape
    // in their backward meets a permuted gradient with a unit axis: burn 0.21's view reshape
    // (`burn_std::tensor::split_strides`, used by burn-cubecl) gives such a tensor wrong
    // strides when it adds unit axes, e.g. [4, 1, 3] permuted to [3, 4, 1] and reshaped to
    // [3, 4, 1, 1]. Slicing first and reshaping [b, c, g, 1] to [b, c, g, 1, 1] in the backward
    // made the gradients of dt and A wrong by 2–25% on Wgpu and Cuda when r = 1 (reference case
    // dtlimit_groups4).
    let totals = a_cumsum
        .clone()
        .permute([0, 2, 3, 1, 4])
        .narrow(4, q - 1, 1)
        .reshape([b, g, r, c]);
    let (entering, final_state) = state_passing(states, totals, initial);
    // 4. off-diagonal blocks
    let y_off = chunk_state_output(entering, a_cumsum, c_mat);

    let y = (y_diag + y_off)
        .permute([0, 1, 4, 2, 3, 5]) // [b, c, q, g, r, p]
        .reshape([b, c * q, g * r, p]);
    // drop the padding (without padding no slice: its gradient would be a zero-filled copy)
    let y = if c * q == l { y } else { y.narrow(1, 0, l) };
    (y, final_state)
}

/// [`ssd_chunked`](super::ssd_chunked) as tensor operations ("4 steps", ssd_minimal form, with matmuls for
/// all heavy work), on any backend: the default [`SsdBackend::ssd_chunked`](super::SsdBackend::ssd_chunked), and what the fused
/// kernels are tested against.
///
/// # Shapes
/// - input: see [`SsdInput`]
/// - returns y `[b, l, h, p]` and the final state `[b, h, p, n]`
pub fn ssd_chunked_tensor_ops<B: Backend>(input: SsdInput<B>) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let SsdInput {
        x,
        dt,
        a,
        b: b_mat,
        c: c_mat,
        chunk_size,
        initial_state,
        starts,
        kernels: _,
        products: _,
    } = input;
    let [b, l, h, p] = x.dims();
    let [_, _, g, n] = b_mat.dims();
    // a sequence shorter than a chunk is one chunk of its own length: the same sums, without
    // the padding's share of the quadratic intra-chunk work (a 3-token prompt at chunks of
    // 256 would compute 256² decay products per head)
    let (r, q) = (h / g, chunk_size.min(l.max(1)));
    let out_dtype = x.dtype();
    let (x, dt, a, b_mat, c_mat) = (
        upcast(x),
        upcast(dt),
        upcast(a),
        upcast(b_mat),
        upcast(c_mat),
    );
    let dtype = x.dtype();

    // 0. chunk layout, discretisation, per-chunk inclusive cumsum of dA
    let (x, dt, b_t, c_mat) = chunk(x, dt, b_mat, c_mat, q);
    let (x_dt, da) = discretize(x, dt, a);
    let da = match starts {
        Some(starts) => start_documents(da, starts),
        None => da,
    };
    let initial = match initial_state {
        Some(s) => cast_to(s, dtype).reshape([b, g, r, p, n]).swap_dims(3, 4),
        None => Tensor::zeros([b, g, r, n, p], (&x_dt.device(), dtype)),
    };
    let (y, final_state) = chunk_steps(x_dt, da, b_t, c_mat, initial, l);
    let final_state = final_state.swap_dims(3, 4).reshape([b, h, p, n]);
    (cast_to(y, out_dtype), final_state)
}

#[cfg(all(test, feature = "ndarray"))]
pub(crate) mod tests;
