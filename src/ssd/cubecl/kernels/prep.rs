//! The first launch of the scan: the per-step log-decays, their sums within each chunk and
//! the decay to the chunk's end (scans in shared memory), and the chunk layouts that the
//! products read.

use cubecl::prelude::*;

use super::sizes::Sizes;
use crate::ssd::geometry::TILE;

/// In place, over the `TILE²` values of a cube (one per thread, `i` this thread's): the
/// inclusive sums of `up` from the start and those of `down` to the end (Hillis and Steele's
/// scans, `log₂ TILE²` steps, sums of terms, never differences).
#[cube]
pub(super) fn scans<F: Float>(up: &mut SharedMemory<F>, down: &mut SharedMemory<F>, i: usize) {
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
/// (the entering states' gradients') in `xw` `[1 + with_dy, b, c, g, q, r·p]`; and, shared
/// by the heads of each group, `B` and `C` in `bc` `[2, b, c, g, q, n]`. One cube of `TILE²` threads per `(b, chunk, h)`, a thread per position for the
/// decays (chunks of at most `TILE²`): both sums are scans in shared memory (Hillis and
/// Steele's, `log₂ TILE²` steps), sums of terms, never differences; then the cube's threads
/// stride over the chunk's elements.
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn chunk_prep<F: Float, E: Float>(
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
    sizes: Sizes,
    #[comptime] has_starts: bool,
    #[comptime] with_dy: bool,
    #[define(F, E)] _dtypes: [StorageType; 2],
) {
    let len = sizes.len;
    let heads = sizes.heads;
    let groups = sizes.groups;
    let dim_p = sizes.dim_p;
    let dim_n = sizes.dim_n;
    let chunks = sizes.chunks;
    let q = sizes.q;
    let cube = CUBE_POS;
    // a whole cube leaves at once, before any synchronisation
    if cube >= sizes.batch * chunks * heads {
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
    let dy_part = sizes.batch * chunks * q * heads * dim_p;
    let c_part = sizes.batch * chunks * groups * q * dim_n;
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
    // B and C, once per group, shared by the group's heads: head `h % r` copies every `r`-th
    // stretch of `TILE²` elements (one head copying them all made its cube walk `q·n / TILE²`
    // steps while the others waited: the launch's longest chain, docs/fused-scan.md)
    let mut e = (h % r) * size + UNIT_POS as usize;
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
        e += r * size;
    }
}
