//! The fused scans against the tensor-op form on the same backend: outputs, final states and
//! every gradient, for each backend's own tests (`ndarray`, `cubecl`).

use burn::tensor::{DType, Tensor, TensorData};
use rand::{rngs::StdRng, Rng, SeedableRng};

use crate::ssd::backend::{SsdAutodiffBackend, SsdBackend};
use crate::ssd::chunked::tests::uniform_data;
use crate::ssd::fused::{FusedKernels, ScanProducts};
use crate::ssd::{ssd_chunked, ssd_chunked_tensor_ops, SsdInput};

/// One random configuration.
#[derive(Clone, Copy, Debug)]
struct Case {
    b: usize,
    l: usize,
    h: usize,
    p: usize,
    g: usize,
    n: usize,
    q: usize,
    initial: bool,
    starts: bool,
    /// dt drawn from `[0.001, dt_max)`, A from `[-a_max, -0.1)`
    dt_max: f32,
    a_max: f32,
}

const CASES: [Case; 7] = [
    // shorter than one chunk, two groups, an initial state
    Case {
        b: 2,
        l: 5,
        h: 4,
        p: 3,
        g: 2,
        n: 4,
        q: 8,
        initial: true,
        starts: false,
        dt_max: 0.5,
        a_max: 2.0,
    },
    // ragged length, one group, packed documents
    Case {
        b: 2,
        l: 19,
        h: 2,
        p: 4,
        g: 1,
        n: 3,
        q: 8,
        initial: false,
        starts: true,
        dt_max: 0.5,
        a_max: 2.0,
    },
    // one head per group, a multiple of the chunk, both
    Case {
        b: 1,
        l: 16,
        h: 3,
        p: 2,
        g: 3,
        n: 5,
        q: 4,
        initial: true,
        starts: true,
        dt_max: 0.5,
        a_max: 2.0,
    },
    // strong decays over several chunks
    Case {
        b: 2,
        l: 40,
        h: 2,
        p: 3,
        g: 1,
        n: 4,
        q: 16,
        initial: true,
        starts: false,
        dt_max: 3.0,
        a_max: 8.0,
    },
    // chunks of one token
    Case {
        b: 1,
        l: 6,
        h: 2,
        p: 2,
        g: 2,
        n: 2,
        q: 1,
        initial: true,
        starts: true,
        dt_max: 0.5,
        a_max: 2.0,
    },
    // a longer chunk
    Case {
        b: 1,
        l: 70,
        h: 2,
        p: 4,
        g: 1,
        n: 8,
        q: 64,
        initial: false,
        starts: false,
        dt_max: 0.2,
        a_max: 1.0,
    },
    // chunks of 256 (the reference kernels' default), weak decays, over a ragged second chunk
    Case {
        b: 1,
        l: 300,
        h: 2,
        p: 2,
        g: 1,
        n: 4,
        q: 256,
        initial: true,
        starts: true,
        dt_max: 0.1,
        a_max: 1.0,
    },
];

/// The largest relative errors `max |a - b| / max |b|` of a comparison of two scans on one
/// backend: of their outputs and final states, and of their gradients.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tolerance {
    pub(crate) forward: f64,
    pub(crate) grad: f64,
}

/// Where the products of `f32` are `f32` (NdArray, Wgpu): the path tests' 1e-5.
pub(crate) const F32_PRODUCTS: Tolerance = Tolerance {
    forward: 1e-5,
    grad: 1e-5,
};

/// One case's random values, drawn once on the host and sent to each backend that runs it.
struct Draw {
    x: TensorData,
    dt: TensorData,
    a: TensorData,
    b_mat: TensorData,
    c_mat: TensorData,
    initial: Option<TensorData>,
    starts: Option<TensorData>,
    /// the weights of the loss `Σ y·w_y + Σ state·w_s`
    w_y: TensorData,
    w_s: TensorData,
}

impl Draw {
    fn new(rng: &mut StdRng, case: &Case) -> Self {
        let Case {
            b, l, h, p, g, n, ..
        } = *case;
        let x = uniform_data(rng, &[b, l, h, p], -1.0..1.0);
        let dt = uniform_data(rng, &[b, l, h], 0.001..case.dt_max);
        let a = uniform_data(rng, &[h], -case.a_max..-0.1);
        let b_mat = uniform_data(rng, &[b, l, g, n], -1.0..1.0);
        let c_mat = uniform_data(rng, &[b, l, g, n], -1.0..1.0);
        let initial = case
            .initial
            .then(|| uniform_data(rng, &[b, h, p, n], -1.0..1.0));
        let starts = case.starts.then(|| {
            let values: Vec<f32> = (0..b * l)
                .map(|i| {
                    if i % l == 0 || rng.random_bool(0.2) {
                        1.0
                    } else {
                        0.0
                    }
                })
                .collect();
            TensorData::new(values, [b, l])
        });
        let w_y = uniform_data(rng, &[b, l, h, p], -1.0..1.0);
        let w_s = uniform_data(rng, &[b, h, p, n], -1.0..1.0);
        Self {
            x,
            dt,
            a,
            b_mat,
            c_mat,
            initial,
            starts,
            w_y,
            w_s,
        }
    }
}

/// What one scan gives, on the host: its outputs and final state, then the gradients of the
/// loss, each under its name.
type Outcome = Vec<(&'static str, TensorData)>;

/// The scan of `draw` in chunks of `q` on `B`: fused (its intra-chunk products as `fused`
/// says: the fused kernels wherever the backend has them, also where the default, `Measured`,
/// runs the tensor operations) or, with `None`, as tensor operations; with the gradients of
/// `Σ y·w_y + Σ state·w_s`.
fn run<B: SsdAutodiffBackend>(
    draw: &Draw,
    q: usize,
    fused: Option<ScanProducts>,
    device: &B::Device,
) -> Outcome {
    let leaf = |t: &TensorData| Tensor::<B, 4>::from_data(t.clone(), device).require_grad();
    let x = leaf(&draw.x);
    let dt = Tensor::<B, 3>::from_data(draw.dt.clone(), device).require_grad();
    let a = Tensor::<B, 1>::from_data(draw.a.clone(), device).require_grad();
    let (b_mat, c_mat) = (leaf(&draw.b_mat), leaf(&draw.c_mat));
    let initial = draw.initial.as_ref().map(leaf);
    let starts = draw
        .starts
        .as_ref()
        .map(|t| Tensor::<B, 2>::from_data(t.clone(), device));
    let input = SsdInput::new(
        x.clone(),
        dt.clone(),
        a.clone(),
        b_mat.clone(),
        c_mat.clone(),
        q,
    )
    .initial_state(initial.clone())
    .document_starts(starts);
    let (y, state) = match fused {
        Some(products) => ssd_chunked(
            input
                .fused_kernels(FusedKernels::Always)
                .scan_products(products),
        ),
        None => ssd_chunked_tensor_ops(input),
    };
    let w_y = Tensor::<B, 4>::from_data(draw.w_y.clone(), device);
    let w_s = Tensor::<B, 4>::from_data(draw.w_s.clone(), device);
    let loss = (y.clone() * w_y).sum() + (state.clone() * w_s).sum();
    let grads = loss.backward();
    let grad4 = |t: &Tensor<B, 4>| t.grad(&grads).expect("a gradient").into_data();
    let mut outcome = vec![
        ("y", y.inner().into_data()),
        ("final state", state.inner().into_data()),
        ("dx", grad4(&x)),
        ("dB", grad4(&b_mat)),
        ("dC", grad4(&c_mat)),
        ("ddt", dt.grad(&grads).expect("dt").into_data()),
        ("dA", a.grad(&grads).expect("a").into_data()),
    ];
    if let Some(initial) = &initial {
        outcome.push(("d initial state", grad4(initial)));
    }
    outcome
}

/// `max |a - b| <= tol · max |b|` over two tensors' values of one shape; the relative error
/// `max |a - b| / max |b|`.
fn within(what: &str, a: &TensorData, b: &TensorData, tol: f64) -> f64 {
    assert_eq!(a.shape, b.shape, "{what}: shapes differ");
    let values =
        |t: &TensorData| -> Vec<f64> { t.clone().convert::<f64>().to_vec().expect("values") };
    let (a, b) = (values(a), values(b));
    let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let err = a
        .iter()
        .zip(&b)
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
    let rel = err / scale.max(1e-30);
    assert!(rel <= tol, "{what}: relative error {rel:.3e} > {tol:e}");
    rel
}

/// For every case: y, the final state and the gradients of x, dt, A, B, C and the initial
/// state of a random linear function of both, fused on `B` (its intra-chunk products as
/// `products` says) and as tensor operations on `R` (`B` itself, or the CPU for a GPU backend
/// whose kernels take long to compile: `cubecl/tests.rs`), within `tol`; prints the worst
/// errors.
pub(crate) fn fused_matches_tensor_ops<B: SsdAutodiffBackend, R: SsdAutodiffBackend>(
    device: &B::Device,
    reference: &R::Device,
    products: ScanProducts,
    tol: Tolerance,
) {
    let mut rng = StdRng::seed_from_u64(41);
    let mut worst = (0.0f64, 0.0f64);
    for (k, case) in CASES.iter().enumerate() {
        // otherwise both sides would be the tensor operations
        assert!(
            B::InnerBackend::has_fused_ssd(DType::F32, case.q, FusedKernels::Always),
            "case {k}: the backend runs no fused scan for it"
        );
        let draw = Draw::new(&mut rng, case);
        let fused = run::<B>(&draw, case.q, Some(products), device);
        let expected = run::<R>(&draw, case.q, None, reference);
        compare(
            &format!("case {k} {case:?}"),
            &fused,
            &expected,
            tol,
            &mut worst,
        );
    }
    eprintln!(
        "fused ({products:?} products) vs tensor operations: worst relative error {:.2e} (outputs, \
         states), {:.2e} (gradients)",
        worst.0, worst.1
    );
}

/// The case of [`tensor_ops_match`]: several chunks, an initial state, packed documents and a
/// head per group, so that every branch of the tensor operations runs.
#[cfg(feature = "wgpu")]
const TENSOR_OPS_CASE: usize = 2;

/// The tensor operations on `B` against those on `R` (where [`fused_matches_tensor_ops`] runs
/// them on another backend), values and gradients within `tol`, on one of its cases (the same
/// numbers); prints the worst errors.
#[cfg(feature = "wgpu")]
pub(crate) fn tensor_ops_match<B: SsdAutodiffBackend, R: SsdAutodiffBackend>(
    device: &B::Device,
    reference: &R::Device,
    tol: Tolerance,
) {
    let mut rng = StdRng::seed_from_u64(41);
    let draws: Vec<Draw> = CASES[..=TENSOR_OPS_CASE]
        .iter()
        .map(|case| Draw::new(&mut rng, case))
        .collect();
    let (case, draw) = (&CASES[TENSOR_OPS_CASE], &draws[TENSOR_OPS_CASE]);
    let got = run::<B>(draw, case.q, None, device);
    let expected = run::<R>(draw, case.q, None, reference);
    let mut worst = (0.0f64, 0.0f64);
    let what = format!("tensor operations, case {TENSOR_OPS_CASE} {case:?}");
    compare(&what, &got, &expected, tol, &mut worst);
    eprintln!(
        "{what}, on two backends: worst relative error {:.2e} (outputs, states), {:.2e} \
         (gradients)",
        worst.0, worst.1
    );
}

/// Each value of `got` against the same of `expected` (outputs and states within
/// `tol.forward`, gradients within `tol.grad`), the worst of each kind kept in `worst`.
fn compare(what: &str, got: &Outcome, expected: &Outcome, tol: Tolerance, worst: &mut (f64, f64)) {
    assert_eq!(got.len(), expected.len(), "{what}: the same values");
    for (i, ((name, g), (_, e))) in got.iter().zip(expected).enumerate() {
        let (t, slot) = if i < 2 {
            (tol.forward, &mut worst.0)
        } else {
            (tol.grad, &mut worst.1)
        };
        *slot = slot.max(within(&format!("{what}: {name}"), g, e, t));
    }
}
