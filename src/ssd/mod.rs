//! The SSD (state-space duality) layer of Mamba-2: the chunked "4 steps" algorithm, the plain
//! sequential recurrence, and the single-step update.
//!
//! Dimension letters follow the spec: `b` batch, `l` sequence length, `h` heads, `p` head
//! dimension, `n` state dimension, `g` groups of B/C, `r = h / g` heads per group, `q` chunk
//! length, `c` number of chunks. Head `h` reads group `h / r` (contiguous heads share a group).
//!
//! All three paths compute the same recurrence, per batch element and head:
//!
//! ```text
//! S_t = exp(dt_t · A) · S_{t-1} + dt_t · x_t ⊗ B_t        S ∈ R^{p×n}
//! y_t = S_t · C_t
//! ```
//!
//! starting from `S_{-1}` = the initial state (zeros by default). The `D·x` skip connection and
//! the gate are applied by the mixer, not here.
//!
//! Packed sequences (the reference's `seq_idx`): with document starts, a row holds several
//! documents back to back and no state flows across a start: `S_{t-1}` is dropped at a start
//! `t`, as if each document ran alone (the initial state belongs to the first one). The chunked
//! form adds a log-decay of -10⁴ to `dA` at each start, so that every decay spanning it
//! is exactly 0 (`exp` underflows; no infinity enters the graph); the recurrence multiplies the
//! state by 0 there.
//!
//! Precision: when the inputs are in a half-precision type, every function here computes in
//! `f32` (dt, A, the decays and the states) and returns `y` in the input's type; the states it
//! returns are `f32`.
//!
//! Everything of the SSD is reached from here: the functions above, the inputs ([`SsdInput`]),
//! the path ([`FusedKernels`]) and the backend traits ([`SsdBackend`], [`ProjectionBackend`],
//! [`SsdAutodiffBackend`]) with their primitives. The files of this folder, each depending only
//! on those listed before it:
//! - `geometry`: the cube and tile sides of the fused CubeCL scan (no backend);
//! - `cost`: the cost model of that scan's launches (hidden from the API; the bench prints it);
//! - `fused`: [`FusedKernels`] and its scoped override;
//! - `input`: [`SsdInput`], the inputs of both forms;
//! - `chunked`: the chunked form as tensor operations, one function per step;
//! - `recurrence`: the sequential recurrence and the single step;
//! - `trapezoidal`: Mamba-3's scan ([`trapezoidal_scan`]), the chunked form's steps run on its
//!   trapezoidal inputs and rotated queries and keys, and its recurrent step
//!   ([`trapezoidal_step`]);
//! - `primitive`, `projection`: [`ProjectionBackend`], the mixer's projections as a backend
//!   operation;
//! - `backend`: [`SsdBackend`], the chunked scan as a backend operation (its default: the
//!   tensor operations);
//! - `autodiff`: both operations under `Autodiff` (one node with the backend's gradient);
//! - `ndarray` (feature `ndarray`): the fused scan and projections over slices, forward and
//!   backward, for burn-ndarray;
//! - `cubecl` (feature `cubecl`): the fused kernels, forward and backward, for the CubeCL
//!   backends and their fusion wrapper.

mod autodiff;
mod backend;
mod chunked;
#[doc(hidden)]
pub mod cost;
#[cfg(feature = "cubecl")]
mod cubecl;
mod fused;
mod geometry;
mod input;
#[cfg(feature = "ndarray")]
mod ndarray;
mod primitive;
mod projection;
mod recurrence;
#[cfg(all(test, feature = "ndarray"))]
mod tests;
mod trapezoidal;

use burn::tensor::Tensor;

pub use backend::{SsdAutodiffBackend, SsdBackend, SsdGrads, SsdPrimitives};
pub use chunked::ssd_chunked_tensor_ops;
pub use fused::{
    override_fused_kernels, override_scan_products, FusedKernels, FusedKernelsOverride, Override,
    ScanProducts, ScanProductsOverride,
};
pub use input::SsdInput;
pub use projection::{projection, ProjectionBackend, ProjectionGrads};
pub use recurrence::{ssd_sequential, ssd_step};
pub use trapezoidal::{
    trapezoidal_scan, trapezoidal_step, Mimo, TrapezoidalInput, TrapezoidalState,
};

pub(crate) use recurrence::continue_rows;

/// The chunked SSD ("4 steps"): exact, on the backend's own path ([`SsdBackend::ssd_chunked`]):
/// fused kernels on the CubeCL backends, a fused scan over slices on NdArray (`f32`, `f64`),
/// [`ssd_chunked_tensor_ops`] elsewhere and where [`SsdInput::kernels`] (or the calling
/// thread's [`override_fused_kernels`]) is [`FusedKernels::Never`].
///
/// Any `l` is accepted (padding to a multiple of the chunk size is internal), any chunk size
/// `q ≥ 1`; with [`SsdInput::document_starts`] a row holds several documents. Returns `y`
/// (without the `D·x` skip) and the final state, which continues the sequence in this
/// function, [`ssd_sequential`] or [`ssd_step`].
///
/// # Shapes
/// - input: see [`SsdInput`]
/// - returns y `[b, l, h, p]` and the final state `[b, h, p, n]`
pub fn ssd_chunked<B: SsdBackend>(input: SsdInput<B>) -> (Tensor<B, 4>, Tensor<B, 4>) {
    if input.kernels.in_effect() == FusedKernels::Never {
        return ssd_chunked_tensor_ops(input);
    }
    let (y, state) = B::ssd_chunked(SsdPrimitives::from(input));
    (primitive::float(y), primitive::float(state))
}
