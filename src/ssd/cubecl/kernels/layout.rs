//! The chunk layouts' gradients back in the inputs' layout.

use cubecl::prelude::*;

use super::sizes::Sizes;

/// The gradients of `B` and `C` in their input layout `[b, l, g, n]` from the chunk layout's
/// two parts each `[b, c, g, q, n]`, and `A`'s gradient `[h]`, the sum of its parts per chunk
/// `[b, c, h]` ([`decay_scans`]). One thread per element of `[b, l, g, n]` (and of `[h]`, the
/// larger of the two counts).
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn unchunk<F: Float, E: Float>(
    grad_b1: &Tensor<F>,    // [b, c, g, q, n]
    grad_b2: &Tensor<F>,    // [b, c, g, q, n]
    grad_c1: &Tensor<F>,    // [b, c, g, q, n]
    grad_c2: &Tensor<F>,    // [b, c, g, q, n]
    parts_a: &Tensor<F>,    // [b, c, h]
    grad_b: &mut Tensor<E>, // [b, l, g, n]
    grad_c: &mut Tensor<E>, // [b, l, g, n]
    grad_a: &mut Tensor<F>, // [h]
    sizes: Sizes,
    #[define(F, E)] _dtypes: [StorageType; 2],
) {
    let len = sizes.len;
    let groups = sizes.groups;
    let dim_n = sizes.dim_n;
    let chunks = sizes.chunks;
    let q = sizes.q;
    let id = ABSOLUTE_POS;
    if id < sizes.batch * len * groups * dim_n {
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
    if id < sizes.heads {
        let mut sum = F::new(0.0);
        for k in 0..sizes.batch * chunks {
            sum += parts_a[k * sizes.heads + id];
        }
        grad_a[id] = sum;
    }
}

/// A tensor of the input's layout `[b, l, h, p]` in the chunk layout of the transient products,
/// `[b, c, h, q, p]`, zero past the sequence's end. One thread per element of the chunk layout.
#[cube(launch_unchecked, address_type = "dynamic")]
pub(crate) fn chunk_rows<E: Float>(
    src: &Tensor<E>,     // [b, l, h, p]
    dst: &mut Tensor<E>, // [b, c, h, q, p]
    sizes: Sizes,
    #[define(E)] _dtype: StorageType,
) {
    let heads = sizes.heads;
    let dim_p = sizes.dim_p;
    let chunks = sizes.chunks;
    let q = sizes.q;
    let id = ABSOLUTE_POS;
    if id < sizes.batch * chunks * heads * q * dim_p {
        let pp = id % dim_p;
        let i = (id / dim_p) % q;
        let h = (id / (dim_p * q)) % heads;
        let j = (id / (dim_p * q * heads)) % chunks;
        let b = id / (dim_p * q * heads * chunks);
        let t = j * q + i;
        let mut value = E::new(0.0);
        if t < sizes.len {
            value = src[((b * sizes.len + t) * heads + h) * dim_p + pp];
        }
        dst[id] = value;
    }
}
