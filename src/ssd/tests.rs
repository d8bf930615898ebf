//! The fused scans against the tensor-op form on the same backend: outputs, final states and
//! every gradient, for each backend's own tests (`ndarray`, `cubecl`).

use burn::tensor::{Tensor, TensorData};
use rand::{rngs::StdRng, Rng, SeedableRng};

use crate::ssd::backend::{SsdAutodiffBackend, SsdBackend};
use crate::ssd::chunked::tests::{assert_within, uniform};
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

/// For every case: y, the final state and the gradients of x, dt, A, B, C and the initial
/// state of a random linear function of both, fused (its intra-chunk products as `products`
/// says) and as tensor operations, within `tol`; prints the worst errors.
pub(crate) fn fused_matches_tensor_ops<B: SsdAutodiffBackend>(
    device: &B::Device,
    products: ScanProducts,
    tol: Tolerance,
) {
    let mut rng = StdRng::seed_from_u64(41);
    let mut worst = (0.0f64, 0.0f64);
    for (k, case) in CASES.iter().enumerate() {
        let Case {
            b,
            l,
            h,
            p,
            g,
            n,
            q,
            ..
        } = *case;
        let x = uniform::<B, 4>(&mut rng, [b, l, h, p], -1.0..1.0, device);
        // otherwise both sides would be the tensor operations
        assert!(
            B::InnerBackend::has_fused_ssd(x.dtype(), q, FusedKernels::Always),
            "case {k}: the backend runs no fused scan for it"
        );
        let dt = uniform::<B, 3>(&mut rng, [b, l, h], 0.001..case.dt_max, device);
        let a = uniform::<B, 1>(&mut rng, [h], -case.a_max..-0.1, device);
        let b_mat = uniform::<B, 4>(&mut rng, [b, l, g, n], -1.0..1.0, device);
        let c_mat = uniform::<B, 4>(&mut rng, [b, l, g, n], -1.0..1.0, device);
        let initial = case
            .initial
            .then(|| uniform::<B, 4>(&mut rng, [b, h, p, n], -1.0..1.0, device));
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
            Tensor::<B, 2>::from_data(TensorData::new(values, [b, l]), device)
        });
        let w_y = uniform::<B, 4>(&mut rng, [b, l, h, p], -1.0..1.0, device);
        let w_s = uniform::<B, 4>(&mut rng, [b, h, p, n], -1.0..1.0, device);

        let run = |fused: bool| {
            let leaves = (
                x.clone().require_grad(),
                dt.clone().require_grad(),
                a.clone().require_grad(),
                b_mat.clone().require_grad(),
                c_mat.clone().require_grad(),
                initial.clone().map(|t| t.require_grad()),
            );
            let input = SsdInput::new(
                leaves.0.clone(),
                leaves.1.clone(),
                leaves.2.clone(),
                leaves.3.clone(),
                leaves.4.clone(),
                q,
            )
            .initial_state(leaves.5.clone())
            .document_starts(starts.clone());
            // the fused kernels wherever the backend has them, also where the default
            // (`Measured`) runs the tensor operations
            let (y, state) = if fused {
                ssd_chunked(
                    input
                        .fused_kernels(FusedKernels::Always)
                        .scan_products(products),
                )
            } else {
                ssd_chunked_tensor_ops(input)
            };
            let loss = (y.clone() * w_y.clone()).sum() + (state.clone() * w_s.clone()).sum();
            let grads = loss.backward();
            let grad = |t: &Tensor<B, 4>| t.grad(&grads).expect("a gradient");
            (
                y.inner(),
                state.inner(),
                [grad(&leaves.0), grad(&leaves.3), grad(&leaves.4)],
                leaves.1.grad(&grads).expect("dt"),
                leaves.2.grad(&grads).expect("a"),
                leaves.5.as_ref().map(grad),
            )
        };
        let fused = run(true);
        let reference = run(false);
        let what = |name: &str| format!("case {k} {case:?}: {name}");
        let forward = assert_within(&what("y"), fused.0, reference.0, tol.forward).max(
            assert_within(&what("final state"), fused.1, reference.1, tol.forward),
        );
        let mut grad: f64 = 0.0;
        for (name, (f, r)) in ["dx", "dB", "dC"]
            .iter()
            .zip(fused.2.into_iter().zip(reference.2))
        {
            grad = grad.max(assert_within(&what(name), f, r, tol.grad));
        }
        grad = grad.max(assert_within(&what("ddt"), fused.3, reference.3, tol.grad));
        grad = grad.max(assert_within(&what("dA"), fused.4, reference.4, tol.grad));
        match (fused.5, reference.5) {
            (Some(f), Some(r)) => {
                grad = grad.max(assert_within(&what("d initial state"), f, r, tol.grad));
            }
            (None, None) => {}
            _ => panic!("{}", what("initial-state gradient on one path only")),
        }
        worst = (worst.0.max(forward), worst.1.max(grad));
    }
    eprintln!(
        "fused ({products:?} products) vs tensor operations: worst relative error {:.2e} (outputs, \
         states), {:.2e} (gradients)",
        worst.0, worst.1
    );
}
