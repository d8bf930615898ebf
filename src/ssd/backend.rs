//! The chunked SSD as a backend operation: Burn's backend-extension pattern for custom kernels.
//! A backend either runs the tensor-op form ([`ssd_chunked_tensor_ops`], the default) or
//! supplies fused kernels and their gradient (the CubeCL backends).

use burn::tensor::{backend::Backend, ops::FloatTensor, DType};

use super::primitive::{float, primitive};
use super::projection::ProjectionBackend;

use super::chunked::ssd_chunked_tensor_ops;
use super::fused::{FusedKernels, ScanProducts};
use super::input::SsdInput;

/// The inputs of the chunked SSD on a backend's primitives: an [`SsdInput`] as the backend
/// operation takes it (see there for their meaning).
///
/// # Shapes
/// - x: `[b, l, h, p]`, dt: `[b, l, h]` (after softplus and clamp), a: `[h]` (negative)
/// - b, c: `[b, l, g, n]`, with `h % g == 0`
/// - initial_state: `[b, h, p, n]` (zeros when `None`)
/// - starts: `[b, l]` (1 at a document's first token, else 0; `None`: one document per row)
#[derive(Debug)]
pub struct SsdPrimitives<B: Backend> {
    /// The inputs `x`.
    pub x: FloatTensor<B>,
    /// The step sizes.
    pub dt: FloatTensor<B>,
    /// The per-head decay rates (negative).
    pub a: FloatTensor<B>,
    /// The input projections `B`.
    pub b: FloatTensor<B>,
    /// The output projections `C`.
    pub c: FloatTensor<B>,
    /// The state before the first token.
    pub initial_state: Option<FloatTensor<B>>,
    /// The document starts of packed rows.
    pub starts: Option<FloatTensor<B>>,
    /// The chunk length `q ≥ 1`.
    pub chunk_size: usize,
    /// Whether the backend's fused kernels run (the override of the calling thread already
    /// applied).
    pub kernels: FusedKernels,
    /// How the fused kernels compute the intra-chunk products (the override of the calling
    /// thread already applied).
    pub products: ScanProducts,
}

impl<B: Backend> Clone for SsdPrimitives<B> {
    fn clone(&self) -> Self {
        Self {
            x: self.x.clone(),
            dt: self.dt.clone(),
            a: self.a.clone(),
            b: self.b.clone(),
            c: self.c.clone(),
            initial_state: self.initial_state.clone(),
            starts: self.starts.clone(),
            chunk_size: self.chunk_size,
            kernels: self.kernels,
            products: self.products,
        }
    }
}

impl<B: Backend> From<SsdInput<B>> for SsdPrimitives<B> {
    fn from(input: SsdInput<B>) -> Self {
        Self {
            x: primitive(input.x),
            dt: primitive(input.dt),
            a: primitive(input.a),
            b: primitive(input.b),
            c: primitive(input.c),
            initial_state: input.initial_state.map(primitive),
            starts: input.starts.map(primitive),
            chunk_size: input.chunk_size,
            kernels: input.kernels.in_effect(),
            products: input.products.in_effect(),
        }
    }
}

impl<B: Backend> From<SsdPrimitives<B>> for SsdInput<B> {
    fn from(inputs: SsdPrimitives<B>) -> Self {
        SsdInput::new(
            float(inputs.x),
            float(inputs.dt),
            float(inputs.a),
            float(inputs.b),
            float(inputs.c),
            inputs.chunk_size,
        )
        .initial_state(inputs.initial_state.map(float))
        .document_starts(inputs.starts.map(float))
        .fused_kernels(inputs.kernels)
        .scan_products(inputs.products)
    }
}

/// The gradients of the chunked SSD's inputs, each in its input's shape and type (`starts` are
/// data and have none; `initial_state` has one when it was given).
#[derive(Debug)]
pub struct SsdGrads<B: Backend> {
    /// The gradient of `x`.
    pub x: FloatTensor<B>,
    /// The gradient of `dt`.
    pub dt: FloatTensor<B>,
    /// The gradient of `a`.
    pub a: FloatTensor<B>,
    /// The gradient of `B`.
    pub b: FloatTensor<B>,
    /// The gradient of `C`.
    pub c: FloatTensor<B>,
    /// The gradient of the initial state.
    pub initial_state: Option<FloatTensor<B>>,
}

/// A backend that runs the chunked SSD, the bound of every model in this crate.
///
/// Implemented for every backend this crate builds with: `NdArray` (with the `ndarray` feature:
/// the fused CPU scan for `f32` and `f64`), `CubeBackend` and `Fusion<CubeBackend>` (with the `cubecl` feature, which `wgpu` and `cuda`
/// turn on: the fused kernels, so `burn::backend::Wgpu`, `Cuda`, `Vulkan`, `Metal` and `Rocm`
/// run them), and `Autodiff<B>` over any of them (with the fused gradient where `B` has one).
///
/// Every method has a default: an implementation for another backend is `impl SsdBackend for
/// MyBackend {}` and `impl ProjectionBackend for MyBackend {}`, which run the tensor-op form
/// and Burn's `linear` and let autodiff differentiate them.
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not run mamba2-burn's SSD: `SsdBackend` is not implemented for it",
    label = "the models' `forward` needs `B: SsdBackend`",
    note = "for Burn's GPU backends, enable this crate's matching feature: `wgpu` (Wgpu, Vulkan, \
            Metal), `cuda` (Cuda) or `cubecl` (any CubeCL backend); `ndarray` for NdArray",
    note = "in generic code, bound the backend with `B: mamba2_burn::SsdBackend`; another \
            backend gets the tensor-op form with `impl SsdBackend for MyBackend {{}}` and \
            `impl ProjectionBackend for MyBackend {{}}`"
)]
pub trait SsdBackend: ProjectionBackend {
    /// The chunked SSD: `y` `[b, l, h, p]` in the type of `x`, and the final state
    /// `[b, h, p, n]` in the SSD's compute type (`f32` for half-precision inputs).
    fn ssd_chunked(inputs: SsdPrimitives<Self>) -> (FloatTensor<Self>, FloatTensor<Self>) {
        tensor_ops(inputs)
    }

    /// Whether this backend runs [`SsdBackend::ssd_chunked`] as fused kernels with a fused
    /// gradient ([`SsdBackend::ssd_chunked_backward`]) for inputs of type `dtype` cut into
    /// chunks of `chunk_size`, in mode `kernels` (with [`FusedKernels::Measured`], where they
    /// were measured at least as fast as the tensor operations). When it does not, autodiff
    /// differentiates the tensor-op form.
    fn has_fused_ssd(dtype: DType, chunk_size: usize, kernels: FusedKernels) -> bool {
        let _ = (dtype, chunk_size, kernels);
        false
    }

    /// The gradients of [`SsdBackend::ssd_chunked`]'s inputs from those of its outputs,
    /// `grad_y` `[b, l, h, p]` and `grad_state` `[b, h, p, n]` (both in the compute type).
    /// Called only where [`SsdBackend::has_fused_ssd`] holds; the default, for backends without
    /// fused kernels, is never reached and says so.
    fn ssd_chunked_backward(
        inputs: SsdPrimitives<Self>,
        grad_y: FloatTensor<Self>,
        grad_state: FloatTensor<Self>,
    ) -> SsdGrads<Self> {
        let _ = (inputs, grad_y, grad_state);
        panic!("this backend has no fused SSD gradient (SsdBackend::has_fused_ssd is false)")
    }
}

/// [`ssd_chunked_tensor_ops`] on primitives: the default [`SsdBackend::ssd_chunked`].
pub(crate) fn tensor_ops<B: Backend>(inputs: SsdPrimitives<B>) -> (FloatTensor<B>, FloatTensor<B>) {
    let (y, state) = ssd_chunked_tensor_ops(SsdInput::from(inputs));
    (primitive(y), primitive(state))
}

/// An autodiff backend whose inner backend runs the SSD too: the bound of the training code.
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not train mamba2-burn's models: `SsdAutodiffBackend` is not \
               implemented for it",
    label = "training needs `B: SsdAutodiffBackend`",
    note = "write `B: mamba2_burn::SsdAutodiffBackend` where generic training code wrote \
            `B: AutodiffBackend`: it is `AutodiffBackend` with an inner backend that runs the SSD",
    note = "for Burn's GPU backends, enable this crate's matching feature: `wgpu` (Wgpu, Vulkan, \
            Metal), `cuda` (Cuda) or `cubecl` (any CubeCL backend); `ndarray` for NdArray"
)]
pub trait SsdAutodiffBackend:
    SsdBackend + burn::tensor::backend::AutodiffBackend<InnerBackend: SsdBackend>
{
}

impl<B> SsdAutodiffBackend for B
where
    B: SsdBackend + burn::tensor::backend::AutodiffBackend,
    B::InnerBackend: SsdBackend,
{
}
