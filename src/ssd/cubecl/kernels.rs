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

// CubeCL's kernel macro expands arithmetic operators, not `usize::div_ceil` or
// `is_multiple_of`: the kernels spell them out
#![allow(clippy::manual_div_ceil, clippy::manual_is_multiple_of)]

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

/// In place, over the `TILE²` values of a cube (one per thread, `i` this thread's): the
/// inclusive sums of `up` from the start and those of `down` to the end (Hillis and Steele's
/// scans, `log₂ TILE²` steps, sums of terms, never differences).
#[cube]
fn scans<F: Float>(up: &mut SharedMemory<F>, down: &mut SharedMemory<F>, i: usize) {
    let size = TILE * TILE;
    let mut offset = 1;
    while offset < size {
        let mut from_start = up[i];
        if i >= offset {
            from_start += up[i - offset];
        }
        let mut to_end = down[i];
        if i + offset < size {
            to_end += down[i + offset];
        }
        sync_cube();
        up[i] = from_start;
        down[i] = to_end;
        sync_cube();
        offset *= 2;
    }
}

/// What every later launch reads of a chunk, for one head: the per-step log-decays `dA[t] =
/// dt[t]·a + starts[t]·(-10⁴)`, their inclusive sums within the chunk `cs` and the decay from
/// each position to the chunk's end `to_end[i] = exp(Σ_{k=i+1}^{q-1} dA[k])` (all `[b, h,
/// c·q]`); the head's columns of the chunk layouts that the products read, zero-padded to `c·q`
/// positions, per group (the heads of a group side by side), each stacked with its partner in
/// the products: `x·dt·to_end` (the chunk states' operand) and, with `with_dy`, `dy·exp(cs)`
/// (the entering states' gradients') in `xw` `[1 + with_dy, b, c, g, q, r·p]`; and, from the
/// first head of each group, `B` and `C` in `bc` `[2, b, c, g, q, n]`. One cube of `TILE²` threads per `(b, chunk, h)`, a thread per position for the
/// decays (chunks of at most `TILE²`): both sums are scans in shared memory (Hillis and
/// Steele's, `log₂ TILE²` steps), sums of terms, never differences; then the cube's threads
/// stride over the chunk's elements.
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub(super) fn chunk_prep<F: Float, E: Float>(
    x: &Tensor<E>,          // [b, l, h, p]
    dt: &Tensor<F>,         // [b, l, h]
    a: &Tensor<F>,          // [h]
    starts: &Tensor<F>,     // [b, l] (read when has_starts)
    grad_y: &Tensor<E>,     // [b, l, h, p] (read when with_dy)
    b_mat: &Tensor<E>,      // [b, l, g, n]
    c_mat: &Tensor<E>,      // [b, l, g, n]
    da: &mut Tensor<F>,     // [b, h, c·q]
    cs: &mut Tensor<F>,     // [b, h, c·q]
    to_end: &mut Tensor<F>, // [b, h, c·q]
    xw: &mut Tensor<E>,     // [1 + with_dy, b, c, g, q, r·p]
    bc: &mut Tensor<E>,     // [2, b, c, g, q, n]
    z: Sizes,
    #[comptime] has_starts: bool,
    #[comptime] with_dy: bool,
    #[define(F, E)] _dtypes: [StorageType; 2],
) {
    let len = z.len;
    let heads = z.heads;
    let groups = z.groups;
    let dim_p = z.dim_p;
    let dim_n = z.dim_n;
    let chunks = z.chunks;
    let q = z.q;
    let cube = CUBE_POS;
    // a whole cube leaves at once, before any synchronisation
    if cube >= z.batch * chunks * heads {
        terminate!();
    }
    let h = cube % heads;
    let j = (cube / heads) % chunks;
    let b = cube / (heads * chunks);
    let i = UNIT_POS as usize;
    let t = j * q + i;
    let size = TILE * TILE;
    let mut step = F::new(0.0);
    let mut d = F::new(0.0);
    if i < q && t < len {
        step = dt[(b * len + t) * heads + h];
        d = step * a[h];
        if has_starts {
            d += starts[b * len + t] * F::new(-1.0e4);
        }
    }
    // inclusive sums from the start, and sums from the next position to the end
    let mut from_start = SharedMemory::<F>::new(TILE * TILE);
    let mut to_last = SharedMemory::<F>::new(TILE * TILE);
    from_start[i] = d;
    sync_cube();
    let mut next = F::new(0.0);
    if i + 1 < size {
        next = from_start[i + 1];
    }
    to_last[i] = next;
    sync_cube();
    scans::<F>(&mut from_start, &mut to_last, i);
    // each position's scales of x and dy
    let decay_end = to_last[i].exp();
    let decay_out = from_start[i].exp();
    if i < q {
        let at = (b * heads + h) * chunks * q + t;
        da[at] = d;
        cs[at] = from_start[i];
        to_end[at] = decay_end;
    }
    let mut x_scale = SharedMemory::<F>::new(TILE * TILE);
    let mut dy_scale = SharedMemory::<F>::new(TILE * TILE);
    x_scale[i] = step * decay_end;
    dy_scale[i] = decay_out;
    sync_cube();

    // the head's columns of the layouts per group
    let r = heads / groups;
    let g = h / r;
    let block = ((b * chunks + j) * groups + g) * q;
    // where the second of each stacked pair starts
    let dy_part = z.batch * chunks * q * heads * dim_p;
    let c_part = z.batch * chunks * groups * q * dim_n;
    let mut e = UNIT_POS as usize;
    while e < q * dim_p {
        let pos = e / dim_p;
        let pp = e % dim_p;
        let tt = j * q + pos;
        let dst = (block + pos) * r * dim_p + (h % r) * dim_p + pp;
        let mut x_scaled = F::new(0.0);
        let mut dy_scaled = F::new(0.0);
        if tt < len {
            let src = ((b * len + tt) * heads + h) * dim_p + pp;
            x_scaled = F::cast_from(x[src]) * x_scale[pos];
            if with_dy {
                dy_scaled = F::cast_from(grad_y[src]) * dy_scale[pos];
            }
        }
        xw[dst] = E::cast_from(x_scaled);
        if with_dy {
            xw[dy_part + dst] = E::cast_from(dy_scaled);
        }
        e += size;
    }
    // B and C, once per group
    if h % r == 0 {
        let mut e = UNIT_POS as usize;
        while e < q * dim_n {
            let pos = e / dim_n;
            let tt = j * q + pos;
            let dst = block * dim_n + e;
            if tt < len {
                let src = ((b * len + tt) * groups + g) * dim_n + e % dim_n;
                bc[dst] = b_mat[src];
                bc[c_part + dst] = c_mat[src];
            } else {
                bc[dst] = E::new(0.0);
                bc[c_part + dst] = E::new(0.0);
            }
            e += size;
        }
    }
}

/// The inter-chunk recurrence from the chunk states from zero (a product of [`chunk_prep`]'s
/// `xw` with `B`):
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

/// The scans ([`chunk_prep`], [`decay_scans`]) run in cubes of `TILE × TILE` threads, a thread
/// per step of a chunk.
pub(super) const TILE: usize = 16;

/// The side of the output tile of one cube of the tiled kernels ([`chunk_scan`],
/// [`chunk_scan_grads`], [`score_grads`]): `UNITS × UNITS` threads, each computing `PER × PER`
/// adjacent elements of it (rows `ty·PER + u`, columns `tx·PER + v`): few threads with many
/// elements each, so that each operand read from shared memory serves `PER` multiply-adds.
pub(super) const BLOCK: usize = 32;
/// The threads of a cube of the tiled kernels along each side.
pub(super) const UNITS: usize = 8;
/// The elements of each thread of the tiled kernels along each side.
const PER: usize = BLOCK / UNITS;

/// `PER` adjacent elements of a tile, read and written in shared memory as one value: a CPU
/// device such as lavapipe runs a load from shared memory at a per-thread address once per
/// thread, so one load of `PER` elements costs about what one of a single element does.
type Quad<F> = Vector<F, Const<PER>>;

/// An operand tile of the tiled kernels in shared memory: `BLOCK × BLOCK` elements as
/// `[k][BLOCK / PER]` quads, `k` the contraction's index (the lhs transposed, the rhs as is).
#[cube]
fn quad_tile<F: Float>() -> SharedMemory<Quad<F>> {
    SharedMemory::<Quad<F>>::new(BLOCK * UNITS)
}

/// `acc[u][v] += Σ_k lhs[k, ty·PER + u] · rhs[k, tx·PER + v]` for the thread's `PER × PER`
/// elements of a `BLOCK × BLOCK` tile (both operands as [`quad_tile`]s): two loads from shared
/// memory per `k`.
#[cube]
fn tile_product<F: Float>(
    lhs: &SharedMemory<Quad<F>>,
    rhs: &SharedMemory<Quad<F>>,
    acc: &mut Array<Quad<F>>,
    ty: usize,
    tx: usize,
) {
    for k in 0..BLOCK {
        let left = lhs[k * UNITS + ty];
        let right = rhs[k * UNITS + tx];
        #[unroll]
        for u in 0..PER {
            acc[u] += Quad::<F>::new(left[u]) * right;
        }
    }
}

/// Loads a [`quad_tile`] from a matrix of `src`: element `(r, c)` from `src[first +
/// r·row_stride + c]` where `first_row + r < row_end` and `first_col + c < col_end`, zero
/// elsewhere; the matrix's rows are `k` with `k_along_rows` (the tile holds it as it is), its
/// columns without (the tile holds its transpose). Each of the cube's `UNITS²` threads loads
/// `PER` quads; adjacent threads read adjacent elements of a row of `src`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_quads<F: Float, E: Float>(
    src: &Tensor<E>,
    tile: &mut SharedMemory<Quad<F>>,
    first: usize,
    row_stride: usize,
    first_row: usize,
    row_end: usize,
    first_col: usize,
    col_end: usize,
    unit: usize,
    #[comptime] k_along_rows: bool,
) {
    #[unroll]
    for m in 0..BLOCK * UNITS / (UNITS * UNITS) {
        let e = unit + m * UNITS * UNITS;
        let mut k = e % BLOCK;
        let mut quad = e / BLOCK;
        if k_along_rows {
            k = e / UNITS;
            quad = e % UNITS;
        }
        let mut value = Quad::<F>::new(F::new(0.0));
        #[unroll]
        for w in 0..PER {
            let mut r = quad * PER + w;
            let mut c = k;
            if k_along_rows {
                r = k;
                c = quad * PER + w;
            }
            if first_row + r < row_end && first_col + c < col_end {
                value[w] = F::cast_from(src[first + r * row_stride + c]);
            }
        }
        tile[k * UNITS + quad] = value;
    }
}

/// A thread's `PER × PER` accumulators, zero: `PER` rows of `PER` columns.
#[cube]
fn zeros<F: Float>() -> Array<Quad<F>> {
    let mut acc = Array::<Quad<F>>::new(PER);
    #[unroll]
    for u in 0..PER {
        acc[u] = Quad::<F>::new(F::new(0.0));
    }
    acc
}

/// Writes a thread's `PER × PER` values `w[u][v]` (rows `ty·PER + u`, columns `tx·PER + v`)
/// into `tile` as the lhs of a product over the columns: column `tx·PER + v` is `k`.
#[cube]
fn store_lhs<F: Float>(tile: &mut SharedMemory<Quad<F>>, w: &Array<Quad<F>>, ty: usize, tx: usize) {
    #[unroll]
    for v in 0..PER {
        let mut column = Quad::<F>::new(F::new(0.0));
        #[unroll]
        for u in 0..PER {
            column[u] = w[u][v];
        }
        tile[(tx * PER + v) * UNITS + ty] = column;
    }
}

/// Loads the `BLOCK` log-decays of a tile from `da[first]` into `steps` (position `pos0` of
/// its chunk on; zero past the chunk's `q`), and with `with_sums` the sums of them that
/// [`segment_sums`] takes for the rows past the tile, each from its own terms in order: into
/// `sums[c]` those after column `c` with `rows_end` (for the rows after the tile), those up to
/// `c` without (for the rows before it), and the tile's total into `sums[BLOCK]` (`sums` of
/// `BLOCK + 1` elements). The cube's first `BLOCK + 1` threads compute the sums from memory,
/// so that the synchronisation after the tile's loads covers them: one sum per thread, where
/// each thread of the cube would otherwise sum its own columns over the tile.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_steps<F: Float>(
    da: &Tensor<F>,
    steps: &mut SharedMemory<F>,
    sums: &mut SharedMemory<F>,
    first: usize,
    pos0: usize,
    q: usize,
    unit: usize,
    with_sums: bool,
    #[comptime] rows_end: bool,
) {
    let zero = F::new(0.0);
    if unit < BLOCK {
        let mut d = zero;
        if pos0 + unit < q {
            d = da[first + unit];
        }
        steps[unit] = d;
    }
    if with_sums && unit <= BLOCK {
        let mut sum = zero;
        for k in 0..BLOCK {
            let mut step = zero;
            if pos0 + k < q {
                step = da[first + k];
            }
            let mut inside = k <= unit;
            if rows_end {
                inside = k > unit || unit == BLOCK;
            }
            sum += select(inside, step, zero);
        }
        sums[unit] = sum;
    }
}

/// The positions of chunk `j` inside the sequence: `q`, or fewer in the last chunk.
#[cube]
fn chunk_len(j: usize, q: usize, len: usize) -> usize {
    let mut count = q;
    if len - j * q < q {
        count = len - j * q;
    }
    count
}

/// A thread's `PER × PER` scalars `[u·PER + v]`, zero.
#[cube]
fn zero_scalars<F: Float>() -> Array<F> {
    let mut values = Array::<F>::new(PER * PER);
    #[unroll]
    for e in 0..PER * PER {
        values[e] = F::new(0.0);
    }
    values
}

/// The segment sums of a thread's `PER × PER` pairs over one tile of steps (`steps`, the
/// log-decays of positions `first` … `first + BLOCK`). With `rows_end`, row `u` is the segment's
/// end `i_u = row + u` and column `v` its start `s_v = col + v`; without, the
/// reverse. `inner[u·PER + v]` is the sum of the tile's steps `k` with `s < k ≤ i`; `part[u]`
/// that of the steps in row `u`'s segments to or from the tile's other end (`k ≤ i_u` with
/// `rows_end`, `k > s_u` without). With `outside`, every row lies past the tile (after it with
/// `rows_end`, before without): then `part[u]` is the tile's total and `inner` depends on the
/// column alone, both read from the tile's `sums` ([`load_steps`]). Otherwise each step is
/// read once, at an address the same for every thread, and added in order where it lies in
/// the segment (a select, not a branch: a CPU device such as lavapipe runs a branch, and a
/// load inside it, once per thread), so every sum is one of its own terms, as everywhere in
/// the scan.
#[cube]
#[allow(clippy::too_many_arguments)]
fn segment_sums<F: Float>(
    steps: &SharedMemory<F>,
    sums: &SharedMemory<F>,
    inner: &mut Array<F>,
    part: &mut Array<F>,
    first: usize,
    row: usize,
    col: usize,
    outside: bool,
    #[comptime] rows_end: bool,
) {
    let zero = F::new(0.0);
    #[unroll]
    for u in 0..PER {
        part[u] = zero;
    }
    if outside {
        let total = sums[BLOCK];
        #[unroll]
        for u in 0..PER {
            part[u] = total;
        }
        #[unroll]
        for v in 0..PER {
            let column = sums[col + v - first];
            #[unroll]
            for u in 0..PER {
                inner[u * PER + v] = column;
            }
        }
    } else {
        for k in 0..BLOCK {
            let step = steps[k];
            let at = first + k;
            #[unroll]
            for u in 0..PER {
                let r = row + u;
                let mut to_row = at > r;
                if rows_end {
                    to_row = at <= r;
                }
                part[u] += select(to_row, step, zero);
                #[unroll]
                for v in 0..PER {
                    let c = col + v;
                    let mut inside = at > r && at <= c;
                    if rows_end {
                        inside = at > c && at <= r;
                    }
                    inner[u * PER + v] += select(inside, step, zero);
                }
            }
        }
    }
}

/// A chunk's output in the input's layout, `y` `[b, l, h, p]`, with the decay applied inside
/// the tiles of the intra-chunk product, so that no per-head `q × q` matrix reaches memory:
/// `y_i = Σ_{s ≤ i} (C_i · B_s) · exp(Σ_{k=s+1}^{i} dA[k]) · dt_s · x_s + exp(cs_i) · (C_i ·
/// S[j]ᵀ)`, from the group's scores `C·Bᵀ` and the entering state's part `C·S[j]ᵀ` (both
/// products). One cube per `BLOCK × BLOCK` tile of rows `i` and columns `p` of a `(b, j, h)`,
/// over the tiles of `s` from the diagonal back to the chunk's start. Each tile's weights
/// `(C_i · B_s) · exp(…) · dt_s` are computed once in shared memory; the segment sum of a weight
/// is its own terms within the tile plus, carried per row, the sum of the terms of the tiles
/// after it (sums of terms, never a difference of prefix sums).
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub(super) fn chunk_scan<F: Float, E: Float>(
    x: &Tensor<E>,        // [b, l, h, p]
    dt: &Tensor<F>,       // [b, l, h]
    cb: &Tensor<F>,       // [b, c, g, q, q]
    entering: &Tensor<E>, // [b, c, g, q, r·p]: C·S[j]ᵀ per group
    da: &Tensor<F>,       // [b, h, c·q]
    cs: &Tensor<F>,       // [b, h, c·q]
    y: &mut Tensor<E>,    // [b, l, h, p]
    z: Sizes,
    #[define(F, E)] _dtypes: [StorageType; 2],
) {
    let len = z.len;
    let heads = z.heads;
    let groups = z.groups;
    let dim_p = z.dim_p;
    let chunks = z.chunks;
    let q = z.q;
    let row_tiles = (q + BLOCK - 1) / BLOCK;
    let col_tiles = (dim_p + BLOCK - 1) / BLOCK;
    let cube = CUBE_POS;
    // a whole cube leaves at once, before any synchronisation
    if cube >= z.batch * chunks * heads * row_tiles * col_tiles {
        terminate!();
    }
    let pt = cube % col_tiles;
    let it = (cube / col_tiles) % row_tiles;
    let h = (cube / (col_tiles * row_tiles)) % heads;
    let j = (cube / (col_tiles * row_tiles * heads)) % chunks;
    let b = cube / (col_tiles * row_tiles * heads * chunks);
    // heads per group
    let hg = heads / groups;
    let g = h / hg;
    let ty = UNIT_POS_Y as usize;
    let tx = UNIT_POS_X as usize;
    let unit = ty * UNITS + tx;
    let i0 = it * BLOCK;
    let p0 = pt * BLOCK;
    let row = (b * heads + h) * chunks * q + j * q;
    let mut lhs = quad_tile::<F>();
    let mut rhs = quad_tile::<F>();
    let mut steps = SharedMemory::<F>::new(BLOCK);
    let mut sums = SharedMemory::<F>::new(BLOCK + 1);
    let mut diag = zeros::<F>();
    // the positions of the chunk inside the sequence
    let valid = chunk_len(j, q, len);

    // the intra-chunk part, over the tiles of s from the diagonal back
    let scores = ((b * chunks + j) * groups + g) * q * q;
    // per row, Σ dA[k] for k from just after the current tile to the row
    let mut carry = Array::<F>::new(PER);
    #[unroll]
    for u in 0..PER {
        carry[u] = F::new(0.0);
    }
    for back in 0..it + 1 {
        let s0 = (it - back) * BLOCK;
        load_steps::<F>(
            da,
            &mut steps,
            &mut sums,
            row + s0,
            s0,
            q,
            unit,
            back > 0,
            true,
        );
        let first_x = ((b * len + j * q + s0) * heads + h) * dim_p + p0;
        load_quads::<F, E>(
            x,
            &mut rhs,
            first_x,
            heads * dim_p,
            s0,
            valid,
            p0,
            dim_p,
            unit,
            true,
        );
        sync_cube();
        // the weights of the thread's rows i and columns s: each segment's terms within the
        // tile (`inner`), then the row's carry; `whole`, per row, the tile's terms up to i
        let mut inner = zero_scalars::<F>();
        let mut whole = Array::<F>::new(PER);
        segment_sums::<F>(
            &steps,
            &sums,
            &mut inner,
            &mut whole,
            s0,
            i0 + ty * PER,
            s0 + tx * PER,
            back > 0,
            true,
        );
        let mut weights = zeros::<F>();
        #[unroll]
        for u in 0..PER {
            let i = i0 + ty * PER + u;
            let mut row_weights = Quad::<F>::new(F::new(0.0));
            #[unroll]
            for v in 0..PER {
                let s = s0 + tx * PER + v;
                let t_s = j * q + s;
                let mut weight = F::new(0.0);
                if s <= i && i < q && t_s < len {
                    weight = cb[scores + i * q + s]
                        * (inner[u * PER + v] + carry[u]).exp()
                        * dt[(b * len + t_s) * heads + h];
                }
                row_weights[v] = weight;
            }
            weights[u] = row_weights;
            carry[u] += whole[u];
        }
        store_lhs::<F>(&mut lhs, &weights, ty, tx);
        sync_cube();
        tile_product::<F>(&lhs, &rhs, &mut diag, ty, tx);
        sync_cube();
    }
    // the group's row i of C·S[j]ᵀ, from the head's columns
    let part = ((b * chunks + j) * groups + g) * q * hg * dim_p + (h % hg) * dim_p;
    #[unroll]
    for u in 0..PER {
        let i = i0 + ty * PER + u;
        let t_i = j * q + i;
        if i < q && t_i < len {
            let decay = cs[row + i].exp();
            #[unroll]
            for v in 0..PER {
                let pp = p0 + tx * PER + v;
                if pp < dim_p {
                    let state = F::cast_from(entering[part + i * hg * dim_p + pp]);
                    y[((b * len + t_i) * heads + h) * dim_p + pp] =
                        E::cast_from(diag[u][v] + decay * state);
                }
            }
        }
    }
}

/// The adjoint of the inter-chunk recurrence: `G[c] = dS_final`, `G[j] = D[j] + exp(Σ_chunk
/// dA) · G[j+1]` into `adjoints` `[b, c+1, h, p, n]` (slot `j` the gradient of the state
/// entering chunk `j`; slot 0 that of the initial state), with `D[j]` the gradient of the
/// entering state through chunk `j`'s outputs; `G[0]` alone, `first` (contiguous: the initial
/// state's gradient). One thread per `(b, h, p, n)`, looping over the chunks backwards. It
/// also writes the operands of the gradient's products in `E`, stacked so that one product
/// serves two: `operands` `[2, b, c, h, p, n]`, the state leaving each chunk's gradient
/// `G[j+1]` and the state entering it `S[j]`.
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub(super) fn pass_adjoints<F: Float, E: Float>(
    grad_final: &Tensor<F>,   // [b, h, p, n]
    cs: &Tensor<F>,           // [b, h, c·q]
    direct: &Tensor<F>,       // [b, c, h, p, n]
    states: &Tensor<F>,       // [b, c+1, h, p, n]
    adjoints: &mut Tensor<F>, // [b, c+1, h, p, n]
    operands: &mut Tensor<E>, // [2, b, c, h, p, n]
    first: &mut Tensor<F>,    // [b, h, p, n]
    z: Sizes,
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
    // where the entering states start in `operands`
    let entering = z.batch * chunks * heads * per_head;
    let mut g = grad_final[id];
    adjoints[((b * (chunks + 1) + chunks) * heads + h) * per_head + e] = g;
    for k in 0..chunks {
        let j = chunks - 1 - k;
        let at = ((b * chunks + j) * heads + h) * per_head + e;
        let slot = ((b * (chunks + 1) + j) * heads + h) * per_head + e;
        operands[at] = E::cast_from(g);
        operands[entering + at] = E::cast_from(states[slot]);
        g = direct[at] + cs[row + j * q + q - 1].exp() * g;
        adjoints[slot] = g;
    }
    first[id] = g;
}

/// The gradients at each position from the chunk's outputs and its leaving state, with the
/// decay applied inside the tiles of the intra-chunk product, so that no per-head `q × q`
/// matrix reaches memory: `dx̃_s = Σ_{i ≥ s} M[i, s] · dy_i + to_end_s · (G · B_s)` (`M[i, s] =
/// (C_i · B_s) · exp(Σ_{k=s+1}^{i} dA[k])`, the intra-chunk matrix without `dt`; `G` the
/// gradient of the state leaving the chunk; `B·Gᵀ` and `C·S[j]ᵀ` are products, read per
/// element), `dx = dt · dx̃` `[b, l, h, p]`, and three terms of the log-decays'
/// gradient, each summed over one tile of `p` (`terms` `[3, b, h, c·q, ⌈p/BLOCK⌉]`, summed over
/// the last axis by [`decay_scans`]): `u_s = exp(cs_s) · dy_s · (C_s · S[j])` (the entering
/// state's output), `w_s = to_end_s · dt_s · x_s · (G · B_s)` (the chunk state's weight) and
/// `x_s · dx̃_s` (`dt`'s gradient through `x̃ = x·dt`); and `⟨G, S[j]⟩`, the pairs across the
/// chunk, summed over one tile of `p` (`outside` `[b, c, h, ⌈p/BLOCK⌉]`, by the cubes of the
/// first tile of `s`). One cube of `UNITS × UNITS` threads per `BLOCK × BLOCK` tile of positions
/// `s` and columns `p` of a `(b, j, h)`, as in [`chunk_scan`]: over the tiles of `i` from the
/// diagonal to the chunk's end, the segment sums as there
/// (each weight's own terms within its tile plus, carried per row, the terms of the tiles
/// before it).
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub(super) fn chunk_scan_grads<F: Float, E: Float>(
    x: &Tensor<E>,           // [b, l, h, p]
    dt: &Tensor<F>,          // [b, l, h]
    grad_y: &Tensor<E>,      // [b, l, h, p]
    cb: &Tensor<F>,          // [b, c, g, q, q]
    da: &Tensor<F>,          // [b, h, c·q]
    cs: &Tensor<F>,          // [b, h, c·q]
    to_end: &Tensor<F>,      // [b, h, c·q]
    entering: &Tensor<E>,    // [b, c, g, q, r·p]: C·S[j]ᵀ per group
    leaving: &Tensor<E>,     // [b, c, g, q, r·p]: B·G[j+1]ᵀ per group
    states: &Tensor<F>,      // [b, c+1, h, p, n]: slot j enters chunk j
    adjoints: &Tensor<F>,    // [b, c+1, h, p, n]: slot j+1 leaves chunk j
    grad_x: &mut Tensor<E>,  // [b, l, h, p]
    terms: &mut Tensor<F>,   // [3, b, h, c·q, ⌈p/BLOCK⌉]
    outside: &mut Tensor<F>, // [b, c, h, ⌈p/BLOCK⌉]
    z: Sizes,
    #[define(F, E)] _dtypes: [StorageType; 2],
) {
    let len = z.len;
    let heads = z.heads;
    let groups = z.groups;
    let dim_p = z.dim_p;
    let dim_n = z.dim_n;
    let chunks = z.chunks;
    let q = z.q;
    let row_tiles = (q + BLOCK - 1) / BLOCK;
    let col_tiles = (dim_p + BLOCK - 1) / BLOCK;
    let cube = CUBE_POS;
    // a whole cube leaves at once, before any synchronisation
    if cube >= z.batch * chunks * heads * row_tiles * col_tiles {
        terminate!();
    }
    let pt = cube % col_tiles;
    let st = (cube / col_tiles) % row_tiles;
    let h = (cube / (col_tiles * row_tiles)) % heads;
    let j = (cube / (col_tiles * row_tiles * heads)) % chunks;
    let b = cube / (col_tiles * row_tiles * heads * chunks);
    // heads per group
    let hg = heads / groups;
    let g = h / hg;
    let ty = UNIT_POS_Y as usize;
    let tx = UNIT_POS_X as usize;
    let unit = ty * UNITS + tx;
    let s0 = st * BLOCK;
    let p0 = pt * BLOCK;
    let row = (b * heads + h) * chunks * q + j * q;
    let mut lhs = quad_tile::<F>();
    let mut rhs = quad_tile::<F>();
    // the partial sums of the rows' threads, three per thread
    let mut partial = SharedMemory::<F>::new(3 * UNITS * BLOCK);
    let mut steps = SharedMemory::<F>::new(BLOCK);
    let mut sums = SharedMemory::<F>::new(BLOCK + 1);
    let mut diag = zeros::<F>();
    // the positions of the chunk inside the sequence
    let valid = chunk_len(j, q, len);

    if st == 0 {
        // ⟨G, S[j]⟩ over the rows p0 … p0 + BLOCK of both, once per tile of p: each thread's
        // share, then the cube's sum by its first thread in a fixed order (one
        // synchronisation where a tree takes log₂ 64)
        let per_head = dim_p * dim_n;
        let first = ((b * (chunks + 1) + j) * heads + h) * per_head + p0 * dim_n;
        let mut rows = dim_p - p0;
        if rows > BLOCK {
            rows = BLOCK;
        }
        let mut dot = F::new(0.0);
        let mut e = unit;
        while e < rows * dim_n {
            dot += adjoints[first + heads * per_head + e] * states[first + e];
            e += UNITS * UNITS;
        }
        partial[unit] = dot;
        sync_cube();
        if unit == 0 {
            let mut sum = F::new(0.0);
            for k in 0..UNITS * UNITS {
                sum += partial[k];
            }
            outside[((b * chunks + j) * heads + h) * col_tiles + pt] = sum;
        }
        sync_cube();
    }

    // Mᵀ · dy, over the tiles of i from the diagonal on
    let scores = ((b * chunks + j) * groups + g) * q * q;
    // per row s, Σ dA[k] for k from s + 1 to just before the current tile
    let mut carry = Array::<F>::new(PER);
    #[unroll]
    for u in 0..PER {
        carry[u] = F::new(0.0);
    }
    for it in st..row_tiles {
        let i0 = it * BLOCK;
        load_steps::<F>(
            da,
            &mut steps,
            &mut sums,
            row + i0,
            i0,
            q,
            unit,
            it > st,
            false,
        );
        let first_dy = ((b * len + j * q + i0) * heads + h) * dim_p + p0;
        let stride = heads * dim_p;
        load_quads::<F, E>(
            grad_y, &mut rhs, first_dy, stride, i0, valid, p0, dim_p, unit, true,
        );
        sync_cube();
        // the weights M[i, s] of the thread's rows s and columns i: each segment's terms
        // within the tile (`inner`), then the row's carry; `whole`, per row, the tile's terms
        // after s
        let mut inner = zero_scalars::<F>();
        let mut whole = Array::<F>::new(PER);
        segment_sums::<F>(
            &steps,
            &sums,
            &mut inner,
            &mut whole,
            i0,
            s0 + ty * PER,
            i0 + tx * PER,
            it > st,
            false,
        );
        let mut weights = zeros::<F>();
        #[unroll]
        for u in 0..PER {
            let s = s0 + ty * PER + u;
            let mut row_weights = Quad::<F>::new(F::new(0.0));
            #[unroll]
            for v in 0..PER {
                let i = i0 + tx * PER + v;
                let mut weight = F::new(0.0);
                if s <= i && i < q {
                    weight = cb[scores + i * q + s] * (carry[u] + inner[u * PER + v]).exp();
                }
                row_weights[v] = weight;
            }
            weights[u] = row_weights;
            carry[u] += whole[u];
        }
        store_lhs::<F>(&mut lhs, &weights, ty, tx);
        sync_cube();
        tile_product::<F>(&lhs, &rhs, &mut diag, ty, tx);
        sync_cube();
    }

    // dx, and the terms of the log-decays' gradient summed over the thread's columns; the
    // group's rows s of B·Gᵀ and C·S[j]ᵀ, from the head's columns
    let part = ((b * chunks + j) * groups + g) * q * hg * dim_p + (h % hg) * dim_p;
    #[unroll]
    for u in 0..PER {
        let r = ty * PER + u;
        let s = s0 + r;
        let t_s = j * q + s;
        let mut step = F::new(0.0);
        let mut decay_end = F::new(0.0);
        if s < q && t_s < len {
            step = dt[(b * len + t_s) * heads + h];
            decay_end = to_end[row + s];
        }
        let mut sum_u = F::new(0.0);
        let mut sum_w = F::new(0.0);
        let mut sum_x = F::new(0.0);
        #[unroll]
        for v in 0..PER {
            let pp = p0 + tx * PER + v;
            if s < q && t_s < len && pp < dim_p {
                let at = ((b * len + t_s) * heads + h) * dim_p + pp;
                let at_part = part + s * hg * dim_p + pp;
                let gb = F::cast_from(leaving[at_part]);
                let dxt = diag[u][v] + decay_end * gb;
                let xv = F::cast_from(x[at]);
                sum_u += F::cast_from(grad_y[at]) * F::cast_from(entering[at_part]);
                sum_w += xv * gb;
                sum_x += xv * dxt;
                grad_x[at] = E::cast_from(step * dxt);
            }
        }
        partial[r * UNITS + tx] = sum_u;
        partial[(BLOCK + r) * UNITS + tx] = sum_w;
        partial[(2 * BLOCK + r) * UNITS + tx] = sum_x;
    }
    sync_cube();
    // over the row's threads, by the first thread of each row
    if tx == 0 {
        #[unroll]
        for u in 0..PER {
            let r = ty * PER + u;
            let s = s0 + r;
            if s < q {
                let mut sum_u = F::new(0.0);
                let mut sum_w = F::new(0.0);
                let mut sum_x = F::new(0.0);
                for k in 0..UNITS {
                    sum_u += partial[r * UNITS + k];
                    sum_w += partial[(BLOCK + r) * UNITS + k];
                    sum_x += partial[(2 * BLOCK + r) * UNITS + k];
                }
                let mut decay_out = F::new(0.0);
                let mut scale_w = F::new(0.0);
                if j * q + s < len {
                    decay_out = cs[row + s].exp();
                    scale_w = to_end[row + s] * dt[(b * len + j * q + s) * heads + h];
                }
                let part = z.batch * heads * chunks * q * col_tiles;
                let at = (row + s) * col_tiles + pt;
                terms[at] = decay_out * sum_u;
                terms[part + at] = scale_w * sum_w;
                terms[2 * part + at] = sum_x;
            }
        }
    }
}

/// The values per head and tile pair of [`score_grads`]' `spans`: the pairs' sums for the steps
/// of the tile of `s`, for those of the tile of `i`, and the tile pair's total.
pub(super) const SPAN_WIDTH: usize = 2 * BLOCK + 1;

/// The gradient of the scores `C·Bᵀ` and the intra-chunk pairs' part of the log-decays'
/// gradient, with the decay applied inside the tiles, so that no per-head `q × q` matrix reaches
/// memory. Per head, `T[i, s] = (dy_i · x_s) · exp(Σ_{k=s+1}^{i} dA[k]) · dt_s` for `s ≤ i`:
/// `grad_cb = Σ_{heads of the group} T` `[b, c, g, q, q]` (0 above the diagonal), and with
/// `Z = T ⊙ C·Bᵀ` the sums of the pairs `(s, i)` that span each step `k` (`s < k ≤ i`), per
/// tile pair `(I, S)` of each head (`spans` `[b, c, h, T(T+1)/2, SPAN_WIDTH]`, `T = ⌈q/BLOCK⌉`,
/// the pair `I·(I+1)/2 + S`): for the steps of the tile of `s`, `Σ_{s < k} Σ_i Z[i, s]`; for
/// those of the tile of `i`, `Σ_{i ≥ k} Σ_s Z[i, s]`; and the pair's total, which spans every
/// step of the tiles between (on the diagonal, the first slots hold the pairs within the tile
/// and the rest is 0). [`decay_scans`] adds them up. One cube of `UNITS × UNITS` threads per
/// `BLOCK × BLOCK` tile pair of a `(b, j, g)` (those above the diagonal write zeros), looping
/// over the group's heads: `dy · xᵀ` over tiles of `p`, a segment sum from its own terms (the
/// tiles' steps, and the sums of the tiles between).
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub(super) fn score_grads<F: Float, E: Float>(
    x: &Tensor<E>,           // [b, l, h, p]
    dt: &Tensor<F>,          // [b, l, h]
    grad_y: &Tensor<E>,      // [b, l, h, p]
    cb: &Tensor<F>,          // [b, c, g, q, q]
    da: &Tensor<F>,          // [b, h, c·q]
    grad_cb: &mut Tensor<E>, // [b, c, g, q, q]
    spans: &mut Tensor<F>,   // [b, c, h, T(T+1)/2, SPAN_WIDTH]
    z: Sizes,
    #[define(F, E)] _dtypes: [StorageType; 2],
) {
    let len = z.len;
    let heads = z.heads;
    let groups = z.groups;
    let dim_p = z.dim_p;
    let chunks = z.chunks;
    let q = z.q;
    let row_tiles = (q + BLOCK - 1) / BLOCK;
    let col_tiles = (dim_p + BLOCK - 1) / BLOCK;
    let cube = CUBE_POS;
    // a whole cube leaves at once, before any synchronisation
    if cube >= z.batch * chunks * groups * row_tiles * row_tiles {
        terminate!();
    }
    let st = cube % row_tiles;
    let it = (cube / row_tiles) % row_tiles;
    let g = (cube / (row_tiles * row_tiles)) % groups;
    let j = (cube / (row_tiles * row_tiles * groups)) % chunks;
    let b = cube / (row_tiles * row_tiles * groups * chunks);
    let ty = UNIT_POS_Y as usize;
    let tx = UNIT_POS_X as usize;
    let unit = ty * UNITS + tx;
    let i0 = it * BLOCK;
    let s0 = st * BLOCK;
    let scores = ((b * chunks + j) * groups + g) * q * q;
    if st > it {
        #[unroll]
        for u in 0..PER {
            #[unroll]
            for v in 0..PER {
                let i = i0 + ty * PER + u;
                let s = s0 + tx * PER + v;
                if i < q && s < q {
                    grad_cb[scores + i * q + s] = E::new(0.0);
                }
            }
        }
        terminate!();
    }
    let r = heads / groups;
    let pairs = row_tiles * (row_tiles + 1) / 2;
    let pair = it * (it + 1) / 2 + st;
    // the positions of the chunk inside the sequence
    let valid = chunk_len(j, q, len);
    let mut lhs = quad_tile::<F>();
    let mut rhs = quad_tile::<F>();
    let mut zt = SharedMemory::<F>::new(BLOCK * BLOCK);
    let mut sums = SharedMemory::<F>::new(BLOCK * BLOCK);
    let mut steps_i = SharedMemory::<F>::new(BLOCK);
    let mut steps_s = SharedMemory::<F>::new(BLOCK);
    let mut between = SharedMemory::<F>::new(BLOCK);
    // off the diagonal, the sums of the tile of s after each column and of the tile of i up
    // to each row ([`load_steps`])
    let mut tile_sums = SharedMemory::<F>::new(BLOCK + 1);
    let mut row_sums = SharedMemory::<F>::new(BLOCK + 1);
    let mut acc = zero_scalars::<F>();
    for hr in 0..r {
        let h = g * r + hr;
        let row = (b * heads + h) * chunks * q + j * q;
        // the steps of both tiles, and the sums of the (whole) tiles between
        load_steps::<F>(
            da,
            &mut steps_i,
            &mut row_sums,
            row + i0,
            i0,
            q,
            unit,
            it != st,
            false,
        );
        load_steps::<F>(
            da,
            &mut steps_s,
            &mut tile_sums,
            row + s0,
            s0,
            q,
            unit,
            it != st,
            true,
        );
        if unit < BLOCK {
            let mut sum = F::new(0.0);
            let tile = st + 1 + unit;
            if tile < it {
                for k in 0..BLOCK {
                    sum += da[row + tile * BLOCK + k];
                }
            }
            between[unit] = sum;
        }
        // dy_i · x_s over tiles of p
        let mut dyx = zeros::<F>();
        for pt in 0..col_tiles {
            let p0 = pt * BLOCK;
            let stride = heads * dim_p;
            let first_dy = ((b * len + j * q + i0) * heads + h) * dim_p + p0;
            let first_x = ((b * len + j * q + s0) * heads + h) * dim_p + p0;
            load_quads::<F, E>(
                grad_y, &mut lhs, first_dy, stride, i0, valid, p0, dim_p, unit, false,
            );
            load_quads::<F, E>(
                x, &mut rhs, first_x, stride, s0, valid, p0, dim_p, unit, false,
            );
            sync_cube();
            tile_product::<F>(&lhs, &rhs, &mut dyx, ty, tx);
            sync_cube();
        }
        // the segment sums of (s, i], from their own terms
        let mut across = F::new(0.0);
        for k in 0..BLOCK {
            if st + 1 + k < it {
                across += between[k];
            }
        }
        // on the diagonal, the segments' terms (`inner`); off it, each column's terms of its
        // tile after s (`inner`, the same for every row) and each row's terms of its tile up to
        // i (`head`)
        let mut inner = zero_scalars::<F>();
        let mut head = Array::<F>::new(PER);
        if it == st {
            segment_sums::<F>(
                &steps_i,
                &tile_sums,
                &mut inner,
                &mut head,
                i0,
                i0 + ty * PER,
                s0 + tx * PER,
                false,
                true,
            );
        } else {
            segment_sums::<F>(
                &steps_s,
                &tile_sums,
                &mut inner,
                &mut head,
                s0,
                i0 + ty * PER,
                s0 + tx * PER,
                true,
                true,
            );
            #[unroll]
            for u in 0..PER {
                head[u] = row_sums[ty * PER + u];
            }
        }
        #[unroll]
        for u in 0..PER {
            let i = i0 + ty * PER + u;
            #[unroll]
            for v in 0..PER {
                let s = s0 + tx * PER + v;
                let mut seg = inner[u * PER + v];
                if it != st {
                    seg = inner[u * PER + v] + across + head[u];
                }
                let t_s = j * q + s;
                let mut weighted = F::new(0.0);
                if s <= i && i < q && t_s < len {
                    weighted = dyx[u][v] * seg.exp() * dt[(b * len + t_s) * heads + h];
                }
                acc[u * PER + v] += weighted;
                let mut score = F::new(0.0);
                if i < q && s < q {
                    score = cb[scores + i * q + s];
                }
                zt[(ty * PER + u) * BLOCK + tx * PER + v] = weighted * score;
            }
        }
        sync_cube();
        let out = (((b * chunks + j) * heads + h) * pairs + pair) * SPAN_WIDTH;
        if it == st {
            // row sums before each step, then summed over the rows from the step on
            // (each value read once, added where it counts: selects, as in `segment_sums`)
            let mut before = zero_scalars::<F>();
            for k in 0..BLOCK {
                #[unroll]
                for u in 0..PER {
                    let value = zt[(ty * PER + u) * BLOCK + k];
                    #[unroll]
                    for v in 0..PER {
                        before[u * PER + v] += select(k < tx * PER + v, value, F::new(0.0));
                    }
                }
            }
            #[unroll]
            for u in 0..PER {
                #[unroll]
                for v in 0..PER {
                    sums[(ty * PER + u) * BLOCK + tx * PER + v] = before[u * PER + v];
                }
            }
            sync_cube();
            if unit < BLOCK {
                let mut sum = F::new(0.0);
                for k in 0..BLOCK {
                    sum += select(k >= unit, sums[k * BLOCK + unit], F::new(0.0));
                }
                spans[out + unit] = sum;
                spans[out + BLOCK + unit] = F::new(0.0);
                if unit == 0 {
                    spans[out + 2 * BLOCK] = F::new(0.0);
                }
            }
        } else {
            // the column sums (over i) and the row sums (over s)
            if unit < BLOCK {
                let mut sum = F::new(0.0);
                for k in 0..BLOCK {
                    sum += zt[k * BLOCK + unit];
                }
                sums[unit] = sum;
            } else if unit < 2 * BLOCK {
                let rr = unit - BLOCK;
                let mut sum = F::new(0.0);
                for k in 0..BLOCK {
                    sum += zt[rr * BLOCK + k];
                }
                sums[BLOCK + rr] = sum;
            }
            sync_cube();
            if unit < BLOCK {
                let mut sources = F::new(0.0);
                let mut targets = F::new(0.0);
                let mut total = F::new(0.0);
                for k in 0..BLOCK {
                    let column = sums[k];
                    total += column;
                    sources += select(k < unit, column, F::new(0.0));
                    targets += select(k >= unit, sums[BLOCK + k], F::new(0.0));
                }
                spans[out + unit] = sources;
                spans[out + BLOCK + unit] = targets;
                if unit == 0 {
                    spans[out + 2 * BLOCK] = total;
                }
            }
        }
        // the next head overwrites the shared tiles
        sync_cube();
    }
    #[unroll]
    for u in 0..PER {
        #[unroll]
        for v in 0..PER {
            let i = i0 + ty * PER + u;
            let s = s0 + tx * PER + v;
            if i < q && s < q {
                grad_cb[scores + i * q + s] = E::cast_from(acc[u * PER + v]);
            }
        }
    }
}

/// The sum of the `parts` values of a term from `first` on (one per tile of `p`,
/// [`chunk_scan_grads`]).
#[cube]
fn term<F: Float>(terms: &Tensor<F>, first: usize, parts: usize) -> F {
    let mut sum = F::new(0.0);
    for k in 0..parts {
        sum += terms[first + k];
    }
    sum
}

/// The gradient of each step's log-decay, from the pairs (source, target) whose decay spans
/// it, per chunk: `∂L/∂dA_k = Σ_{i ≥ k} u_i` (sources before the chunk) `+ Σ_{s < k} w_s`
/// (targets after it) `+` the pairs within the chunk (from [`score_grads`]' `spans`) `+
/// exp(Σ_chunk dA) · ⟨G[j+1], S[j]⟩` (both outside), with `u`, `w` and `x · dx̃` the terms of
/// [`chunk_scan_grads`]; only spanning pairs are summed, so nothing cancels. Also the gradient
/// of `dt`, `A · ∂L/∂dA + x · dx̃`, and each chunk's part of `A`'s gradient, `Σ_t ∂L/∂dA_t ·
/// dt_t` `[b, c, h]`. One cube of `TILE²` threads per `(b, h, j)`, a thread per step: the sums
/// over sources and targets are scans in shared memory, `A`'s part a tree sum.
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub(super) fn decay_scans<F: Float>(
    a: &Tensor<F>,           // [h]
    dt: &Tensor<F>,          // [b, l, h]
    cs: &Tensor<F>,          // [b, h, c·q]
    terms: &Tensor<F>,       // [3, b, h, c·q, ⌈p/BLOCK⌉]: u, w, x·dx̃ per tile of p
    spans: &Tensor<F>,       // [b, c, h, T(T+1)/2, SPAN_WIDTH]
    outside: &Tensor<F>,     // [b, c, h, ⌈p/BLOCK⌉]: ⟨G[j+1], S[j]⟩ per tile of p
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
    let cube = CUBE_POS;
    // a whole cube leaves at once, before any synchronisation
    if cube >= z.batch * heads * chunks {
        terminate!();
    }
    let j = cube % chunks;
    let h = (cube / chunks) % heads;
    let b = cube / (chunks * heads);
    let k = UNIT_POS as usize;
    let size = TILE * TILE;
    let row = (b * heads + h) * chunks * q + j * q;
    let t = j * q + k;
    let parts = (z.dim_p + BLOCK - 1) / BLOCK;
    let part = z.batch * heads * chunks * q * parts;
    // padding, at the end, has no terms
    let mut w = F::new(0.0);
    let mut u = F::new(0.0);
    if k < q && t < len {
        u = term(terms, (row + k) * parts, parts);
        w = term(terms, part + (row + k) * parts, parts);
    }
    // targets after the chunk, Σ_{s<k} w_s, and sources before it, Σ_{i≥k} u_i
    let mut targets = SharedMemory::<F>::new(TILE * TILE);
    let mut sources = SharedMemory::<F>::new(TILE * TILE);
    targets[k] = w;
    sources[k] = u;
    sync_cube();
    let mut previous = F::new(0.0);
    if k >= 1 {
        previous = targets[k - 1];
    }
    sync_cube();
    targets[k] = previous;
    sync_cube();
    scans::<F>(&mut targets, &mut sources, k);
    // the pairs within the chunk: those of the tile pairs with the step's tile as the sources',
    // as the targets', and of those spanning the whole tile
    let row_tiles = (q + BLOCK - 1) / BLOCK;
    let pairs = row_tiles * (row_tiles + 1) / 2;
    let base = ((b * chunks + j) * heads + h) * pairs;
    let kt = k / BLOCK;
    let kx = k % BLOCK;
    let mut within = F::new(0.0);
    if k < q {
        for ti in kt..row_tiles {
            within += spans[(base + ti * (ti + 1) / 2 + kt) * SPAN_WIDTH + kx];
        }
        for ts in 0..kt {
            within += spans[(base + kt * (kt + 1) / 2 + ts) * SPAN_WIDTH + BLOCK + kx];
            for ti in kt + 1..row_tiles {
                within += spans[(base + ti * (ti + 1) / 2 + ts) * SPAN_WIDTH + 2 * BLOCK];
            }
        }
    }
    let out = term(outside, ((b * chunks + j) * heads + h) * parts, parts) * cs[row + q - 1].exp();
    let mut part_a = F::new(0.0);
    if k < q && t < len {
        let at = (b * len + t) * heads + h;
        let g = targets[k] + sources[k] + within + out;
        grad_da[at] = g;
        grad_dt[at] = g * a[h] + term(terms, 2 * part + (row + k) * parts, parts);
        part_a = g * dt[at];
    }
    sync_cube();
    targets[k] = part_a;
    sync_cube();
    let mut offset = 1;
    while offset < size {
        if k % (2 * offset) == 0 && k + offset < size {
            let other = targets[k + offset];
            targets[k] += other;
        }
        sync_cube();
        offset *= 2;
    }
    if k == 0 {
        grad_a[(b * chunks + j) * heads + h] = targets[0];
    }
}

/// The gradients of `B` and `C` in their input layout `[b, l, g, n]` from the chunk layout's
/// two parts each `[b, c, g, q, n]`, and `A`'s gradient `[h]`, the sum of its parts per chunk
/// `[b, c, h]` ([`decay_scans`]). One thread per element of `[b, l, g, n]` (and of `[h]`, the
/// larger of the two counts).
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub(super) fn unchunk<F: Float, E: Float>(
    grad_b1: &Tensor<F>,    // [b, c, g, q, n]
    grad_b2: &Tensor<F>,    // [b, c, g, q, n]
    grad_c1: &Tensor<F>,    // [b, c, g, q, n]
    grad_c2: &Tensor<F>,    // [b, c, g, q, n]
    parts_a: &Tensor<F>,    // [b, c, h]
    grad_b: &mut Tensor<E>, // [b, l, g, n]
    grad_c: &mut Tensor<E>, // [b, l, g, n]
    grad_a: &mut Tensor<F>, // [h]
    z: Sizes,
    #[define(F, E)] _dtypes: [StorageType; 2],
) {
    let len = z.len;
    let groups = z.groups;
    let dim_n = z.dim_n;
    let chunks = z.chunks;
    let q = z.q;
    let id = ABSOLUTE_POS;
    if id < z.batch * len * groups * dim_n {
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
    if id < z.heads {
        let mut sum = F::new(0.0);
        for k in 0..z.batch * chunks {
            sum += parts_a[k * z.heads + id];
        }
        grad_a[id] = sum;
    }
}
