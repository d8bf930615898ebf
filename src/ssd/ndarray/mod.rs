//! The fused chunked SSD on the CPU: [`SsdBackend`] for burn-ndarray (`f32` and `f64`), forward
//! and gradient, in plain Rust over the inputs' slices.
//!
//! A scan is cut into tasks, one per batch row and group of B/C (its heads cut further when
//! there are fewer rows and groups than threads), run in parallel on rayon's threads. Each
//! task computes its group's scores `C·Bᵀ` once per chunk, then walks its heads' chunks in time
//! order ([`forward`]); the gradient ([`backward`]) recomputes what it needs from the inputs
//! (each head's `c + 1` states, one chunk's decays at a time) and keeps nothing of the forward.
//! Every product is a `gemm` call on strided views of the inputs ([`matmul`]); the decays are
//! products of the per-step decays of their segment ([`decay`]), each chunk at its own length
//! (no padding).
//!
//! Nothing here depends on this repository's patched burn-ndarray: the tensors are read in
//! place and written through burn-ndarray's public types ([`host`]), so a project that depends
//! on this crate runs the same code as its tests.
//!
//! Why by hand: the tensor operations of the chunked form on burn-ndarray materialise every
//! intermediate (`b·c·h·q²` decay matrices and products, their copies for broadcasting, and
//! autodiff's saved operands), where the scan needs a few `q × q` and `q × p` buffers per
//! thread. No crate computes a chunked state-space scan.

mod backward;
mod decay;
mod forward;
mod host;
mod layout;
mod matmul;
mod projection;

use burn::backend::ndarray::NdArrayTensor;
use burn::tensor::backend::{Backend, BackendTypes};
use burn::tensor::ops::{FloatTensor, ModuleOps};
use burn::tensor::{DType, TensorMetadata};
use ndarray::{CowArray, Ix1, Ix2, Ix3, Ix4};
use rayon::prelude::*;

use super::backend::{tensor_ops, SsdBackend, SsdGrads, SsdPrimitives};
use super::fused::FusedKernels;
use super::projection::{ProjectionBackend, ProjectionGrads};
use host::{slice, values, HostFloat};
use layout::{Dims, Inputs, Task};
use matmul::Real;

/// Whether the CPU scan and projections take inputs of type `dtype` (any chunk length).
pub(crate) fn runs(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F64)
}

/// Whether the CPU scan runs for inputs of type `dtype` in mode `kernels`: every type it takes
/// was measured at least as fast as burn-ndarray's own operations (`f32` and `f64`:
/// `docs/performance.md`, `bench --ssd fused` against `--ssd tensor-ops`).
fn fused(dtype: DType, kernels: FusedKernels) -> bool {
    runs(dtype) && kernels.runs(true)
}

/// The scan's sizes, after checking that the inputs' shapes agree; panics naming the tensor
/// that does not (the models build them consistently: a mismatch is a caller's bug, and the
/// scan must not read one tensor with another's layout).
fn dims<B: Backend>(inputs: &SsdPrimitives<B>) -> Dims {
    let shape = |t: &FloatTensor<B>| t.shape().to_vec();
    let x = shape(&inputs.x);
    let [b, l, h, p] = <[usize; 4]>::try_from(x.as_slice())
        .unwrap_or_else(|_| panic!("SSD: x must be [b, l, h, p], got {x:?}"));
    let bm = shape(&inputs.b);
    let [_, _, g, n] = <[usize; 4]>::try_from(bm.as_slice())
        .unwrap_or_else(|_| panic!("SSD: B must be [b, l, g, n], got {bm:?}"));
    let expect = |name: &str, got: Vec<usize>, want: &[usize]| {
        assert!(
            got == want,
            "SSD: {name} must be {want:?} for x {x:?} and B {bm:?}, got {got:?}"
        );
    };
    assert!(
        g > 0 && h % g == 0,
        "SSD: the heads ({h}) must be a multiple of B's groups ({g})"
    );
    assert!(
        inputs.chunk_size > 0,
        "SSD: the chunk length must be at least 1"
    );
    expect("dt", shape(&inputs.dt), &[b, l, h]);
    expect("A", shape(&inputs.a), &[h]);
    expect("B", bm.clone(), &[b, l, g, n]);
    expect("C", shape(&inputs.c), &[b, l, g, n]);
    if let Some(s) = &inputs.initial_state {
        expect("the initial state", shape(s), &[b, h, p, n]);
    }
    if let Some(s) = &inputs.starts {
        expect("the document starts", shape(s), &[b, l]);
    }
    Dims::new([b, l, h, p], g, n, inputs.chunk_size)
}

/// `t` as a primitive of type `dtype` (itself when it is).
fn typed<B: Backend>(t: FloatTensor<B>, dtype: DType) -> FloatTensor<B> {
    if t.dtype() == dtype {
        t
    } else {
        B::float_cast(t, dtype.into())
    }
}

/// The inputs of one scan cast to one type, and their values in row-major order (borrowed
/// where the tensors already are).
struct Host<'a, E: Clone> {
    x: CowArray<'a, E, Ix4>,
    dt: CowArray<'a, E, Ix3>,
    a: CowArray<'a, E, Ix1>,
    b_mat: CowArray<'a, E, Ix4>,
    c_mat: CowArray<'a, E, Ix4>,
    initial: Option<CowArray<'a, E, Ix4>>,
    starts: Option<CowArray<'a, E, Ix2>>,
}

impl<'a, E: HostFloat> Host<'a, E> {
    fn of(t: &'a SsdPrimitives<impl NdArrayBackend>) -> Self {
        Self {
            x: values(&t.x),
            dt: values(&t.dt),
            a: values(&t.a),
            b_mat: values(&t.b),
            c_mat: values(&t.c),
            initial: t.initial_state.as_ref().map(values),
            starts: t.starts.as_ref().map(values),
        }
    }

    fn inputs(&self) -> Inputs<'_, E> {
        Inputs {
            x: slice(&self.x),
            dt: slice(&self.dt),
            a: slice(&self.a),
            b_mat: slice(&self.b_mat),
            c_mat: slice(&self.c_mat),
            initial: self.initial.as_ref().map(slice),
            starts: self.starts.as_ref().map(slice),
        }
    }
}

/// A backend whose float tensors are burn-ndarray's.
trait NdArrayBackend: Backend + BackendTypes<FloatTensorPrimitive = NdArrayTensor> {}

impl<B: Backend + BackendTypes<FloatTensorPrimitive = NdArrayTensor>> NdArrayBackend for B {}

/// Every input cast to `dtype`.
fn cast_inputs<B: Backend>(inputs: SsdPrimitives<B>, dtype: DType) -> SsdPrimitives<B> {
    SsdPrimitives {
        x: typed::<B>(inputs.x, dtype),
        dt: typed::<B>(inputs.dt, dtype),
        a: typed::<B>(inputs.a, dtype),
        b: typed::<B>(inputs.b, dtype),
        c: typed::<B>(inputs.c, dtype),
        initial_state: inputs.initial_state.map(|t| typed::<B>(t, dtype)),
        starts: inputs.starts.map(|t| typed::<B>(t, dtype)),
        chunk_size: inputs.chunk_size,
        kernels: inputs.kernels,
        products: inputs.products,
    }
}

/// Per-task outputs of a head layout (`[heads, l, w]`, head by head) into a tensor of layout
/// `[b, l, h, w]`.
fn scatter_heads<E: Real>(d: &Dims, task: &Task, part: &[E], w: usize, out: &mut [E]) {
    let (l, h) = (d.l, d.h);
    for (hl, hh) in task.heads.clone().enumerate() {
        for t in 0..l {
            let at = ((task.bi * l + t) * h + hh) * w;
            out[at..at + w].copy_from_slice(&part[(hl * l + t) * w..(hl * l + t + 1) * w]);
        }
    }
}

/// Per-task states (`[heads, p·n]`) into a tensor of layout `[b, h, p, n]`.
fn scatter_states<E: Real>(d: &Dims, task: &Task, part: &[E], out: &mut [E]) {
    let size = d.p * d.n;
    let at = (task.bi * d.h + task.heads.start) * size;
    out[at..at + task.heads.len() * size].copy_from_slice(part);
}

/// The scan's forward in `E`: `y` `[b, l, h, p]` and the final state `[b, h, p, n]`, both of
/// `x`'s type.
fn forward<B: NdArrayBackend, E: HostFloat>(
    inputs: SsdPrimitives<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let d = dims(&inputs);
    let inputs = cast_inputs(inputs, E::dtype());
    let host = Host::<E>::of(&inputs);
    let f = host.inputs();
    let tasks = Task::all(&d, rayon::current_num_threads());
    let outputs: Vec<_> = tasks
        .par_iter()
        .map(|task| forward::forward(&f, &d, task))
        .collect();
    let mut y = vec![E::ZERO; d.b * d.l * d.h * d.p];
    let mut last = vec![E::ZERO; d.b * d.h * d.p * d.n];
    for (task, out) in tasks.iter().zip(outputs) {
        scatter_heads(&d, task, &out.y, d.p, &mut y);
        scatter_states(&d, task, &out.last, &mut last);
    }
    (
        E::tensor(y, &[d.b, d.l, d.h, d.p]),
        E::tensor(last, &[d.b, d.h, d.p, d.n]),
    )
}

/// The scan's gradient in `E`, from those of `y` and of the final state; each gradient of its
/// input's type.
fn backward<B: NdArrayBackend, E: HostFloat>(
    inputs: SsdPrimitives<B>,
    grad_y: FloatTensor<B>,
    grad_state: FloatTensor<B>,
) -> SsdGrads<B> {
    let d = dims(&inputs);
    let (b, l, h, g, p, n) = (d.b, d.l, d.h, d.g, d.p, d.n);
    let types = [
        inputs.x.dtype(),
        inputs.dt.dtype(),
        inputs.a.dtype(),
        inputs.b.dtype(),
        inputs.c.dtype(),
    ];
    let initial_type = inputs.initial_state.as_ref().map(|t| t.dtype());
    let inputs = cast_inputs(inputs, E::dtype());
    let (grad_y, grad_state) = (
        typed::<B>(grad_y, E::dtype()),
        typed::<B>(grad_state, E::dtype()),
    );
    assert_eq!(
        grad_y.shape().to_vec(),
        [b, l, h, p],
        "SSD: dy must have y's shape"
    );
    assert_eq!(
        grad_state.shape().to_vec(),
        [b, h, p, n],
        "SSD: the final state's gradient must have its shape"
    );
    let host = Host::<E>::of(&inputs);
    let f = host.inputs();
    let (dy, dlast) = (values::<E, Ix4>(&grad_y), values::<E, Ix4>(&grad_state));
    let (dy, dlast) = (slice(&dy), slice(&dlast));
    let tasks = Task::all(&d, rayon::current_num_threads());
    let grads: Vec<_> = tasks
        .par_iter()
        .map(|task| backward::backward(&f, dy, dlast, &d, task))
        .collect();
    let mut dx = vec![E::ZERO; b * l * h * p];
    let mut ddt = vec![E::ZERO; b * l * h];
    let mut da = vec![E::ZERO; h];
    let mut db = vec![E::ZERO; b * l * g * n];
    let mut dc = vec![E::ZERO; b * l * g * n];
    let mut dinit = vec![E::ZERO; b * h * p * n];
    for (task, grad) in tasks.iter().zip(grads) {
        scatter_heads(&d, task, &grad.x, p, &mut dx);
        scatter_heads(&d, task, &grad.dt, 1, &mut ddt);
        scatter_states(&d, task, &grad.initial, &mut dinit);
        for (hl, hh) in task.heads.clone().enumerate() {
            da[hh] += grad.a[hl];
        }
        // the parts of a group's B and C from each of its tasks
        for t in 0..l {
            let at = ((task.bi * l + t) * g + task.gi) * n;
            for (total, part) in [(&mut db, &grad.b_mat), (&mut dc, &grad.c_mat)] {
                for (o, &v) in total[at..at + n].iter_mut().zip(&part[t * n..(t + 1) * n]) {
                    *o += v;
                }
            }
        }
    }
    let out =
        |values: Vec<E>, shape: &[usize], dtype: DType| typed::<B>(E::tensor(values, shape), dtype);
    SsdGrads {
        x: out(dx, &[b, l, h, p], types[0]),
        dt: out(ddt, &[b, l, h], types[1]),
        a: out(da, &[h], types[2]),
        b: out(db, &[b, l, g, n], types[3]),
        c: out(dc, &[b, l, g, n], types[4]),
        initial_state: initial_type.map(|t| out(dinit, &[b, h, p, n], t)),
    }
}

/// A projection's sizes `[m, k, n]` after checking its shapes; panics naming the tensor that
/// does not fit (the mixer builds them consistently).
fn projection_dims<B: Backend>(
    x: &FloatTensor<B>,
    weight: &FloatTensor<B>,
    bias: Option<&FloatTensor<B>>,
) -> [usize; 3] {
    let (xs, ws) = (x.shape().to_vec(), weight.shape().to_vec());
    let [m, k] = <[usize; 2]>::try_from(xs.as_slice())
        .unwrap_or_else(|_| panic!("projection: x must be [m, k], got {xs:?}"));
    let [kw, n] = <[usize; 2]>::try_from(ws.as_slice())
        .unwrap_or_else(|_| panic!("projection: the weight must be [k, n], got {ws:?}"));
    assert!(
        kw == k,
        "projection: a weight of shape {ws:?} does not take x of shape {xs:?}"
    );
    if let Some(b) = bias {
        let bs = b.shape().to_vec();
        assert!(
            bs == [n],
            "projection: the bias must be [{n}] for a weight {ws:?}, got {bs:?}"
        );
    }
    [m, k, n]
}

/// [`projection::forward`] on tensors, in `E`; the output of `x`'s type.
fn project<B: NdArrayBackend, E: HostFloat>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
) -> FloatTensor<B> {
    let dims = projection_dims::<B>(&x, &weight, bias.as_ref());
    let dtype = x.dtype();
    let (x, weight) = (typed::<B>(x, E::dtype()), typed::<B>(weight, E::dtype()));
    let bias = bias.map(|b| typed::<B>(b, E::dtype()));
    let (xv, wv) = (values::<E, Ix2>(&x), values::<E, Ix2>(&weight));
    let bv = bias.as_ref().map(values::<E, Ix1>);
    let y = projection::forward(slice(&xv), slice(&wv), bv.as_ref().map(slice), dims);
    typed::<B>(E::tensor(y, &[dims[0], dims[2]]), dtype)
}

/// [`projection::backward`] on tensors, in `E`; each gradient of its input's type.
fn project_backward<B: NdArrayBackend, E: HostFloat>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<DType>,
    grad: FloatTensor<B>,
) -> ProjectionGrads<B> {
    let [m, k, n] = projection_dims::<B>(&x, &weight, None);
    let grad_shape = grad.shape().to_vec();
    assert!(
        grad_shape == [m, n],
        "projection: the output's gradient must be [{m}, {n}], got {grad_shape:?}"
    );
    let (x_type, w_type) = (x.dtype(), weight.dtype());
    let (x, weight) = (typed::<B>(x, E::dtype()), typed::<B>(weight, E::dtype()));
    let grad = typed::<B>(grad, E::dtype());
    let (xv, wv, gv) = (
        values::<E, Ix2>(&x),
        values::<E, Ix2>(&weight),
        values::<E, Ix2>(&grad),
    );
    let (dx, dw, db) = projection::backward(
        slice(&xv),
        slice(&wv),
        slice(&gv),
        bias.is_some(),
        [m, k, n],
    );
    ProjectionGrads {
        x: typed::<B>(E::tensor(dx, &[m, k]), x_type),
        weight: typed::<B>(E::tensor(dw, &[k, n]), w_type),
        bias: db
            .zip(bias)
            .map(|(db, t)| typed::<B>(E::tensor(db, &[n]), t)),
    }
}

impl<E, I, Q> SsdBackend for burn::backend::NdArray<E, I, Q>
where
    E: burn::backend::ndarray::FloatNdArrayElement,
    I: burn::backend::ndarray::IntNdArrayElement,
    Q: burn::backend::ndarray::QuantElement,
    NdArrayTensor: From<burn::backend::ndarray::SharedArray<E>>,
    NdArrayTensor: From<burn::backend::ndarray::SharedArray<I>>,
{
    fn ssd_chunked(inputs: SsdPrimitives<Self>) -> (FloatTensor<Self>, FloatTensor<Self>) {
        if !fused(inputs.x.dtype(), inputs.kernels) {
            return tensor_ops(inputs);
        }
        match inputs.x.dtype() {
            DType::F32 => forward::<Self, f32>(inputs),
            DType::F64 => forward::<Self, f64>(inputs),
            _ => tensor_ops(inputs),
        }
    }

    fn has_fused_ssd(dtype: DType, _chunk_size: usize, kernels: FusedKernels) -> bool {
        fused(dtype, kernels)
    }

    fn ssd_chunked_backward(
        inputs: SsdPrimitives<Self>,
        grad_y: FloatTensor<Self>,
        grad_state: FloatTensor<Self>,
    ) -> SsdGrads<Self> {
        match inputs.x.dtype() {
            DType::F64 => backward::<Self, f64>(inputs, grad_y, grad_state),
            _ => backward::<Self, f32>(inputs, grad_y, grad_state),
        }
    }
}

/// The projections as `gemm` products on the slices, for `f32` and `f64` (the mode,
/// [`FusedKernels::Never`] included, is applied by [`super::projection::projection`]).
impl<E, I, Q> ProjectionBackend for burn::backend::NdArray<E, I, Q>
where
    E: burn::backend::ndarray::FloatNdArrayElement,
    I: burn::backend::ndarray::IntNdArrayElement,
    Q: burn::backend::ndarray::QuantElement,
    NdArrayTensor: From<burn::backend::ndarray::SharedArray<E>>,
    NdArrayTensor: From<burn::backend::ndarray::SharedArray<I>>,
{
    fn projection(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        match x.dtype() {
            DType::F32 => project::<Self, f32>(x, weight, bias),
            DType::F64 => project::<Self, f64>(x, weight, bias),
            _ => <Self as ModuleOps<Self>>::linear(x, weight, bias),
        }
    }

    fn has_fused_projection(dtype: DType) -> bool {
        runs(dtype)
    }

    fn projection_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<DType>,
        grad: FloatTensor<Self>,
    ) -> ProjectionGrads<Self> {
        match x.dtype() {
            DType::F64 => project_backward::<Self, f64>(x, weight, bias, grad),
            _ => project_backward::<Self, f32>(x, weight, bias, grad),
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, NdArray};
    use burn::tensor::{DType, Tensor};
    use rand::{rngs::StdRng, SeedableRng};

    use burn::backend::ndarray::NdArrayTensor;

    use crate::ssd::backend::SsdBackend;
    use crate::ssd::chunked::tests::uniform;
    use crate::ssd::fused::FusedKernels;
    use crate::ssd::projection::ProjectionBackend;
    use crate::ssd::tests::{fused_matches_tensor_ops, F32_PRODUCTS};
    use crate::ssd::{ssd_chunked, SsdInput};

    #[test]
    fn fused_matches_tensor_ops_on_ndarray() {
        // NdArray's fused scan has no intra-chunk variants: it ignores the choice
        let products = crate::ssd::fused::ScanProducts::Tiled;
        let device = Default::default();
        fused_matches_tensor_ops::<Autodiff<NdArray>, Autodiff<NdArray>>(
            &device,
            &device,
            products,
            F32_PRODUCTS,
        );
    }

    /// Every chunk length runs fused in both float types; autodiff wraps the inner backend's.
    #[test]
    fn ndarray_runs_the_fused_scan() {
        for q in [1, 64, 256, 1024] {
            for mode in [FusedKernels::Measured, FusedKernels::Always] {
                assert!(NdArray::<f32>::has_fused_ssd(DType::F32, q, mode));
                assert!(NdArray::<f64>::has_fused_ssd(DType::F64, q, mode));
                assert!(!<Autodiff<NdArray>>::has_fused_ssd(DType::F32, q, mode));
            }
            assert!(!NdArray::<f32>::has_fused_ssd(
                DType::F32,
                q,
                FusedKernels::Never
            ));
        }
        assert!(!NdArray::<f32>::has_fused_ssd(
            DType::F16,
            64,
            FusedKernels::Always
        ));
    }

    /// Inputs that are views in another layout (as the mixer's splits of its projection are)
    /// give the same scan, bit for bit, as row-major copies of them.
    #[test]
    fn inputs_in_any_layout_read_the_same_values() {
        let device = Default::default();
        let mut rng = StdRng::seed_from_u64(5);
        let (b, l, h, p, g, n, q) = (2, 13, 4, 3, 2, 5, 4);
        let x = uniform::<NdArray, 4>(&mut rng, [b, h, l, p], -1.0..1.0, &device).swap_dims(1, 2);
        let dt = uniform::<NdArray, 3>(&mut rng, [h, b, l], 0.01..0.5, &device).permute([1, 2, 0]);
        let a = uniform::<NdArray, 1>(&mut rng, [h], -2.0..-0.1, &device);
        let b_mat =
            uniform::<NdArray, 4>(&mut rng, [b, l, n, g], -1.0..1.0, &device).swap_dims(2, 3);
        let c_mat =
            uniform::<NdArray, 4>(&mut rng, [n, b, l, g], -1.0..1.0, &device).permute([1, 2, 3, 0]);
        let init =
            uniform::<NdArray, 4>(&mut rng, [b, h, n, p], -1.0..1.0, &device).swap_dims(2, 3);
        let copy = |t: Tensor<NdArray, 4>| Tensor::<NdArray, 4>::from_data(t.to_data(), &device);
        let run = |x, dt, b_mat, c_mat, init| {
            let (y, last) = ssd_chunked(
                SsdInput::new(x, dt, a.clone(), b_mat, c_mat, q).initial_state(Some(init)),
            );
            (y.into_data(), last.into_data())
        };
        let views = run(
            x.clone(),
            dt.clone(),
            b_mat.clone(),
            c_mat.clone(),
            init.clone(),
        );
        let dt_copy = Tensor::<NdArray, 3>::from_data(dt.to_data(), &device);
        let copies = run(copy(x), dt_copy, copy(b_mat), copy(c_mat), copy(init));
        assert_eq!(views, copies);
    }

    /// The fused projection and its gradients against Burn's `linear` under autodiff, with the
    /// operands in other layouts (a column slice of a wider weight, as the mixer's pieces are,
    /// and a transposed `x`), with and without a bias; `f32` within 1e-5 of the largest value
    /// (sums in another order), `f64` within 1e-12.
    fn projection_matches_linear<E: burn::backend::ndarray::FloatNdArrayElement>(tolerance: f64)
    where
        NdArrayTensor: From<burn::backend::ndarray::SharedArray<E>>,
    {
        use crate::ssd::primitive::{float, primitive};
        type A<E> = Autodiff<NdArray<E>>;
        let device = Default::default();
        let mut rng = StdRng::seed_from_u64(9);
        // values drawn in f32, cast to E (the device's default float type is f32 in this
        // process: the other tests' tensors fix it)
        let dtype = <E as burn::tensor::Element>::dtype();
        let mut draw =
            |shape: [usize; 2]| uniform::<A<E>, 2>(&mut rng, shape, -1.0..1.0, &device).cast(dtype);
        for (m, k, n, with_bias) in [(70, 48, 33, true), (5, 7, 1, false), (1, 3, 9, true)] {
            let wide = draw([k, n + 5]).require_grad();
            let x_t = draw([k, m]).require_grad();
            let bias = draw([1, n + 5]).reshape([n + 5]).require_grad();
            let weigh = draw([m, n]);
            assert_eq!(x_t.dtype(), dtype);
            let run = |fused: bool| {
                let (x, w) = (x_t.clone().transpose(), wide.clone().narrow(1, 2, n));
                let b = with_bias.then(|| bias.clone().narrow(0, 2, n));
                let y: Tensor<A<E>, 2> = if fused {
                    float(<A<E>>::projection(
                        primitive(x),
                        primitive(w),
                        b.map(primitive),
                    ))
                } else {
                    burn::tensor::module::linear(x, w, b)
                };
                let grads = (y.clone() * weigh.clone()).sum().backward();
                let mut out = vec![y.inner().into_data(), x_t.grad(&grads).unwrap().into_data()];
                out.push(wide.grad(&grads).unwrap().into_data());
                if with_bias {
                    out.push(bias.grad(&grads).unwrap().into_data());
                }
                out
            };
            for (name, (got, want)) in ["y", "dx", "dw", "db"]
                .into_iter()
                .zip(run(true).into_iter().zip(run(false)))
            {
                let (got, want) = (
                    got.convert::<f64>().to_vec::<f64>().unwrap(),
                    want.convert::<f64>().to_vec::<f64>().unwrap(),
                );
                assert_eq!(got.len(), want.len(), "{name}");
                let scale = want.iter().fold(0.0f64, |a, v| a.max(v.abs()));
                let worst = got
                    .iter()
                    .zip(&want)
                    .fold(0.0f64, |a, (g, w)| a.max((g - w).abs()));
                assert!(
                    worst <= tolerance * scale,
                    "{name} of {m}×{k}×{n}: off by {worst:e} of {scale:e}"
                );
            }
        }
    }

    #[test]
    fn projections_match_linear_in_f32_and_f64() {
        assert!(NdArray::<f32>::has_fused_projection(DType::F32));
        assert!(!NdArray::<f32>::has_fused_projection(DType::F16));
        projection_matches_linear::<f32>(1e-5);
        projection_matches_linear::<f64>(1e-12);
    }
}
