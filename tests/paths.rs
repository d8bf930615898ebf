//! Agreement of the three SSD paths (chunked, sequential, step), of their gradients, and of the
//! streaming APIs (whole sequence, pieces, prefill + steps, the streaming forecaster) on random
//! configs in f32, and a short Learner run: written once (`tests/paths/cases.rs`) and run on
//! every backend that is built, NdArray always and, with `--features wgpu`, Burn's Wgpu backend
//! with kernel fusion (`Wgpu`, as users get it) and without (`CubeBackend<WgpuRuntime, ..>`).
//!
//! Tolerance: max abs error <= 1e-5 x the reference tensor's max magnitude, on every backend
//! whose `f32` products are `f32` (NdArray, Wgpu). Burn's Cuda backend may multiply `f32` on
//! tensor cores as TF32 (cubek's accelerated matmuls, which its autotune picks where they are
//! fastest), whose operands keep f16's 10-bit mantissa: there the tolerances are
//! those of the half-precision reference tests (`tests/reference.rs`), 1e-2 for outputs and
//! states, 7.5e-2 for gradients.

mod ndarray {
    type B = burn::backend::NdArray<f32>;
    const NAME: &str = "ndarray";
    const TOL: f64 = 1e-5;
    const GRAD_TOL: f64 = 1e-5;

    macro_rules! case {
        ($item:item) => {
            #[test]
            $item
        };
    }

    fn dev() -> burn::backend::ndarray::NdArrayDevice {
        Default::default()
    }

    include!("paths/cases.rs");

    /// The dedicated CPU step (`recurrent::CpuBackbone`) equals the chunked forward token by token,
    /// from the zero state and after a chunked prefill, on every mixer config (2 layers each).
    #[test]
    fn cpu_step_equals_forward() {
        use mamba2_burn::recurrent::CpuBackbone;
        let _rng = seeded(11);
        let mut worst: f64 = 0.0;
        for (k, config) in mixer_configs().into_iter().enumerate() {
            let backbone = Mamba2BackboneConfig::new(2, config.clone())
                .init::<B>(&dev())
                .unwrap();
            let cpu = CpuBackbone::from_backbone(&backbone);
            let (b, l, d) = (2, 19, config.d_model);
            let x = randn([b, l, d]);
            let (y_full, _) = backbone.forward(x.clone(), None).unwrap();
            let prefill = config.chunk_size.min(l - 2) + 1;
            let (_, s_pre) = backbone
                .forward(x.clone().narrow(1, 0, prefill), None)
                .unwrap();
            for i in 0..b {
                let xs: Vec<f32> = x.clone().narrow(0, i, 1).into_data().to_vec().unwrap();
                let expected = y_full.clone().narrow(0, i, 1);
                for start in [0, prefill] {
                    let mut state = if start == 0 {
                        cpu.zero_state()
                    } else {
                        cpu.state_from(&backbone, &s_pre, i).unwrap()
                    };
                    let mut ys = vec![0.0f32; (l - start) * d];
                    for t in start..l {
                        cpu.step(
                            &xs[t * d..(t + 1) * d],
                            &mut state,
                            &mut ys[(t - start) * d..(t - start + 1) * d],
                        )
                        .unwrap();
                    }
                    let got =
                        Tensor::<B, 3>::from_data(TensorData::new(ys, [1, l - start, d]), &dev());
                    worst = worst.max(assert_close(
                        &format!("config {k}, sequence {i}: cpu steps from {start}"),
                        got,
                        expected.clone().narrow(1, start, l - start),
                    ));
                }
            }
            // wrong sizes are errors, not panics
            let mut state = cpu.zero_state();
            let mut out = vec![0.0f32; d];
            assert!(cpu.step(&vec![0.0; d + 1], &mut state, &mut out).is_err());
            assert!(cpu.state_from(&backbone, &s_pre, b).is_err());
        }
        eprintln!("cpu step: worst relative error {worst:.2e}");
    }
}

/// A module of the backend-neutral cases on backend `$backend`, a device backend, within
/// `$tol` (outputs and states) and `$grad_tol` (gradients): its tests are ignored unless asked
/// for (`-- --ignored`), as they need a device driver (for Wgpu on a machine without a GPU,
/// Mesa's lavapipe: README, Backends).
#[allow(unused_macros)]
macro_rules! cases_on {
    ($module:ident, $backend:ty, $device:ty, $name:literal, $tol:expr, $grad_tol:expr) => {
        mod $module {
            type B = $backend;
            const NAME: &str = $name;
            const TOL: f64 = $tol;
            const GRAD_TOL: f64 = $grad_tol;

            macro_rules! case {
                ($item:item) => {
                    #[test]
                    #[ignore = "needs a device driver: run with -- --ignored"]
                    $item
                };
            }

            thread_local! {
                // held by each test's thread until it ends
                static FUSED: mamba2_burn::ssd::FusedKernelsOverride =
                    mamba2_burn::ssd::override_fused_kernels(mamba2_burn::FusedKernels::Always);
            }

            fn dev() -> $device {
                // the fused kernels wherever the backend has them, also where the default
                // runs the tensor operations (Cuda, until measured), for the whole test
                FUSED.with(|_| ());
                Default::default()
            }

            include!("paths/cases.rs");
        }
    };
}

#[cfg(feature = "wgpu")]
cases_on!(
    wgpu_fused,
    burn::backend::Wgpu<f32, i32>,
    burn::backend::wgpu::WgpuDevice,
    "wgpu (fused)",
    1e-5,
    1e-5
);

#[cfg(feature = "wgpu")]
cases_on!(
    wgpu_unfused,
    burn::backend::wgpu::CubeBackend<burn::backend::wgpu::WgpuRuntime, f32, i32, u32>,
    burn::backend::wgpu::WgpuDevice,
    "wgpu (unfused)",
    1e-5,
    1e-5
);

#[cfg(feature = "cuda-tests")]
cases_on!(
    cuda,
    burn::backend::Cuda<f32, i32>,
    burn::backend::cuda::CudaDevice,
    "cuda (fused)",
    // TF32 products (module docs)
    1e-2,
    7.5e-2
);
