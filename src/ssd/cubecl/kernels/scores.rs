//! The gradient of the scores `C·Bᵀ` and of the log-decays: the tile pairs' sums of the pairs
//! that span each step ([`score_grads`]) and their scans into each step's gradient
//! ([`decay_scans`]).

use cubecl::prelude::*;

use super::fragments::{fragment_product, fragment_tile, load_tile, read_tile, zero_tile};
use super::prep::scans;
use super::sizes::Sizes;
use super::tiles::{
    chunk_len, load_pair_steps, load_quads, pair_segments, quad_tile, tile_product, zero_scalars,
    zeros, Quad,
};
use crate::ssd::geometry::{BLOCK, PER, SPAN_WIDTH, TILE, UNITS};

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
/// over the group's heads: `dy · xᵀ` over tiles of `p` (with `transient`, read from `dyx`, the
/// per-head product through the matmul; with `fragments`, on fragments, `super::fragments`, on
/// tensor cores with `cmma`), a segment sum from its own terms (the tiles' steps,
/// and the sums of the tiles between).
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn score_grads<F: Float, E: Float>(
    x: &Tensor<E>,           // [b, l, h, p]
    dt: &Tensor<F>,          // [b, l, h]
    grad_y: &Tensor<E>,      // [b, l, h, p]
    cb: &Tensor<F>,          // [b, c, g, q, q]
    da: &Tensor<F>,          // [b, h, c·q]
    dyx: &Tensor<F>,         // [b, c, h, q, q]: dy · xᵀ per head (read when transient)
    grad_cb: &mut Tensor<E>, // [b, c, g, q, q]
    spans: &mut Tensor<F>,   // [b, c, h, T(T+1)/2, SPAN_WIDTH]
    sizes: Sizes,
    #[comptime] transient: bool,
    #[comptime] fragments: bool,
    #[comptime] cmma: bool,
    #[define(F, E)] _dtypes: [StorageType; 2],
) {
    let len = sizes.len;
    let heads = sizes.heads;
    let groups = sizes.groups;
    let dim_p = sizes.dim_p;
    let chunks = sizes.chunks;
    let q = sizes.q;
    let row_tiles = (q + BLOCK - 1) / BLOCK;
    let col_tiles = (dim_p + BLOCK - 1) / BLOCK;
    let cube = CUBE_POS;
    // a whole cube leaves at once, before any synchronisation
    if cube >= sizes.batch * chunks * groups * row_tiles * row_tiles {
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
    // the sum over the group's heads, each thread's own elements of a tile in shared memory:
    // held in registers beside the products and segments, ptxas kept the kernel at 128 registers
    // on sm_90 and spilled 12–32 B (`docs/cuda-kernels.md`)
    let mut acc = SharedMemory::<F>::new(BLOCK * BLOCK);
    #[unroll]
    for u in 0..PER {
        #[unroll]
        for v in 0..PER {
            acc[(ty * PER + u) * BLOCK + tx * PER + v] = F::new(0.0);
        }
    }
    // the operand tiles of the operand type and the accumulator of the fragments
    let mut lhs_e = fragment_tile::<E>();
    let mut rhs_e = fragment_tile::<E>();
    let mut acc_tile = fragment_tile::<F>();
    for hr in 0..r {
        let h = g * r + hr;
        let row = (b * heads + h) * chunks * q + j * q;
        // the steps of both tiles, and the sums of the (whole) tiles between
        load_pair_steps::<F>(
            da,
            row,
            it,
            st,
            q,
            unit,
            &mut steps_i,
            &mut steps_s,
            &mut row_sums,
            &mut tile_sums,
            &mut between,
        );
        // dy_i · x_s: read from the product, or over tiles of p
        let mut products = zeros::<F>();
        if transient {
            let first = ((b * chunks + j) * heads + h) * q;
            #[unroll]
            for u in 0..PER {
                let i = i0 + ty * PER + u;
                let mut row_products = Quad::<F>::new(F::new(0.0));
                #[unroll]
                for v in 0..PER {
                    let s = s0 + tx * PER + v;
                    if i < q && s < q {
                        row_products[v] = dyx[(first + i) * q + s];
                    }
                }
                products[u] = row_products;
            }
            sync_cube();
        } else if fragments {
            zero_tile::<F>(&mut acc_tile, ty, tx);
            for pt in 0..col_tiles {
                let p0 = pt * BLOCK;
                let stride = heads * dim_p;
                let first_dy = ((b * len + j * q + i0) * heads + h) * dim_p + p0;
                let first_x = ((b * len + j * q + s0) * heads + h) * dim_p + p0;
                load_tile::<E>(
                    grad_y, &mut lhs_e, first_dy, stride, i0, valid, p0, dim_p, unit,
                );
                load_tile::<E>(x, &mut rhs_e, first_x, stride, s0, valid, p0, dim_p, unit);
                sync_cube();
                // x's tile [s][p] is the transpose of the rhs [p][s]
                fragment_product::<F, E>(&lhs_e, &rhs_e, &mut acc_tile, unit, true, cmma);
                sync_cube();
            }
            read_tile::<F>(&acc_tile, &mut products, ty, tx);
        } else {
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
                tile_product::<F>(&lhs, &rhs, &mut products, ty, tx);
                sync_cube();
            }
        }
        // the segment sums of (s, i], from their own terms
        let segments = pair_segments::<F>(
            it, st, ty, tx, &steps_i, &steps_s, &row_sums, &tile_sums, &between,
        );
        #[unroll]
        for u in 0..PER {
            let i = i0 + ty * PER + u;
            #[unroll]
            for v in 0..PER {
                let s = s0 + tx * PER + v;
                let seg = segments[u * PER + v];
                let t_s = j * q + s;
                let mut weighted = F::new(0.0);
                if s <= i && i < q && t_s < len {
                    weighted = products[u][v] * seg.exp() * dt[(b * len + t_s) * heads + h];
                }
                acc[(ty * PER + u) * BLOCK + tx * PER + v] += weighted;
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
                grad_cb[scores + i * q + s] =
                    E::cast_from(acc[(ty * PER + u) * BLOCK + tx * PER + v]);
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
pub(crate) fn decay_scans<F: Float>(
    a: &Tensor<F>,           // [h]
    dt: &Tensor<F>,          // [b, l, h]
    cs: &Tensor<F>,          // [b, h, c·q]
    terms: &Tensor<F>,       // [3, b, h, c·q, ⌈p/BLOCK⌉]: u, w, x·dx̃ per tile of p
    spans: &Tensor<F>,       // [b, c, h, T(T+1)/2, SPAN_WIDTH]
    outside: &Tensor<F>,     // [b, c, h, ⌈p/BLOCK⌉]: ⟨G[j+1], S[j]⟩ per tile of p
    grad_da: &mut Tensor<F>, // [b, l, h]
    grad_dt: &mut Tensor<F>, // [b, l, h]
    grad_a: &mut Tensor<F>,  // [b, c, h]: this chunk's part
    sizes: Sizes,
    #[define(F)] _dtype: StorageType,
) {
    let len = sizes.len;
    let heads = sizes.heads;
    let chunks = sizes.chunks;
    let q = sizes.q;
    let cube = CUBE_POS;
    // a whole cube leaves at once, before any synchronisation
    if cube >= sizes.batch * heads * chunks {
        terminate!();
    }
    let j = cube % chunks;
    let h = (cube / chunks) % heads;
    let b = cube / (chunks * heads);
    let k = UNIT_POS as usize;
    let size = TILE * TILE;
    let row = (b * heads + h) * chunks * q + j * q;
    let t = j * q + k;
    let parts = (sizes.dim_p + BLOCK - 1) / BLOCK;
    let part = sizes.batch * heads * chunks * q * parts;
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
