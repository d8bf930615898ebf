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
//! Nothing here depends on burn-ndarray's internals: the tensors are read and written through
//! `TensorData` (a copy each way, small next to the scan: the scan reads each input `O(q)`
//! times), so a project that depends on this crate runs the same code as its tests.
//!
//! Why by hand: the tensor operations of the chunked form on burn-ndarray materialise every
//! intermediate (`b·c·h·q²` decay matrices and products, their copies for broadcasting, and
//! autodiff's saved operands), where the scan needs a few `q × q` and `q × p` buffers per
//! thread. No crate computes a chunked state-space scan.

mod backward;
mod decay;
mod forward;
mod layout;
mod matmul;

use burn::tensor::ops::FloatTensor;
use burn::tensor::{backend::Backend, DType, Element, Tensor, TensorData, TensorMetadata};
use rayon::prelude::*;

use super::backend::{float, primitive, tensor_ops, SsdBackend, SsdGrads, SsdPrimitives};
use crate::precision::cast_to;
use layout::{Dims, Inputs, Task};
use matmul::Real;

/// Whether the CPU scan runs inputs of type `dtype` (any chunk length runs).
pub(crate) fn runs(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F64)
}

/// The scan's sizes, after checking that the inputs' shapes agree; panics naming the tensor
/// that does not (the models build them consistently: a mismatch is a caller's bug, and the
/// scan must not read one tensor with another's layout).
fn dims<B: Backend>(inputs: &SsdPrimitives<B>) -> Dims {
    let shape = |t: &FloatTensor<B>| t.shape().to_vec();
    let x = shape(&inputs.x);
    let [b, l, h, p] = <[usize; 4]>::try_from(x.as_slice())
        .unwrap_or_else(|_| panic!("SSD: x must be [b, l, h, p], got {x:?}"));
    let bm = shape(&inputs.b_mat);
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
    expect("C", shape(&inputs.c_mat), &[b, l, g, n]);
    if let Some(s) = &inputs.initial_state {
        expect("the initial state", shape(s), &[b, h, p, n]);
    }
    if let Some(s) = &inputs.starts {
        expect("the document starts", shape(s), &[b, l]);
    }
    Dims::new([b, l, h, p], g, n, inputs.chunk_size)
}

/// A primitive's values as `E`, row-major.
fn host<B: Backend, E: Element, const D: usize>(t: FloatTensor<B>) -> Vec<E> {
    float::<B, D>(t)
        .into_data()
        .convert::<E>()
        .into_vec::<E>()
        .expect("values converted to the scan's type")
}

/// Values `E` of shape `shape` as a primitive on `device`, of type `dtype`.
fn device<B: Backend, E: Element, const D: usize>(
    values: Vec<E>,
    shape: [usize; D],
    device: &B::Device,
    dtype: DType,
) -> FloatTensor<B> {
    let t = Tensor::<B, D>::from_data(TensorData::new(values, shape), (device, E::dtype()));
    primitive(cast_to(t, dtype))
}

/// The inputs on the host, as `E`.
struct Host<E> {
    x: Vec<E>,
    dt: Vec<E>,
    a: Vec<E>,
    b_mat: Vec<E>,
    c_mat: Vec<E>,
    initial: Option<Vec<E>>,
    starts: Option<Vec<E>>,
}

impl<E: Real + Element> Host<E> {
    fn of<B: Backend>(inputs: SsdPrimitives<B>) -> Self {
        Self {
            x: host::<B, E, 4>(inputs.x),
            dt: host::<B, E, 3>(inputs.dt),
            a: host::<B, E, 1>(inputs.a),
            b_mat: host::<B, E, 4>(inputs.b_mat),
            c_mat: host::<B, E, 4>(inputs.c_mat),
            initial: inputs.initial_state.map(host::<B, E, 4>),
            starts: inputs.starts.map(host::<B, E, 2>),
        }
    }

    fn inputs(&self) -> Inputs<'_, E> {
        Inputs {
            x: &self.x,
            dt: &self.dt,
            a: &self.a,
            b_mat: &self.b_mat,
            c_mat: &self.c_mat,
            initial: self.initial.as_deref(),
            starts: self.starts.as_deref(),
        }
    }
}

/// The scan's forward in `E`: `y` `[b, l, h, p]` and the final state `[b, h, p, n]`, both of
/// `x`'s type.
pub(crate) fn forward<B: Backend, E: Real + Element>(
    inputs: SsdPrimitives<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let d = dims(&inputs);
    let (dtype, dev) = (inputs.x.dtype(), B::float_device(&inputs.x));
    let values = Host::<E>::of(inputs);
    let f = values.inputs();
    let tasks = Task::all(&d, rayon::current_num_threads());
    let outputs: Vec<_> = tasks
        .par_iter()
        .map(|task| forward::forward(&f, &d, task))
        .collect();
    let (l, h, p, n) = (d.l, d.h, d.p, d.n);
    let mut y = vec![E::ZERO; d.b * l * h * p];
    let mut last = vec![E::ZERO; d.b * h * p * n];
    for (task, out) in tasks.iter().zip(outputs) {
        for (hl, hh) in task.heads.clone().enumerate() {
            for t in 0..l {
                let at = ((task.bi * l + t) * h + hh) * p;
                y[at..at + p].copy_from_slice(&out.y[(hl * l + t) * p..(hl * l + t + 1) * p]);
            }
            let at = (task.bi * h + hh) * p * n;
            last[at..at + p * n].copy_from_slice(&out.last[hl * p * n..(hl + 1) * p * n]);
        }
    }
    (
        device::<B, E, 4>(y, [d.b, l, h, p], &dev, dtype),
        device::<B, E, 4>(last, [d.b, h, p, n], &dev, dtype),
    )
}

/// The scan's gradient in `E`, from those of `y` and of the final state; each gradient of its
/// input's type.
pub(crate) fn backward<B: Backend, E: Real + Element>(
    inputs: SsdPrimitives<B>,
    grad_y: FloatTensor<B>,
    grad_state: FloatTensor<B>,
) -> SsdGrads<B> {
    let d = dims(&inputs);
    let dev = B::float_device(&inputs.x);
    let types = [
        inputs.x.dtype(),
        inputs.dt.dtype(),
        inputs.a.dtype(),
        inputs.b_mat.dtype(),
        inputs.c_mat.dtype(),
    ];
    let initial_type = inputs.initial_state.as_ref().map(|t| t.dtype());
    let values = Host::<E>::of(inputs);
    let (dy, dlast) = (host::<B, E, 4>(grad_y), host::<B, E, 4>(grad_state));
    assert_eq!(dy.len(), d.b * d.l * d.h * d.p, "SSD: dy must be y's shape");
    assert_eq!(
        dlast.len(),
        d.b * d.h * d.p * d.n,
        "SSD: the final state's gradient"
    );
    let f = values.inputs();
    let tasks = Task::all(&d, rayon::current_num_threads());
    let grads: Vec<_> = tasks
        .par_iter()
        .map(|task| backward::backward(&f, &dy, &dlast, &d, task))
        .collect();
    let (b, l, h, g, p, n) = (d.b, d.l, d.h, d.g, d.p, d.n);
    let size = p * n;
    let mut dx = vec![E::ZERO; b * l * h * p];
    let mut ddt = vec![E::ZERO; b * l * h];
    let mut da = vec![E::ZERO; h];
    let mut db = vec![E::ZERO; b * l * g * n];
    let mut dc = vec![E::ZERO; b * l * g * n];
    let mut dinit = vec![E::ZERO; b * h * size];
    for (task, grad) in tasks.iter().zip(grads) {
        let bi = task.bi;
        for (hl, hh) in task.heads.clone().enumerate() {
            for t in 0..l {
                let at = ((bi * l + t) * h + hh) * p;
                dx[at..at + p].copy_from_slice(&grad.x[(hl * l + t) * p..(hl * l + t + 1) * p]);
                ddt[(bi * l + t) * h + hh] = grad.dt[hl * l + t];
            }
            da[hh] += grad.a[hl];
            let at = (bi * h + hh) * size;
            dinit[at..at + size].copy_from_slice(&grad.initial[hl * size..(hl + 1) * size]);
        }
        for t in 0..l {
            let at = ((bi * l + t) * g + task.gi) * n;
            for (total, part) in [(&mut db, &grad.b_mat), (&mut dc, &grad.c_mat)] {
                for (o, &v) in total[at..at + n].iter_mut().zip(&part[t * n..(t + 1) * n]) {
                    *o += v;
                }
            }
        }
    }
    SsdGrads {
        x: device::<B, E, 4>(dx, [b, l, h, p], &dev, types[0]),
        dt: device::<B, E, 3>(ddt, [b, l, h], &dev, types[1]),
        a: device::<B, E, 1>(da, [h], &dev, types[2]),
        b_mat: device::<B, E, 4>(db, [b, l, g, n], &dev, types[3]),
        c_mat: device::<B, E, 4>(dc, [b, l, g, n], &dev, types[4]),
        initial_state: initial_type.map(|t| device::<B, E, 4>(dinit, [b, h, p, n], &dev, t)),
    }
}

impl<E, I, Q> SsdBackend for burn::backend::NdArray<E, I, Q>
where
    E: burn::backend::ndarray::FloatNdArrayElement,
    I: burn::backend::ndarray::IntNdArrayElement,
    Q: burn::backend::ndarray::QuantElement,
    burn::backend::ndarray::NdArrayTensor: From<burn::backend::ndarray::SharedArray<E>>,
    burn::backend::ndarray::NdArrayTensor: From<burn::backend::ndarray::SharedArray<I>>,
{
    fn ssd_chunked(inputs: SsdPrimitives<Self>) -> (FloatTensor<Self>, FloatTensor<Self>) {
        match inputs.x.dtype() {
            DType::F32 => forward::<Self, f32>(inputs),
            DType::F64 => forward::<Self, f64>(inputs),
            _ => tensor_ops(inputs),
        }
    }

    fn has_fused_ssd(dtype: DType, _chunk_size: usize) -> bool {
        runs(dtype)
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

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, NdArray};
    use burn::tensor::DType;

    use crate::ssd::backend::SsdBackend;
    use crate::ssd::tests::fused_matches_tensor_ops;

    #[test]
    fn fused_matches_tensor_ops_on_ndarray() {
        fused_matches_tensor_ops::<Autodiff<NdArray>>(&Default::default());
    }

    /// Every chunk length runs fused in both float types; autodiff wraps the inner backend's.
    #[test]
    fn ndarray_runs_the_fused_scan() {
        for q in [1, 64, 256, 1024] {
            assert!(NdArray::<f32>::has_fused_ssd(DType::F32, q));
            assert!(NdArray::<f64>::has_fused_ssd(DType::F64, q));
            assert!(!<Autodiff<NdArray>>::has_fused_ssd(DType::F32, q));
        }
        assert!(!NdArray::<f32>::has_fused_ssd(DType::F16, 64));
    }
}
