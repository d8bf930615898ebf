//! What the tiled kernels share: operand tiles in shared memory as quads, their product, the
//! loaders of tiles and of a chunk's steps, and the segment sums of log-decays that weight a
//! tile pair.

use cubecl::prelude::*;

use crate::ssd::geometry::{BLOCK, PER, UNITS};

/// `PER` adjacent elements of a tile, read and written in shared memory as one value: a CPU
/// device such as lavapipe runs a load from shared memory at a per-thread address once per
/// thread, so one load of `PER` elements costs about what one of a single element does.
pub(super) type Quad<F> = Vector<F, Const<PER>>;

/// An operand tile of the tiled kernels in shared memory: `BLOCK × BLOCK` elements as
/// `[k][BLOCK / PER]` quads, `k` the contraction's index (the lhs transposed, the rhs as is).
#[cube]
pub(super) fn quad_tile<F: Float>() -> SharedMemory<Quad<F>> {
    SharedMemory::<Quad<F>>::new(BLOCK * UNITS)
}

/// `acc[u][v] += Σ_k lhs[k, ty·PER + u] · rhs[k, tx·PER + v]` for the thread's `PER × PER`
/// elements of a `BLOCK × BLOCK` tile (both operands as [`quad_tile`]s): two loads from shared
/// memory per `k`.
#[cube]
pub(super) fn tile_product<F: Float>(
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
pub(super) fn load_quads<F: Float, E: Float>(
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
pub(super) fn zeros<F: Float>() -> Array<Quad<F>> {
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
pub(super) fn store_lhs<F: Float>(
    tile: &mut SharedMemory<Quad<F>>,
    w: &Array<Quad<F>>,
    ty: usize,
    tx: usize,
) {
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
pub(super) fn load_steps<F: Float>(
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
pub(super) fn chunk_len(j: usize, q: usize, len: usize) -> usize {
    let mut count = q;
    if len - j * q < q {
        count = len - j * q;
    }
    count
}

/// A thread's `PER × PER` scalars `[u·PER + v]`, zero.
#[cube]
pub(super) fn zero_scalars<F: Float>() -> Array<F> {
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
pub(super) fn segment_sums<F: Float>(
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

/// Loads what weights the pairs of the tile pair `(it, st)`, `it ≥ st`, of a head's chunk whose
/// log-decays start at `da[row]`, for [`pair_segments`]: the steps of the tile of `i` and of
/// that of `s` with, off the diagonal, their sums ([`load_steps`]: of the tile of `i` up to each
/// row, of the tile of `s` after each column), and the totals of the whole tiles between the
/// two (`between[k]` that of tile `st + 1 + k`). The cube synchronises before reading them.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn load_pair_steps<F: Float>(
    da: &Tensor<F>,
    row: usize,
    it: usize,
    st: usize,
    q: usize,
    unit: usize,
    steps_i: &mut SharedMemory<F>,
    steps_s: &mut SharedMemory<F>,
    row_sums: &mut SharedMemory<F>,
    tile_sums: &mut SharedMemory<F>,
    between: &mut SharedMemory<F>,
) {
    let (i0, s0) = (it * BLOCK, st * BLOCK);
    load_steps::<F>(
        da,
        steps_i,
        row_sums,
        row + i0,
        i0,
        q,
        unit,
        it != st,
        false,
    );
    load_steps::<F>(
        da,
        steps_s,
        tile_sums,
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
}

/// The segment sums `Σ_{k=s+1}^{i} dA[k]` of a thread's `PER × PER` pairs `[u·PER + v]` of the
/// tile pair `(it, st)` (rows `i = it·BLOCK + ty·PER + u`, columns `s = st·BLOCK + tx·PER +
/// v`) from what [`load_pair_steps`] loaded, each from its own terms: on the diagonal the
/// segments' steps within the tile ([`segment_sums`]); off it, the column's steps of its tile
/// after `s`, the whole tiles between and the row's steps of its tile up to `i`. Where `s > i`
/// the value means nothing: callers mask those pairs.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn pair_segments<F: Float>(
    it: usize,
    st: usize,
    ty: usize,
    tx: usize,
    steps_i: &SharedMemory<F>,
    steps_s: &SharedMemory<F>,
    row_sums: &SharedMemory<F>,
    tile_sums: &SharedMemory<F>,
    between: &SharedMemory<F>,
) -> Array<F> {
    let (i0, s0) = (it * BLOCK, st * BLOCK);
    let mut across = F::new(0.0);
    for k in 0..BLOCK {
        if st + 1 + k < it {
            across += between[k];
        }
    }
    // on the diagonal, the segments' terms (`inner`); off it, each column's terms of its tile
    // after s (`inner`, the same for every row) and each row's terms of its tile up to i
    // (`head`)
    let mut inner = zero_scalars::<F>();
    let mut head = Array::<F>::new(PER);
    if it == st {
        segment_sums::<F>(
            steps_i,
            tile_sums,
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
            steps_s,
            tile_sums,
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
            #[unroll]
            for v in 0..PER {
                inner[u * PER + v] = inner[u * PER + v] + across + row_sums[ty * PER + u];
            }
        }
    }
    inner
}
