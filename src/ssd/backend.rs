//! The chunked SSD as a backend operation: Burn's backend-extension pattern for custom kernels.
//! A backend either runs the tensor-op form ([`ssd_chunked_tensor_ops`], the default) or
//! supplies fused kernels and their gradient (the CubeCL backends).

use std::sync::atomic::{AtomicU8, Ordering};

use burn::tensor::{backend::Backend, ops::FloatTensor, DType, Tensor, TensorPrimitive};

use super::chunked::ssd_chunked_tensor_ops;
use super::input::SsdInput;

/// The inputs of the chunked SSD on a backend's primitives: an [`SsdInput`] as the backend
/// operation takes it (see there for their meaning).
///
/// # Shapes
/// - x: `[b, l, h, p]`, dt: `[b, l, h]` (after softplus and clamp), a: `[h]` (negative)
/// - b_mat, c_mat: `[b, l, g, n]`, with `h % g == 0`
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
    pub b_mat: FloatTensor<B>,
    /// The output projections `C`.
    pub c_mat: FloatTensor<B>,
    /// The state before the first token.
    pub initial_state: Option<FloatTensor<B>>,
    /// The document starts of packed rows.
    pub starts: Option<FloatTensor<B>>,
    /// The chunk length `q ≥ 1`.
    pub chunk_size: usize,
}

impl<B: Backend> Clone for SsdPrimitives<B> {
    fn clone(&self) -> Self {
        Self {
            x: self.x.clone(),
            dt: self.dt.clone(),
            a: self.a.clone(),
            b_mat: self.b_mat.clone(),
            c_mat: self.c_mat.clone(),
            initial_state: self.initial_state.clone(),
            starts: self.starts.clone(),
            chunk_size: self.chunk_size,
        }
    }
}

impl<B: Backend> From<SsdInput<B>> for SsdPrimitives<B> {
    fn from(input: SsdInput<B>) -> Self {
        Self {
            x: primitive(input.x),
            dt: primitive(input.dt),
            a: primitive(input.a),
            b_mat: primitive(input.b),
            c_mat: primitive(input.c),
            initial_state: input.initial_state.map(primitive),
            starts: input.starts.map(primitive),
            chunk_size: input.chunk_size,
        }
    }
}

impl<B: Backend> From<SsdPrimitives<B>> for SsdInput<B> {
    fn from(inputs: SsdPrimitives<B>) -> Self {
        SsdInput::new(
            float(inputs.x),
            float(inputs.dt),
            float(inputs.a),
            float(inputs.b_mat),
            float(inputs.c_mat),
            inputs.chunk_size,
        )
        .initial_state(inputs.initial_state.map(float))
        .document_starts(inputs.starts.map(float))
    }
}

/// The former name of [`SsdPrimitives`].
#[deprecated(
    since = "0.1.1",
    note = "renamed `SsdPrimitives` (`SsdInput` is the tensor form)"
)]
pub type SsdInputs<B> = SsdPrimitives<B>;

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
    pub b_mat: FloatTensor<B>,
    /// The gradient of `C`.
    pub c_mat: FloatTensor<B>,
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
/// Both methods have defaults: an implementation for another backend is `impl SsdBackend for
/// MyBackend {}`, which runs the tensor-op form and lets autodiff differentiate it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not run mamba2-burn's SSD: `SsdBackend` is not implemented for it",
    label = "the models' `forward` needs `B: SsdBackend`",
    note = "for Burn's GPU backends, enable this crate's matching feature: `wgpu` (Wgpu, Vulkan, \
            Metal), `cuda` (Cuda) or `cubecl` (any CubeCL backend); `ndarray` for NdArray",
    note = "in generic code, bound the backend with `B: mamba2_burn::SsdBackend`; another \
            backend gets the tensor-op form with `impl SsdBackend for MyBackend {{}}`"
)]
pub trait SsdBackend: Backend {
    /// The chunked SSD: `y` `[b, l, h, p]` in the type of `x`, and the final state
    /// `[b, h, p, n]` in the SSD's compute type (`f32` for half-precision inputs).
    fn ssd_chunked(inputs: SsdPrimitives<Self>) -> (FloatTensor<Self>, FloatTensor<Self>) {
        tensor_ops(inputs)
    }

    /// Whether this backend runs [`SsdBackend::ssd_chunked`] as fused kernels with a fused
    /// gradient ([`SsdBackend::ssd_chunked_backward`]) for inputs of type `dtype` cut into
    /// chunks of `chunk_size`, in the current [`FusedKernels`] mode (by default where they were
    /// measured at least as fast as the tensor operations). When it does not, autodiff
    /// differentiates the tensor-op form.
    fn has_fused_ssd(dtype: DType, chunk_size: usize) -> bool {
        let _ = (dtype, chunk_size);
        false
    }

    /// The former name of [`SsdBackend::has_fused_ssd`].
    #[deprecated(since = "0.1.1", note = "renamed `has_fused_ssd`")]
    fn ssd_fused(dtype: DType, chunk_size: usize) -> bool {
        Self::has_fused_ssd(dtype, chunk_size)
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

    /// The layer's projections (`in_proj`'s pieces, `out_proj`): `x · weight (+ bias)`, Burn's
    /// `linear` on a matrix. The default is the backend's own `linear`; NdArray runs it (and
    /// its gradient, [`SsdBackend::projection_backward`]) as `gemm` products on the slices,
    /// read in place, so that a project on stock burn-ndarray gets the same products as this
    /// repository.
    ///
    /// # Shapes
    /// - x `[m, k]`, weight `[k, n]`, bias `[n]`; returns `[m, n]`
    fn projection(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        Self::linear(x, weight, bias)
    }

    /// Whether this backend runs [`SsdBackend::projection`] with a gradient of its own
    /// ([`SsdBackend::projection_backward`]) for inputs of type `dtype`. When it does not,
    /// autodiff differentiates the backend's `linear`.
    fn has_fused_projection(dtype: DType) -> bool {
        let _ = dtype;
        false
    }

    /// The gradients of [`SsdBackend::projection`]'s inputs from its output's, `grad` `[m, n]`;
    /// `bias` is the bias's type when there is one (its gradient comes in that type). Called
    /// only where [`SsdBackend::has_fused_projection`] holds.
    fn projection_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<DType>,
        grad: FloatTensor<Self>,
    ) -> ProjectionGrads<Self> {
        let _ = (x, weight, bias, grad);
        panic!("this backend has no fused projection gradient (has_fused_projection is false)")
    }
}

/// The gradients of [`SsdBackend::projection`]'s inputs, each in its input's shape and type.
#[derive(Debug)]
pub struct ProjectionGrads<B: Backend> {
    /// The gradient of `x`, `[m, k]`.
    pub x: FloatTensor<B>,
    /// The gradient of the weight, `[k, n]`.
    pub weight: FloatTensor<B>,
    /// The gradient of the bias, `[n]`, when there is one.
    pub bias: Option<FloatTensor<B>>,
}

/// [`ssd_chunked_tensor_ops`] on primitives: the default [`SsdBackend::ssd_chunked`].
pub(crate) fn tensor_ops<B: Backend>(inputs: SsdPrimitives<B>) -> (FloatTensor<B>, FloatTensor<B>) {
    let (y, state) = ssd_chunked_tensor_ops(SsdInput::from(inputs));
    (primitive(y), primitive(state))
}

/// A primitive as a tensor of rank `D`.
pub(crate) fn float<B: Backend, const D: usize>(t: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// A tensor's float primitive.
pub(crate) fn primitive<B: Backend, const D: usize>(t: Tensor<B, D>) -> FloatTensor<B> {
    t.into_primitive().tensor()
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

/// Where the chunked SSD runs a backend's fused kernels ([`set_fused_kernels_mode`]), for the
/// whole process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FusedKernels {
    /// The fused kernels where they were measured at least as fast as the tensor operations,
    /// per backend and type (the default): NdArray in `f32` and `f64`, Wgpu in `f32` and
    /// `f16` (measured on Mesa's lavapipe); the tensor operations elsewhere (Cuda and the
    /// other CubeCL runtimes, Wgpu in `bf16`) until a measurement there says otherwise
    /// (`docs/fused-scan.md`, "Default path").
    #[default]
    Measured,
    /// The fused kernels wherever a backend has them (any type and chunk length they take).
    Always,
    /// The tensor operations ([`ssd_chunked_tensor_ops`]) and Burn's `linear` on every backend.
    Never,
}

static FUSED_KERNELS: AtomicU8 = AtomicU8::new(FusedKernels::Measured as u8);

/// Sets where the backends run their fused SSD kernels and projections, for the whole process
/// (default [`FusedKernels::Measured`]). Both paths agree to rounding (`f32`: 1e-5 relative in
/// the tests); set it before building a model's graph, not between a forward pass and its
/// backward.
pub fn set_fused_kernels_mode(mode: FusedKernels) {
    FUSED_KERNELS.store(mode as u8, Ordering::Relaxed);
}

/// Where the backends run their fused SSD kernels ([`set_fused_kernels_mode`]).
pub fn fused_kernels_mode() -> FusedKernels {
    match FUSED_KERNELS.load(Ordering::Relaxed) {
        m if m == FusedKernels::Always as u8 => FusedKernels::Always,
        m if m == FusedKernels::Never as u8 => FusedKernels::Never,
        _ => FusedKernels::Measured,
    }
}

/// `true`: [`FusedKernels::Always`], the fused kernels wherever a backend has them; `false`:
/// [`FusedKernels::Never`], the tensor operations everywhere (for comparing the two and for
/// debugging).
pub fn set_fused_kernels(enabled: bool) {
    set_fused_kernels_mode(if enabled {
        FusedKernels::Always
    } else {
        FusedKernels::Never
    });
}

/// Whether the backends may run their fused kernels at all: any mode but
/// [`FusedKernels::Never`].
pub fn fused_kernels() -> bool {
    fused_kernels_mode() != FusedKernels::Never
}

/// For a backend that has fused kernels for an input: whether they run, given whether they
/// were `measured` at least as fast as the tensor operations for it.
pub(crate) fn fused_runs(measured: bool) -> bool {
    match fused_kernels_mode() {
        FusedKernels::Measured => measured,
        FusedKernels::Always => true,
        FusedKernels::Never => false,
    }
}
