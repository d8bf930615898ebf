//! The recurrences over chunks: the states entering each chunk (forward) and the adjoints of
//! the states leaving each chunk (gradient), one thread per state element walking the chunks.

use cubecl::prelude::*;

use super::sizes::Sizes;

/// The inter-chunk recurrence from the chunk states from zero (a product of [`chunk_prep`]'s
/// `xw` with `B`):
/// `S[0] = initial`, `S[j+1] = exp(Σ_chunk dA) · S[j] + chunk[j]` into `states`
/// `[b, c+1, h, p, n]` (slot `j` the state entering chunk `j`, slot `c` the final state). One
/// thread per `(b, h, p, n)`, looping over the chunks. With `with_e` (an operand type other than
/// `f32`) the states also in `E`, `states_e`, the operand of the products; the final state
/// alone, `last` (contiguous).
#[cube(launch_unchecked, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn pass_states<F: Float, E: Float>(
    initial: &Tensor<F>,      // [b, h, p, n] (read when has_initial)
    cs: &Tensor<F>,           // [b, h, c·q]
    chunk: &Tensor<F>,        // [b, c, h, p, n]
    states: &mut Tensor<F>,   // [b, c+1, h, p, n]
    states_e: &mut Tensor<E>, // [b, c+1, h, p, n] (written when with_e)
    last: &mut Tensor<F>,     // [b, h, p, n]
    sizes: Sizes,
    #[comptime] has_initial: bool,
    #[comptime] with_e: bool,
    #[define(F, E)] _dtypes: [StorageType; 2],
) {
    let heads = sizes.heads;
    let per_head = sizes.dim_p * sizes.dim_n;
    let chunks = sizes.chunks;
    let q = sizes.q;
    let id = ABSOLUTE_POS;
    if id >= sizes.batch * heads * per_head {
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
pub(crate) fn pass_adjoints<F: Float, E: Float>(
    grad_final: &Tensor<F>,   // [b, h, p, n]
    cs: &Tensor<F>,           // [b, h, c·q]
    direct: &Tensor<F>,       // [b, c, h, p, n]
    states: &Tensor<F>,       // [b, c+1, h, p, n]
    adjoints: &mut Tensor<F>, // [b, c+1, h, p, n]
    operands: &mut Tensor<E>, // [2, b, c, h, p, n]
    first: &mut Tensor<F>,    // [b, h, p, n]
    sizes: Sizes,
    #[define(F, E)] _dtypes: [StorageType; 2],
) {
    let heads = sizes.heads;
    let per_head = sizes.dim_p * sizes.dim_n;
    let chunks = sizes.chunks;
    let q = sizes.q;
    let id = ABSOLUTE_POS;
    if id >= sizes.batch * heads * per_head {
        terminate!();
    }
    let e = id % per_head;
    let h = (id / per_head) % heads;
    let b = id / (per_head * heads);
    let row = (b * heads + h) * chunks * q;
    // where the entering states start in `operands`
    let entering = sizes.batch * chunks * heads * per_head;
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
