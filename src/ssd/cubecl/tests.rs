//! The fused scan against the tensor-op form on the same backend: outputs, final states and
//! every gradient, on `Fusion<CubeBackend>` (what `Wgpu` is) and on the bare `CubeBackend`.

use burn::backend::Autodiff;
use burn::tensor::{Tensor, TensorData};
use rand::{rngs::StdRng, Rng, SeedableRng};

use crate::ssd::backend::SsdAutodiffBackend;
use crate::ssd::chunked::tests::{assert_close, uniform};
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

/// For every case: y, the final state and the gradients of x, dt, A, B, C and the initial
/// state of a random linear function of both, fused and as tensor operations.
fn fused_matches_tensor_ops<B: SsdAutodiffBackend>(device: &B::Device) {
    let mut rng = StdRng::seed_from_u64(41);
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
            let (y, state) = if fused {
                ssd_chunked(input)
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
        assert_close(&what("y"), fused.0, reference.0);
        assert_close(&what("final state"), fused.1, reference.1);
        for (name, (f, r)) in ["dx", "dB", "dC"]
            .iter()
            .zip(fused.2.into_iter().zip(reference.2))
        {
            assert_close(&what(name), f, r);
        }
        assert_close(&what("ddt"), fused.3, reference.3);
        assert_close(&what("dA"), fused.4, reference.4);
        match (fused.5, reference.5) {
            (Some(f), Some(r)) => assert_close(&what("d initial state"), f, r),
            (None, None) => {}
            _ => panic!("{}", what("initial-state gradient on one path only")),
        }
    }
}

/// Chunks longer than the fused scan takes run the tensor operations, on both backend types.
#[cfg(feature = "wgpu")]
#[test]
fn long_chunks_take_the_tensor_operations() {
    use super::FUSED_MAX_CHUNK;
    use crate::ssd::backend::SsdBackend;
    use burn::tensor::DType;
    type Cube = burn_cubecl::CubeBackend<burn::backend::wgpu::WgpuRuntime, f32, i32, u32>;
    for (q, fused) in [
        (1, true),
        (FUSED_MAX_CHUNK, true),
        (FUSED_MAX_CHUNK + 1, false),
    ] {
        assert_eq!(Cube::has_fused_ssd(DType::F32, q), fused, "q = {q}");
        assert_eq!(
            <burn::backend::Wgpu>::has_fused_ssd(DType::F32, q),
            fused,
            "q = {q}"
        );
        // autodiff wraps the fused scan of its inner backend, it has none of its own
        assert!(!<Autodiff<burn::backend::Wgpu>>::has_fused_ssd(
            DType::F32,
            q
        ));
    }
}

#[cfg(feature = "wgpu")]
#[test]
#[ignore = "needs a device driver: run with -- --ignored"]
fn fused_matches_tensor_ops_on_wgpu() {
    fused_matches_tensor_ops::<Autodiff<burn::backend::Wgpu>>(&Default::default());
}

#[cfg(feature = "wgpu")]
#[test]
#[ignore = "needs a device driver: run with -- --ignored"]
fn fused_matches_tensor_ops_on_cube_backend_without_fusion() {
    type Cube = burn_cubecl::CubeBackend<burn::backend::wgpu::WgpuRuntime, f32, i32, u32>;
    fused_matches_tensor_ops::<Autodiff<Cube>>(&Default::default());
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a device driver: run with -- --ignored"]
fn fused_matches_tensor_ops_on_cuda() {
    fused_matches_tensor_ops::<Autodiff<burn::backend::Cuda>>(&Default::default());
}

/// A scan whose scores `C·Bᵀ` and their gradient (`[b, c, g, q, q]`, one group per head
/// here, 18 GiB of `f32` each) hold more than 2³² elements: the output and gradients of its
/// last eight heads (and groups) equal those of a scan of those alone (every buffer of that one
/// below 2³²), so an index that wrapped at 2³² would read another group's or chunk's values.
/// About 45 GB of device memory: Cuda only (WGSL has no 64-bit integers).
#[cfg(feature = "cuda")]
fn indices_past_u32<B: SsdAutodiffBackend>(device: &B::Device) {
    let (b, h, p, g, n, q) = (1, 72, 2, 72, 2, 256);
    let l = 960 * q;
    assert!(b * (l / q) * g * q * q > u32::MAX as usize);
    let mut rng = StdRng::seed_from_u64(43);
    let x = uniform::<B, 4>(&mut rng, [b, l, h, p], -1.0..1.0, device);
    let dt = uniform::<B, 3>(&mut rng, [b, l, h], 0.001..0.1, device);
    let a = uniform::<B, 1>(&mut rng, [h], -1.0..-0.1, device);
    let b_mat = uniform::<B, 4>(&mut rng, [b, l, g, n], -1.0..1.0, device);
    let c_mat = uniform::<B, 4>(&mut rng, [b, l, g, n], -1.0..1.0, device);
    let w_y = uniform::<B, 4>(&mut rng, [b, l, h, p], -1.0..1.0, device);
    let heads = h - 8..h;
    let run = |x: Tensor<B, 4>,
               dt: Tensor<B, 3>,
               a: Tensor<B, 1>,
               b_mat: Tensor<B, 4>,
               c_mat: Tensor<B, 4>,
               w_y: Tensor<B, 4>| {
        let leaves = (
            x.require_grad(),
            dt.require_grad(),
            a.require_grad(),
            b_mat.require_grad(),
            c_mat.require_grad(),
        );
        let input = SsdInput::new(
            leaves.0.clone(),
            leaves.1.clone(),
            leaves.2.clone(),
            leaves.3.clone(),
            leaves.4.clone(),
            q,
        );
        let (y, state) = ssd_chunked(input);
        let grads = (y.clone() * w_y).sum().backward();
        (
            y.inner(),
            state.inner(),
            [
                leaves.0.grad(&grads).expect("dx"),
                leaves.3.grad(&grads).expect("dB"),
                leaves.4.grad(&grads).expect("dC"),
            ],
            leaves.1.grad(&grads).expect("ddt"),
            leaves.2.grad(&grads).expect("dA"),
        )
    };
    let whole = run(
        x.clone(),
        dt.clone(),
        a.clone(),
        b_mat.clone(),
        c_mat.clone(),
        w_y.clone(),
    );
    let part = run(
        x.slice([0..b, 0..l, heads.clone()]),
        dt.slice([0..b, 0..l, heads.clone()]),
        a.slice([heads.clone()]),
        b_mat.slice([0..b, 0..l, heads.clone()]),
        c_mat.slice([0..b, 0..l, heads.clone()]),
        w_y.slice([0..b, 0..l, heads.clone()]),
    );
    let last = |t: Tensor<B::InnerBackend, 4>| t.narrow(2, h - 8, 8);
    assert_close("y", last(whole.0), part.0);
    assert_close("final state", whole.1.narrow(1, h - 8, 8), part.1);
    for (name, (w, p)) in ["dx", "dB", "dC"]
        .iter()
        .zip(whole.2.into_iter().zip(part.2))
    {
        assert_close(name, last(w), p);
    }
    assert_close("ddt", whole.3.narrow(2, h - 8, 8), part.3);
    assert_close("dA", whole.4.narrow(0, h - 8, 8), part.4);
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a GPU with about 40 GB: run with -- --ignored"]
fn indices_past_u32_read_the_right_elements_on_cuda() {
    indices_past_u32::<Autodiff<burn::backend::Cuda>>(&Default::default());
}
