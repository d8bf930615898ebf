//! Each head's intra-chunk matrix written out, for the transient variant of the scan's
//! products (`ScanProducts::Transient`): the matmul multiplies it.

use cubecl::prelude::*;

use super::sizes::Sizes;
use super::tiles::{load_pair_steps, pair_segments};
use crate::ssd::geometry::{BLOCK, PER, UNITS};

/// Each head's intra-chunk matrix `M[i, s] = (C_i · B_s) · exp(Σ_{k=s+1}^{i} dA[k])`, times
/// `dt_s` with `with_dt`, for `s ≤ i` within the sequence, zero elsewhere (above the diagonal,
/// and the padding's rows and columns), in the operand type: `weights` `[b, c, h, q, q]`. The
/// segment sums as in [`score_grads`](super::score_grads), from their own terms. One cube of
/// `UNITS × UNITS` threads per `BLOCK × BLOCK` tile pair of a `(b, j, h)`.
#[cube(launch_unchecked, address_type = "dynamic")]
pub(crate) fn intra_weights<F: Float, E: Float>(
    dt: &Tensor<F>,          // [b, l, h]
    cb: &Tensor<F>,          // [b, c, g, q, q]
    da: &Tensor<F>,          // [b, h, c·q]
    weights: &mut Tensor<E>, // [b, c, h, q, q]
    sizes: Sizes,
    #[comptime] with_dt: bool,
    #[define(F, E)] _dtypes: [StorageType; 2],
) {
    let len = sizes.len;
    let heads = sizes.heads;
    let chunks = sizes.chunks;
    let q = sizes.q;
    let row_tiles = (q + BLOCK - 1) / BLOCK;
    let cube = CUBE_POS;
    // a whole cube leaves at once, before any synchronisation
    if cube >= sizes.batch * chunks * heads * row_tiles * row_tiles {
        terminate!();
    }
    let st = cube % row_tiles;
    let it = (cube / row_tiles) % row_tiles;
    let h = (cube / (row_tiles * row_tiles)) % heads;
    let j = (cube / (row_tiles * row_tiles * heads)) % chunks;
    let b = cube / (row_tiles * row_tiles * heads * chunks);
    let g = h / (heads / sizes.groups);
    let ty = UNIT_POS_Y as usize;
    let tx = UNIT_POS_X as usize;
    let (i0, s0) = (it * BLOCK, st * BLOCK);
    let out = ((b * chunks + j) * heads + h) * q;
    if st > it {
        #[unroll]
        for u in 0..PER {
            #[unroll]
            for v in 0..PER {
                let i = i0 + ty * PER + u;
                let s = s0 + tx * PER + v;
                if i < q && s < q {
                    weights[(out + i) * q + s] = E::new(0.0);
                }
            }
        }
        terminate!();
    }
    let row = (b * heads + h) * chunks * q + j * q;
    let mut steps_i = SharedMemory::<F>::new(BLOCK);
    let mut steps_s = SharedMemory::<F>::new(BLOCK);
    let mut between = SharedMemory::<F>::new(BLOCK);
    let mut tile_sums = SharedMemory::<F>::new(BLOCK + 1);
    let mut row_sums = SharedMemory::<F>::new(BLOCK + 1);
    load_pair_steps::<F>(
        da,
        row,
        it,
        st,
        q,
        ty * UNITS + tx,
        &mut steps_i,
        &mut steps_s,
        &mut row_sums,
        &mut tile_sums,
        &mut between,
    );
    sync_cube();
    let segments = pair_segments::<F>(
        it, st, ty, tx, &steps_i, &steps_s, &row_sums, &tile_sums, &between,
    );
    let scores = ((b * chunks + j) * sizes.groups + g) * q * q;
    #[unroll]
    for u in 0..PER {
        let i = i0 + ty * PER + u;
        #[unroll]
        for v in 0..PER {
            let s = s0 + tx * PER + v;
            if i < q && s < q {
                let mut weight = F::new(0.0);
                if s <= i && j * q + i < len {
                    weight = cb[scores + i * q + s] * segments[u * PER + v].exp();
                    if with_dt {
                        weight *= dt[(b * len + j * q + s) * heads + h];
                    }
                }
                weights[(out + i) * q + s] = E::cast_from(weight);
            }
        }
    }
}
