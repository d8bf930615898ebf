//! The inputs of the SSD, shared by its chunked and sequential forms.

use burn::tensor::{backend::Backend, Tensor};

use super::fused::{FusedKernels, ScanProducts};

/// The inputs of one SSD scan over `l` tokens, for [`ssd_chunked`](super::ssd_chunked) and
/// [`ssd_sequential`](super::ssd_sequential); built with [`SsdInput::new`] and, where wanted,
/// [`initial_state`](SsdInput::initial_state), [`document_starts`](SsdInput::document_starts)
/// [`fused_kernels`](SsdInput::fused_kernels) and [`scan_products`](SsdInput::scan_products).
///
/// # Shapes
/// - x: `[b, l, h, p]`, dt: `[b, l, h]` (after softplus and clamp), a: `[h]` (negative)
/// - b, c: `[b, l, g, n]`, with `h % g == 0`
/// - initial_state: `[b, h, p, n]` (zeros when `None`)
/// - starts: `[b, l]` (1 at a document's first token, else 0; `None`: one document per row; a
///   start at `t = 0` drops the initial state)
#[derive(Debug, Clone)]
pub struct SsdInput<B: Backend> {
    /// The inputs `x`.
    pub x: Tensor<B, 4>,
    /// The step sizes.
    pub dt: Tensor<B, 3>,
    /// The per-head decay rates (negative).
    pub a: Tensor<B, 1>,
    /// The input projections `B`.
    pub b: Tensor<B, 4>,
    /// The output projections `C`.
    pub c: Tensor<B, 4>,
    /// The chunk length `q ≥ 1` of the chunked form (the sequential form ignores it).
    pub chunk_size: usize,
    /// The state before the first token (zeros when `None`).
    pub initial_state: Option<Tensor<B, 4>>,
    /// The document starts of packed rows (`None`: one document per row).
    pub starts: Option<Tensor<B, 2>>,
    /// Where the chunked form runs the backend's fused kernels (default
    /// [`FusedKernels::Measured`]; the sequential form ignores it).
    pub kernels: FusedKernels,
    /// How the fused kernels of the CubeCL backends compute the intra-chunk products (default
    /// [`ScanProducts::Tiled`]; other paths ignore it).
    pub products: ScanProducts,
}

impl<B: Backend> SsdInput<B> {
    /// A fresh sequence of one document per row, cut into chunks of `chunk_size`.
    ///
    /// # Shapes
    /// - as [`SsdInput`]
    pub fn new(
        x: Tensor<B, 4>,
        dt: Tensor<B, 3>,
        a: Tensor<B, 1>,
        b: Tensor<B, 4>,
        c: Tensor<B, 4>,
        chunk_size: usize,
    ) -> Self {
        Self {
            x,
            dt,
            a,
            b,
            c,
            chunk_size,
            initial_state: None,
            starts: None,
            kernels: FusedKernels::default(),
            products: ScanProducts::default(),
        }
    }

    /// Continues from `state` (`[b, h, p, n]`; `None`: zeros).
    pub fn initial_state(self, state: impl Into<Option<Tensor<B, 4>>>) -> Self {
        Self {
            initial_state: state.into(),
            ..self
        }
    }

    /// Packed rows: `starts` (`[b, l]`, 1 at each document's first token, else 0; `None`: one
    /// document per row). No state flows across a start (see the [module](super)
    /// documentation); the final state is that of each row's last document.
    pub fn document_starts(self, starts: impl Into<Option<Tensor<B, 2>>>) -> Self {
        Self {
            starts: starts.into(),
            ..self
        }
    }

    /// Runs the chunked form on the backend's fused kernels or the tensor operations as `mode`
    /// says (the calling thread's [`override_fused_kernels`](super::override_fused_kernels)
    /// takes precedence).
    pub fn fused_kernels(self, mode: FusedKernels) -> Self {
        Self {
            kernels: mode,
            ..self
        }
    }

    /// Computes the fused kernels' intra-chunk products as `products` says, on the backends
    /// whose kernels take the choice (the CubeCL ones; the calling thread's
    /// [`override_scan_products`](super::override_scan_products) takes precedence).
    pub fn scan_products(self, products: ScanProducts) -> Self {
        Self { products, ..self }
    }
}
