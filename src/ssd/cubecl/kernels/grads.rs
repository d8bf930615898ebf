//! The gradient of the output's tiled products ([`super::chunk_scan`]): the terms of `x`'s,
//! `dt`'s and the states' gradients, with the decay applied inside the tiles.

use cubecl::prelude::*;

use super::fragments::{
    fragment_product, fragment_tile, load_tile, read_tile, store_tile, zero_tile,
};
use super::sizes::Sizes;
use super::tiles::{
    chunk_len, load_quads, load_steps, quad_tile, segment_sums, store_lhs, tile_product,
    zero_scalars, zeros, Quad,
};
use crate::ssd::geometry::{BLOCK, PER, UNITS};

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
/// before it). With `transient`, `Mᵀ · dy` is read from `intra`, the per-head product through
/// the matmul; with `fragments`, each tile's product runs on fragments (`super::fragments`, on
/// tensor cores with `cmma`).
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn chunk_scan_grads<F: Float, E: Float>(
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
    intra: &Tensor<F>,       // [b, c, h, q, p]: Mᵀ·dy (read when transient)
    grad_x: &mut Tensor<E>,  // [b, l, h, p]
    terms: &mut Tensor<F>,   // [3, b, h, c·q, ⌈p/BLOCK⌉]
    outside: &mut Tensor<F>, // [b, c, h, ⌈p/BLOCK⌉]
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
    let dim_n = sizes.dim_n;
    let chunks = sizes.chunks;
    let q = sizes.q;
    let row_tiles = (q + BLOCK - 1) / BLOCK;
    let col_tiles = (dim_p + BLOCK - 1) / BLOCK;
    let cube = CUBE_POS;
    // a whole cube leaves at once, before any synchronisation
    if cube >= sizes.batch * chunks * heads * row_tiles * col_tiles {
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

    if transient {
        // Mᵀ · dy from the product
        let first = ((b * chunks + j) * heads + h) * q;
        #[unroll]
        for u in 0..PER {
            let s = s0 + ty * PER + u;
            let mut row_values = Quad::<F>::new(F::new(0.0));
            #[unroll]
            for v in 0..PER {
                let pp = p0 + tx * PER + v;
                if s < q && pp < dim_p {
                    row_values[v] = intra[(first + s) * dim_p + pp];
                }
            }
            diag[u] = row_values;
        }
    } else {
        // Mᵀ · dy, over the tiles of i from the diagonal on
        let scores = ((b * chunks + j) * groups + g) * q * q;
        // the operand tiles of the operand type and the accumulator of the fragments
        let mut lhs_e = fragment_tile::<E>();
        let mut rhs_e = fragment_tile::<E>();
        let mut acc = fragment_tile::<F>();
        if fragments {
            zero_tile::<F>(&mut acc, ty, tx);
        }
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
            if fragments {
                load_tile::<E>(
                    grad_y, &mut rhs_e, first_dy, stride, i0, valid, p0, dim_p, unit,
                );
            } else {
                load_quads::<F, E>(
                    grad_y, &mut rhs, first_dy, stride, i0, valid, p0, dim_p, unit, true,
                );
            }
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
            if fragments {
                store_tile::<F, E>(&mut lhs_e, &weights, ty, tx);
                sync_cube();
                fragment_product::<F, E>(&lhs_e, &rhs_e, &mut acc, unit, false, cmma);
            } else {
                store_lhs::<F>(&mut lhs, &weights, ty, tx);
                sync_cube();
                tile_product::<F>(&lhs, &rhs, &mut diag, ty, tx);
            }
            sync_cube();
        }
        if fragments {
            read_tile::<F>(&acc, &mut diag, ty, tx);
        }
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
                let part = sizes.batch * heads * chunks * q * col_tiles;
                let at = (row + s) * col_tiles + pt;
                terms[at] = decay_out * sum_u;
                terms[part + at] = scale_w * sum_w;
                terms[2 * part + at] = sum_x;
            }
        }
    }
}
