//! The fused SSD on CubeCL backends: [`SsdBackend`] for `CubeBackend` (the kernels of
//! [`kernels`]) and for `Fusion<B>` (a custom operation of the fusion stream that runs `B`'s
//! kernels).
//!
//! One scan ([`scan`]) is five kernels: the decays and their chunk sums, the chunk states, the
//! state passing, the intra-chunk scores and the output. The forward is one scan. The
//! backward is four scans and one kernel, all on the inputs alone (nothing of the forward is
//! kept but its inputs):
//! - the forward again, for `y` and the state after every chunk;
//! - the adjoint scan, in reverse time, of `dy` with B and C swapped, started from the final
//!   state's gradient: `dx̃_t = G_t · B_t`, with `G_t = ∂L/∂S_t`, and the adjoint state at every
//!   chunk end;
//! - `∂L/∂C_t = S_tᵀ · dy_t` as a forward scan of the transposed state (input `dt·B`, "B" `x`);
//! - `∂L/∂B_t = G_tᵀ · x̃_t` as a reverse scan of the transposed adjoint (input `C`, "B" `dy`);
//! - the log-decays' gradient ([`kernels::pair_columns`], [`kernels::decay_grads`]) from the
//!   pairs (source, target) that span each step, from which those of `dt` and `A`.

mod fusion;
mod kernels;
#[cfg(all(test, feature = "ndarray", any(feature = "wgpu", feature = "cuda")))]
mod tests;

use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, Tensor, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::prelude::*;

use crate::precision::cast_to;
use crate::ssd::backend::{float, primitive, tensor_ops, SsdBackend, SsdGrads, SsdPrimitives};
use crate::ssd::chunked::DOCUMENT_START_LOG_DECAY;

/// Threads per cube of every kernel.
const CUBE_SIZE: u32 = 64;

/// The longest chunk the fused scan takes (the longest it is tested with, and the reference
/// kernels' default); longer chunks run the tensor operations.
pub(crate) const FUSED_MAX_CHUNK: usize = 256;

impl<R, F, I, BT> SsdBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn ssd_chunked(inputs: SsdPrimitives<Self>) -> (FloatTensor<Self>, FloatTensor<Self>) {
        if !Self::has_fused_ssd(inputs.x.dtype(), inputs.chunk_size) {
            return tensor_ops(inputs);
        }
        let out_dtype = inputs.x.dtype();
        let f = F32Inputs::<Self>::new(inputs);
        let [b, _, h, p] = f.x.dims();
        let n = f.b_mat.dims()[3];
        let (y, states, _, _) = scan(Scan::forward(&f));
        let c = states.meta.shape()[1] - 1;
        let last = float::<Self, 5>(states)
            .narrow(1, c, 1)
            .reshape([b, h, p, n]);
        (
            primitive(cast_to(float::<Self, 4>(y), out_dtype)),
            primitive(last),
        )
    }

    fn has_fused_ssd(dtype: DType, chunk_size: usize) -> bool {
        matches!(dtype, DType::F32 | DType::F16 | DType::BF16) && chunk_size <= FUSED_MAX_CHUNK
    }

    fn ssd_chunked_backward(
        inputs: SsdPrimitives<Self>,
        grad_y: FloatTensor<Self>,
        grad_state: FloatTensor<Self>,
    ) -> SsdGrads<Self> {
        let dtypes = InputTypes::of(&inputs);
        let f = F32Inputs::<Self>::new(inputs);
        let [b, l, h, p] = f.x.dims();
        let [_, _, g, n] = f.b_mat.dims();
        let r = h / g;
        let grad_y = contiguous_f32(float::<Self, 4>(grad_y));
        let grad_state = contiguous_f32(float::<Self, 4>(grad_state));

        let (_, states, scores, y_off) = scan(Scan {
            split: true,
            ..Scan::forward(&f)
        });
        // the adjoint: B and C swapped, in reverse time, from the final state's gradient
        let (grad_x_dt, adjoints, _, grad_x_dt_off) = scan(Scan {
            x: primitive(grad_y.clone()),
            scaled: false,
            b_mat: primitive(f.c_mat.clone()),
            c_mat: primitive(f.b_mat.clone()),
            initial: Some(primitive(grad_state.clone())),
            reverse: true,
            split: true,
            ..Scan::forward(&f)
        });
        // ∂L/∂C_t = S_tᵀ dy_t: the transposed state, input dt·B per head, "B" x per head
        let (grad_c, _, _, _) = scan(Scan {
            x: primitive(per_head(f.b_mat.clone(), r)),
            scaled: true,
            b_mat: primitive(f.x.clone()),
            c_mat: primitive(grad_y.clone()),
            initial: f.initial.clone().map(transposed),
            reverse: false,
            ..Scan::forward(&f)
        });
        // ∂L/∂B_t = G_tᵀ x̃_t: the transposed adjoint, input C per head, "B" dy per head
        let x_dt = f.x.clone() * f.dt.clone().unsqueeze_dim::<4>(3);
        let (grad_b, _, _, _) = scan(Scan {
            x: primitive(per_head(f.c_mat.clone(), r)),
            scaled: false,
            b_mat: primitive(grad_y.clone()),
            c_mat: contiguous(x_dt),
            initial: Some(transposed(grad_state)),
            reverse: true,
            ..Scan::forward(&f)
        });
        let pairs = pair_columns(&f, primitive(grad_y.clone()), scores);
        let (grad_da, grad_dt) = decay_grads(
            &f,
            DecayGradInputs {
                y_off: y_off.expect("split"),
                grad_y: primitive(grad_y),
                grad_x_dt: grad_x_dt.clone(),
                grad_x_dt_off: grad_x_dt_off.expect("split"),
                pairs,
                states,
                adjoints: adjoints.clone(),
            },
        );

        let grad_x = float::<Self, 4>(grad_x_dt) * f.dt.clone().unsqueeze_dim::<4>(3);
        let grad_a = (float::<Self, 3>(grad_da) * f.dt.clone())
            .sum_dim(0)
            .sum_dim(1)
            .reshape([h]);
        let by_group = |t: CubeTensor<R>| {
            float::<Self, 4>(t)
                .reshape([b, l, g, r, n])
                .sum_dim(3)
                .reshape([b, l, g, n])
        };
        // ∂L/∂S_init = exp(dA_0) · G_0, G_0 the adjoint after the reverse scan's last chunk
        let grad_initial = f.initial.as_ref().map(|_| {
            let c = adjoints.meta.shape()[1] - 1;
            let g0 = float::<Self, 5>(adjoints)
                .narrow(1, c, 1)
                .reshape([b, h, p, n]);
            let mut da0 =
                f.dt.clone().narrow(1, 0, 1).reshape([b, h]) * f.a.clone().unsqueeze::<2>();
            if let Some(starts) = &f.starts {
                da0 = da0 + starts.clone().narrow(1, 0, 1) * DOCUMENT_START_LOG_DECAY;
            }
            g0 * da0.exp().reshape([b, h, 1, 1])
        });
        SsdGrads {
            x: primitive(cast_to(grad_x, dtypes.x)),
            dt: primitive(cast_to(float::<Self, 3>(grad_dt), dtypes.dt)),
            a: primitive(cast_to(grad_a, dtypes.a)),
            b_mat: primitive(cast_to(by_group(grad_b), dtypes.b_mat)),
            c_mat: primitive(cast_to(by_group(grad_c), dtypes.c_mat)),
            initial_state: grad_initial
                .zip(dtypes.initial_state)
                .map(|(t, dtype)| primitive(cast_to(t, dtype))),
        }
    }
}

/// The input types, which the gradients take.
struct InputTypes {
    x: DType,
    dt: DType,
    a: DType,
    b_mat: DType,
    c_mat: DType,
    initial_state: Option<DType>,
}

impl InputTypes {
    fn of<B: burn::tensor::backend::Backend>(inputs: &SsdPrimitives<B>) -> Self {
        Self {
            x: inputs.x.dtype(),
            dt: inputs.dt.dtype(),
            a: inputs.a.dtype(),
            b_mat: inputs.b_mat.dtype(),
            c_mat: inputs.c_mat.dtype(),
            initial_state: inputs.initial_state.as_ref().map(|t| t.dtype()),
        }
    }
}

/// The inputs in `f32`, contiguous, as the kernels read them.
struct F32Inputs<B: burn::tensor::backend::Backend> {
    x: Tensor<B, 4>,
    dt: Tensor<B, 3>,
    a: Tensor<B, 1>,
    b_mat: Tensor<B, 4>,
    c_mat: Tensor<B, 4>,
    initial: Option<Tensor<B, 4>>,
    starts: Option<Tensor<B, 2>>,
    chunk_size: usize,
}

impl<R, F, I, BT> F32Inputs<CubeBackend<R, F, I, BT>>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn new(inputs: SsdPrimitives<CubeBackend<R, F, I, BT>>) -> Self {
        Self {
            x: contiguous_f32(float(inputs.x)),
            dt: contiguous_f32(float(inputs.dt)),
            a: contiguous_f32(float(inputs.a)),
            b_mat: contiguous_f32(float(inputs.b_mat)),
            c_mat: contiguous_f32(float(inputs.c_mat)),
            initial: inputs.initial_state.map(|t| contiguous_f32(float(t))),
            starts: inputs.starts.map(|t| contiguous_f32(float(t))),
            chunk_size: inputs.chunk_size,
        }
    }
}

/// `t` in `f32` with a contiguous layout.
fn contiguous_f32<R, F, I, BT, const D: usize>(
    t: Tensor<CubeBackend<R, F, I, BT>, D>,
) -> Tensor<CubeBackend<R, F, I, BT>, D>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    float(contiguous(cast_to(t, DType::F32)))
}

/// A tensor's primitive with a contiguous layout (a copy only where it is a view).
fn contiguous<R, F, I, BT, const D: usize>(t: Tensor<CubeBackend<R, F, I, BT>, D>) -> CubeTensor<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    into_contiguous(primitive(t))
}

/// Each group's rows repeated for its `r` heads: `[b, l, g, n]` to `[b, l, g·r, n]`.
fn per_head<R, F, I, BT>(
    t: Tensor<CubeBackend<R, F, I, BT>, 4>,
    r: usize,
) -> Tensor<CubeBackend<R, F, I, BT>, 4>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let [b, l, g, n] = t.dims();
    float(contiguous(
        t.reshape([b, l, g, 1, n])
            .expand([b, l, g, r, n])
            .reshape([b, l, g * r, n]),
    ))
}

/// A state `[b, h, p, n]` transposed to `[b, h, n, p]`, contiguous.
fn transposed<R, F, I, BT>(state: Tensor<CubeBackend<R, F, I, BT>, 4>) -> CubeTensor<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    contiguous(state.swap_dims(2, 3))
}

/// One scan's operands (all `f32`, contiguous): `S_t = exp(dA_t)·S_{t-1} + x̃_t ⊗ B_t`,
/// `y_t = S_t · C_t`, with `x̃ = x·dt` when `scaled`, in reverse time when `reverse`.
struct Scan<R: CubeRuntime> {
    /// `[b, l, h, p]`
    x: CubeTensor<R>,
    scaled: bool,
    /// `[b, l, h]`: the step sizes, which give the decays (and scale `x` when `scaled`)
    dt: CubeTensor<R>,
    /// `[h]`
    a: CubeTensor<R>,
    /// `[b, l]`
    starts: Option<CubeTensor<R>>,
    /// `[b, l, g, n]`
    b_mat: CubeTensor<R>,
    /// `[b, l, g, n]`
    c_mat: CubeTensor<R>,
    /// `[b, h, p, n]`
    initial: Option<CubeTensor<R>>,
    reverse: bool,
    /// also return the entering states' part of `y`
    split: bool,
    chunk_size: usize,
}

impl<R: CubeRuntime> Scan<R> {
    /// The forward scan of the SSD's inputs.
    fn forward<F, I, BT>(f: &F32Inputs<CubeBackend<R, F, I, BT>>) -> Self
    where
        F: FloatElement,
        I: IntElement,
        BT: BoolElement,
    {
        Self {
            x: primitive(f.x.clone()),
            scaled: true,
            dt: primitive(f.dt.clone()),
            a: primitive(f.a.clone()),
            starts: f.starts.clone().map(primitive),
            b_mat: primitive(f.b_mat.clone()),
            c_mat: primitive(f.c_mat.clone()),
            initial: f.initial.clone().map(primitive),
            reverse: false,
            split: false,
            chunk_size: f.chunk_size,
        }
    }
}

/// An uninitialised contiguous `f32` tensor on `like`'s device.
fn empty<R: CubeRuntime>(like: &CubeTensor<R>, shape: impl Into<Shape>) -> CubeTensor<R> {
    empty_device_contiguous_dtype(
        like.client.clone(),
        like.device.clone(),
        shape.into(),
        DType::F32,
    )
}

/// A one-element placeholder for an argument a kernel does not read.
fn unused<R: CubeRuntime>(like: &CubeTensor<R>) -> CubeTensor<R> {
    empty(like, [1])
}

/// The launch grid of one thread per element of `count`.
fn grid<R: CubeRuntime>(like: &CubeTensor<R>, count: usize) -> (CubeCount, CubeDim) {
    let dim = CubeDim::new_1d(CUBE_SIZE);
    (
        cubecl::calculate_cube_count_elemwise(&like.client, count, dim),
        dim,
    )
}

/// What a scan returns: `y` `[b, l, h, p]`, the states at the chunk boundaries
/// `[b, c+1, h, p, n]` (slot 0 the initial state, slot `j + 1` the state after logical chunk
/// `j`; the last, the final state), the intra-chunk scores `[b, c, h, q, q]` and, when `split`,
/// the entering states' part of `y`.
type ScanOutput<R> = (
    CubeTensor<R>,
    CubeTensor<R>,
    CubeTensor<R>,
    Option<CubeTensor<R>>,
);

/// Runs one scan.
fn scan<R: CubeRuntime>(s: Scan<R>) -> ScanOutput<R> {
    let [b, l, h, p] = s.x.meta.shape().dims::<4>();
    let [_, _, g, n] = s.b_mat.meta.shape().dims::<4>();
    let q = s.chunk_size;
    let c = l.div_ceil(q);
    let client = s.x.client.clone();
    let dtype: StorageType = DType::F32.into();
    let (bu, lu, hu, gu, pu, nu, cu, qu) = (
        b as u32, l as u32, h as u32, g as u32, p as u32, n as u32, c as u32, q as u32,
    );

    let da = empty(&s.x, [b, h, c * q]);
    let cs = empty(&s.x, [b, h, c * q]);
    let to_end = empty(&s.x, [b, h, c * q]);
    let (count, dim) = grid(&s.x, b * h * c);
    // SAFETY: every index is within its tensor: the kernels check their thread
    // position against the element count and derive each index from the shapes
    unsafe {
        kernels::decays::launch_unchecked::<R>(
            &client,
            count,
            dim,
            s.dt.clone().into_tensor_arg(),
            s.a.clone().into_tensor_arg(),
            s.starts
                .clone()
                .unwrap_or_else(|| unused(&s.x))
                .into_tensor_arg(),
            da.clone().into_tensor_arg(),
            cs.clone().into_tensor_arg(),
            to_end.clone().into_tensor_arg(),
            bu,
            lu,
            hu,
            cu,
            qu,
            s.starts.is_some(),
            s.reverse,
            dtype,
        );
    }

    let states = empty(&s.x, [b, c + 1, h, p, n]);
    let (count, dim) = grid(&s.x, b * c * h * p * n);
    // SAFETY: every index is within its tensor: the kernels check their thread
    // position against the element count and derive each index from the shapes
    unsafe {
        kernels::chunk_states::launch_unchecked::<R>(
            &client,
            count,
            dim,
            s.x.clone().into_tensor_arg(),
            s.dt.clone().into_tensor_arg(),
            s.b_mat.clone().into_tensor_arg(),
            to_end.into_tensor_arg(),
            states.clone().into_tensor_arg(),
            bu,
            lu,
            hu,
            gu,
            pu,
            nu,
            cu,
            qu,
            s.scaled,
            s.reverse,
            dtype,
        );
    }

    let (count, dim) = grid(&s.x, b * h * p * n);
    // SAFETY: every index is within its tensor: the kernels check their thread
    // position against the element count and derive each index from the shapes
    unsafe {
        kernels::state_passing::launch_unchecked::<R>(
            &client,
            count,
            dim,
            s.initial
                .clone()
                .unwrap_or_else(|| unused(&s.x))
                .into_tensor_arg(),
            cs.clone().into_tensor_arg(),
            states.clone().into_tensor_arg(),
            bu,
            hu,
            pu,
            nu,
            cu,
            qu,
            s.initial.is_some(),
            dtype,
        );
    }

    let scores = empty(&s.x, [b, c, h, q, q]);
    let (count, dim) = grid(&s.x, b * c * h * q);
    // SAFETY: every index is within its tensor: the kernels check their thread
    // position against the element count and derive each index from the shapes
    unsafe {
        kernels::chunk_scores::launch_unchecked::<R>(
            &client,
            count,
            dim,
            s.b_mat.clone().into_tensor_arg(),
            s.c_mat.clone().into_tensor_arg(),
            da.into_tensor_arg(),
            scores.clone().into_tensor_arg(),
            bu,
            lu,
            hu,
            gu,
            nu,
            cu,
            qu,
            s.reverse,
            dtype,
        );
    }

    let y = empty(&s.x, [b, l, h, p]);
    let y_off = s.split.then(|| empty(&s.x, [b, l, h, p]));
    let y_off_arg = y_off.clone().unwrap_or_else(|| unused(&s.x));
    let (count, dim) = grid(&s.x, b * c * h * q * p);
    // SAFETY: every index is within its tensor: the kernels check their thread
    // position against the element count and derive each index from the shapes
    unsafe {
        kernels::chunk_output::launch_unchecked::<R>(
            &client,
            count,
            dim,
            s.x.into_tensor_arg(),
            s.dt.into_tensor_arg(),
            s.c_mat.into_tensor_arg(),
            cs.into_tensor_arg(),
            states.clone().into_tensor_arg(),
            scores.clone().into_tensor_arg(),
            y.clone().into_tensor_arg(),
            y_off_arg.into_tensor_arg(),
            bu,
            lu,
            hu,
            gu,
            pu,
            nu,
            cu,
            qu,
            s.scaled,
            s.reverse,
            s.split,
            dtype,
        );
    }
    (y, states, scores, y_off)
}

/// [`kernels::pair_columns`] on the forward's scores, in place: the pair sums `V`.
fn pair_columns<R, F, I, BT>(
    f: &F32Inputs<CubeBackend<R, F, I, BT>>,
    grad_y: CubeTensor<R>,
    scores: CubeTensor<R>,
) -> CubeTensor<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let [b, l, h, p] = f.x.dims();
    let q = f.chunk_size;
    let c = l.div_ceil(q);
    let x = primitive(f.x.clone());
    let client = x.client.clone();
    let (count, dim) = grid(&x, b * c * h * q);
    // SAFETY: every index is within its tensor: the kernel checks its thread position against
    // the element count and derives each index from the shapes
    unsafe {
        kernels::pair_columns::launch_unchecked::<R>(
            &client,
            count,
            dim,
            x.clone().into_tensor_arg(),
            primitive(f.dt.clone()).into_tensor_arg(),
            grad_y.into_tensor_arg(),
            scores.clone().into_tensor_arg(),
            b as u32,
            l as u32,
            h as u32,
            p as u32,
            c as u32,
            q as u32,
            DType::F32.into(),
        );
    }
    scores
}

/// The tensors [`kernels::decay_grads`] reads besides the inputs.
struct DecayGradInputs<R: CubeRuntime> {
    y_off: CubeTensor<R>,
    grad_y: CubeTensor<R>,
    grad_x_dt: CubeTensor<R>,
    grad_x_dt_off: CubeTensor<R>,
    pairs: CubeTensor<R>,
    states: CubeTensor<R>,
    adjoints: CubeTensor<R>,
}

/// [`kernels::decay_grads`]: the gradients of the log-decays and of `dt`, `[b, l, h]` each.
fn decay_grads<R, F, I, BT>(
    f: &F32Inputs<CubeBackend<R, F, I, BT>>,
    d: DecayGradInputs<R>,
) -> (CubeTensor<R>, CubeTensor<R>)
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let [b, l, h, p] = f.x.dims();
    let n = f.b_mat.dims()[3];
    let q = f.chunk_size;
    let c = l.div_ceil(q);
    let x = primitive(f.x.clone());
    let client = x.client.clone();
    let grad_da = empty(&x, [b, l, h]);
    let grad_dt = empty(&x, [b, l, h]);
    let (count, dim) = grid(&x, b * h * c);
    let starts = f.starts.clone().map(primitive);
    // SAFETY: every index is within its tensor: the kernel checks its thread position against
    // the element count and derives each index from the shapes
    unsafe {
        kernels::decay_grads::launch_unchecked::<R>(
            &client,
            count,
            dim,
            x.clone().into_tensor_arg(),
            primitive(f.dt.clone()).into_tensor_arg(),
            primitive(f.a.clone()).into_tensor_arg(),
            starts
                .clone()
                .unwrap_or_else(|| unused(&x))
                .into_tensor_arg(),
            d.y_off.into_tensor_arg(),
            d.grad_y.into_tensor_arg(),
            d.grad_x_dt.into_tensor_arg(),
            d.grad_x_dt_off.into_tensor_arg(),
            d.pairs.into_tensor_arg(),
            d.states.into_tensor_arg(),
            d.adjoints.into_tensor_arg(),
            grad_da.clone().into_tensor_arg(),
            grad_dt.clone().into_tensor_arg(),
            b as u32,
            l as u32,
            h as u32,
            p as u32,
            n as u32,
            c as u32,
            q as u32,
            starts.is_some(),
            DType::F32.into(),
        );
    }
    (grad_da, grad_dt)
}
