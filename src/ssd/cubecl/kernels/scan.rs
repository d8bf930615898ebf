//! The output of the scan, `y = M·x + exp(cs) · C·S_inᵀ`, with each head's intra-chunk matrix
//! `M` computed tile by tile in shared memory and never stored.

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

/// A chunk's output in the input's layout, `y` `[b, l, h, p]`, with the decay applied inside
/// the tiles of the intra-chunk product, so that no per-head `q × q` matrix reaches memory:
/// `y_i = Σ_{s ≤ i} (C_i · B_s) · exp(Σ_{k=s+1}^{i} dA[k]) · dt_s · x_s + exp(cs_i) · (C_i ·
/// S[j]ᵀ)`, from the group's scores `C·Bᵀ` and the entering state's part `C·S[j]ᵀ` (both
/// products). One cube per `BLOCK × BLOCK` tile of rows `i` and columns `p` of a `(b, j, h)`,
/// over the tiles of `s` from the diagonal back to the chunk's start. Each tile's weights
/// `(C_i · B_s) · exp(…) · dt_s` are computed once in shared memory; the segment sum of a weight
/// is its own terms within the tile plus, carried per row, the sum of the terms of the tiles
/// after it (sums of terms, never a difference of prefix sums). With `transient`, the
/// intra-chunk part is read from `intra`, the per-head product `M·x` through the matmul; with
/// `fragments`, each tile's product runs on fragments (`super::fragments`, on tensor cores
/// with `cmma`).
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn chunk_scan<F: Float, E: Float>(
    x: &Tensor<E>,        // [b, l, h, p]
    dt: &Tensor<F>,       // [b, l, h]
    cb: &Tensor<F>,       // [b, c, g, q, q]
    entering: &Tensor<E>, // [b, c, g, q, r·p]: C·S[j]ᵀ per group
    da: &Tensor<F>,       // [b, h, c·q]
    cs: &Tensor<F>,       // [b, h, c·q]
    intra: &Tensor<F>,    // [b, c, h, q, p]: M·x (read when transient)
    y: &mut Tensor<E>,    // [b, l, h, p]
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
    if cube >= sizes.batch * chunks * heads * row_tiles * col_tiles {
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

    if transient {
        // the intra-chunk part from the product
        let first = ((b * chunks + j) * heads + h) * q;
        #[unroll]
        for u in 0..PER {
            let i = i0 + ty * PER + u;
            let mut row_values = Quad::<F>::new(F::new(0.0));
            #[unroll]
            for v in 0..PER {
                let pp = p0 + tx * PER + v;
                if i < q && pp < dim_p {
                    row_values[v] = intra[(first + i) * dim_p + pp];
                }
            }
            diag[u] = row_values;
        }
    } else {
        // the intra-chunk part, over the tiles of s from the diagonal back
        let scores = ((b * chunks + j) * groups + g) * q * q;
        // the operand tiles of the operand type and the accumulator of the fragments
        let mut lhs_e = fragment_tile::<E>();
        let mut rhs_e = fragment_tile::<E>();
        let mut acc = fragment_tile::<F>();
        if fragments {
            zero_tile::<F>(&mut acc, ty, tx);
        }
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
            if fragments {
                load_tile::<E>(
                    x,
                    &mut rhs_e,
                    first_x,
                    heads * dim_p,
                    s0,
                    valid,
                    p0,
                    dim_p,
                    unit,
                );
            } else {
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
            }
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
