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

//! One file per stage, in launch order: `prep` (the decays and chunk layouts, [`chunk_prep`]),
//! `passing` (the recurrences over chunks, [`pass_states`], [`pass_adjoints`]), `tiles` (what
//! the tiled kernels share: operand tiles, their product, loaders, segment sums), `scan` (the
//! output, [`chunk_scan`]), `grads` (its gradient, [`chunk_scan_grads`]), `scores` (the scores'
//! and log-decays' gradients, [`score_grads`], [`decay_scans`]) and `layout` (the gradients
//! back in the inputs' layout, [`unchunk`]; the chunk layout of `x` and `dy`, [`chunk_rows`]);
//! `fragments` holds the tiled kernels' tile products on tensor cores (`ScanProducts::
//! TensorCores`); `weights` (each head's intra-chunk matrix, [`intra_weights`]) serves the
//! transient products
//! alone (`ScanProducts::Transient`, where the matmul multiplies it and the tiled kernels read
//! the products); `sizes` holds what every kernel takes. The cube and tile sides are in
//! `ssd/geometry.rs`, shared with the cost model.

// CubeCL's kernel macro expands arithmetic operators, not `usize::div_ceil` or
// `is_multiple_of`: the kernels spell them out
#![allow(clippy::manual_div_ceil, clippy::manual_is_multiple_of)]

mod fragments;
mod grads;
mod layout;
mod passing;
mod prep;
mod scan;
mod scores;
mod sizes;
mod tiles;
mod weights;

pub(super) use fragments::{FRAG, PLANE};
pub(super) use grads::chunk_scan_grads;
pub(super) use layout::{chunk_rows, unchunk};
pub(super) use passing::{pass_adjoints, pass_states};
pub(super) use prep::chunk_prep;
pub(super) use scan::chunk_scan;
pub(super) use scores::{decay_scans, score_grads};
pub(super) use sizes::SizesLaunch;
pub(super) use weights::intra_weights;
