//! Golden tests against the PyTorch reference (Hugging Face transformers, float64 on float32
//! weights): logits, every layer's output, the final hidden states, the SSM and conv states
//! after the prompt, single-token decode logits, the loss and the gradient of every weight.
//!
//! Tolerances (max abs error relative to the largest magnitude of the expected tensor):
//! forward values and states 1e-4, gradients 1e-3; in `f16` (the Wgpu cases in half precision,
//! weights rounded to `f16` on loading) forward values and states 1e-2, gradients 7.5e-2:
//! about twice the worst errors measured on lavapipe (4.5e-3 for the `tiny` case's SSM state,
//! 3.1e-2 for the gradient of `D` in `dtlimit_groups4`, a sum over every position). On Cuda
//! (`--features cuda`, `scripts/cuda-check.sh`) the `f32` cases take the `f16` tolerances too:
//! Burn's matmul may multiply `f32` there on tensor cores as TF32, with f16's 10-bit mantissa.
//!
//! Every backend that is built runs the same cases: burn-ndarray always; with `--features wgpu`
//! also Burn's Wgpu backend (burn-cubecl, the code path of burn-cuda too), both as `Wgpu`
//! (with kernel fusion, what `burn::backend::Wgpu` and `Cuda` are) and as the plain
//! `CubeBackend` without fusion. The Wgpu cases run in both orders, forward and backward
//! through the case list, since fused kernels are cached across cases.
//!
//! `MAMBA2_REFERENCE_DIR=DIR cargo test --release --test suite reference` checks every case folder in
//! DIR instead of `tests/fixtures/reference`.

use std::path::{Path, PathBuf};

use burn::backend::{Autodiff, NdArray};
use burn::tensor::{Int, Tensor};
use mamba2_burn::checkpoint::{pytorch_name, read_config};
use mamba2_burn::generate::DecodeStep;
use mamba2_burn::train::masked_cross_entropy;
use mamba2_burn::SsdAutodiffBackend;
use mamba2_burn::{load_backbone, load_lm, BackboneState, CheckpointFormat, GenerateConfig};

use crate::common::golden::{
    case_dirs, check_each, collect_grads, transpose, Expected, Report, Tolerance, F32_TOL,
};

/// Compares every parameter gradient with `grad.<checkpoint name>`; every expected gradient
/// must be matched by one of ours.
fn compare_grads<B: SsdAutodiffBackend, M: burn::module::Module<B>>(
    report: &mut Report,
    model: &M,
    grads: &B::Gradients,
    expected: &Expected,
    format: CheckpointFormat,
    prefix: &str,
) {
    let mut matched = 0;
    for (path, grad) in collect_grads(model, grads) {
        let (name, transposed) = pytorch_name(&format!("{prefix}{path}"), format);
        let key = format!("grad.{name}");
        match expected.get(&key) {
            Some(e) => {
                let g = if transposed { transpose(grad) } else { grad };
                report.compare(&key, g, e, true);
                matched += 1;
            }
            None => report
                .failures
                .push(format!("no expected gradient {key} for parameter {path}")),
        }
    }
    let n_expected = expected.0.keys().filter(|k| k.starts_with("grad.")).count();
    if matched != n_expected {
        report.failures.push(format!(
            "matched {matched} of {n_expected} expected gradients"
        ));
    }
}

fn check_lm_case<B: SsdAutodiffBackend>(
    dir: &Path,
    expected: &Expected,
    report: &mut Report,
    dev: &B::Device,
) {
    let dev = dev.clone();
    let (config, format) = read_config(dir).expect("config");
    let model = load_lm::<B>(dir, &dev).expect("checkpoint loads");
    let n_layer = config.backbone.n_layer;
    let ids = expected.int::<B, 2>("input_ids", &dev);
    let [b, l] = ids.dims();

    // full forward: logits, per-layer outputs, hidden states, states after the prompt
    let x = model.embedding.forward(ids.clone());
    let (layers, state) = model.backbone.forward_layers(x, None).expect("forward");
    for (i, out) in layers.iter().enumerate() {
        report.compare(
            &format!("layer_out.{i}"),
            out.clone().into_data(),
            expected.get(&format!("layer_out.{i}")).unwrap(),
            false,
        );
    }
    let hidden = model.backbone.norm_f.forward(layers[n_layer - 1].clone());
    report.compare(
        "hidden_states",
        hidden.clone().into_data(),
        expected.get("hidden_states").unwrap(),
        false,
    );
    let logits = model.head(hidden);
    report.compare(
        "logits",
        logits.clone().into_data(),
        expected.get("logits").unwrap(),
        false,
    );
    let (logits_api, state_api) = model.forward(ids.clone(), None).expect("forward");
    report.compare(
        "logits (Mamba2Lm::forward)",
        logits_api.into_data(),
        expected.get("logits").unwrap(),
        false,
    );
    for i in 0..n_layer {
        report.compare(
            &format!("ssm_state.{i}"),
            state.layers[i].ssm.clone().into_data(),
            expected.get(&format!("ssm_state.{i}")).unwrap(),
            false,
        );
        report.compare(
            &format!("conv_state.{i}"),
            state.layers[i].conv.clone().into_data(),
            expected.get(&format!("conv_state.{i}")).unwrap(),
            false,
        );
    }

    // single-token decode from the prompt's state
    if let Some(dec) = expected.get("decode_ids") {
        let dec: Tensor<B, 2, Int> = Tensor::from_data(dec.clone().convert::<i64>(), &dev);
        let want = expected.float::<B, 3>("decode_logits", &dev);
        let mut state: BackboneState<B> = state_api;
        for t in 0..dec.dims()[1] {
            let tok = dec.clone().narrow(1, t, 1).reshape([b]);
            let (step_logits, s) = model.step(tok, state).expect("step");
            state = s;
            let want_t = want
                .clone()
                .narrow(1, t, 1)
                .reshape([b, model.vocab_size()]);
            report.compare(
                &format!("decode_logits[{t}]"),
                step_logits.into_data(),
                &want_t.into_data(),
                false,
            );
        }
    }

    // greedy generation from the prompt: transformers' `generate(do_sample=False)` ids, with
    // the tensor step and with the CPU step. In `f32` and wider: in half precision the logits
    // are 1e-2 off, and a close second choice may come first.
    let exact = report.tol.forward <= F32_TOL.forward;
    if let (Some(want), true) = (expected.get("generate_ids"), exact) {
        let want: Vec<i64> = want.clone().convert::<i64>().to_vec().unwrap();
        let prompts: Vec<Vec<i64>> = ids
            .clone()
            .into_data()
            .convert::<i64>()
            .to_vec::<i64>()
            .unwrap()
            .chunks(l)
            .map(<[i64]>::to_vec)
            .collect();
        let new_tokens = want.len() / b;
        for step in [DecodeStep::Tensor, DecodeStep::Cpu] {
            let config = GenerateConfig::new()
                .with_max_new_tokens(new_tokens)
                .with_step(step);
            let got = model.generate(&prompts, &config).expect("generate");
            report.checked += 1;
            if got.tokens.concat() != want {
                report.failures.push(format!(
                    "generate_ids ({step:?} step): {:?}, expected {want:?}",
                    got.tokens
                ));
            }
        }
    }

    // loss and gradients
    if let Some(loss_expected) = expected.get("loss") {
        // the training loss of the crate (mean next-token cross-entropy, nothing ignored)
        let pred = logits.narrow(1, 0, l - 1);
        let target = ids.narrow(1, 1, l - 1);
        let loss = masked_cross_entropy(pred, target, None);
        report.compare("loss", loss.clone().into_data(), loss_expected, false);
        let grads = loss.backward();
        compare_grads(report, &model, &grads, expected, format, "");
    }
}

fn check_backbone_case<B: SsdAutodiffBackend>(
    dir: &Path,
    expected: &Expected,
    report: &mut Report,
    dev: &B::Device,
) {
    let dev = dev.clone();
    let (config, format) = read_config(dir).expect("config");
    let backbone = load_backbone::<B>(dir, &dev).expect("checkpoint loads");
    let x = expected.float::<B, 3>("inputs_embeds", &dev);
    let (layers, _) = backbone.forward_layers(x.clone(), None).expect("forward");
    for (i, out) in layers.iter().enumerate() {
        report.compare(
            &format!("layer_out.{i}"),
            out.clone().into_data(),
            expected.get(&format!("layer_out.{i}")).unwrap(),
            false,
        );
    }
    let hidden = backbone
        .norm_f
        .forward(layers[config.backbone.n_layer - 1].clone());
    report.compare(
        "hidden_states",
        hidden.clone().into_data(),
        expected.get("hidden_states").unwrap(),
        false,
    );
    let (via_forward, _) = backbone.forward(x, None).expect("forward");
    report.compare(
        "hidden_states (Mamba2Backbone::forward)",
        via_forward.into_data(),
        expected.get("hidden_states").unwrap(),
        false,
    );
    if let Some(loss_expected) = expected.get("loss") {
        let loss = hidden.square().mean();
        report.compare("loss", loss.clone().into_data(), loss_expected, false);
        let grads = loss.backward();
        compare_grads(report, &backbone, &grads, expected, format, "backbone.");
    }
}

/// Checks every case (of `MAMBA2_REFERENCE_DIR`, or the repository's) on backend `B` (in reverse order with `reverse`) within `tol`,
/// printing each case's worst errors under the backend's `name`; the names of the failed cases.
fn check_cases<B: SsdAutodiffBackend>(
    name: &str,
    dev: &B::Device,
    reverse: bool,
    tol: Tolerance,
) -> Vec<String> {
    let root = match std::env::var_os("MAMBA2_REFERENCE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => fixture_root(),
    };
    check_cases_in::<B>(&root, name, dev, reverse, tol)
}

/// The reference cases in the repository.
pub(crate) fn fixture_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/reference")
}

/// Every case in `root` on NdArray in `f32` at the usual tolerance: the names of the failed
/// cases (for folders the tests make from the reference cases).
pub(crate) fn check_cases_on_ndarray(root: &Path, name: &str) -> Vec<String> {
    check_cases_in::<Autodiff<NdArray<f32>>>(root, name, &Default::default(), false, F32_TOL)
}

/// [`check_cases`] on the case folders of `root`.
fn check_cases_in<B: SsdAutodiffBackend>(
    root: &Path,
    name: &str,
    dev: &B::Device,
    reverse: bool,
    tol: Tolerance,
) -> Vec<String> {
    let mut dirs = case_dirs(root);
    assert!(
        !dirs.is_empty(),
        "no reference case folders (config.json + expected.safetensors) in {}",
        root.display()
    );
    if reverse {
        dirs.reverse();
    }
    check_each("reference", name, &dirs, tol, |dir, expected, report| {
        if expected.get("inputs_embeds").is_some() {
            check_backbone_case::<B>(dir, expected, report, dev);
        } else {
            check_lm_case::<B>(dir, expected, report, dev);
        }
    })
}

#[test]
fn reference_cases() {
    let failed =
        check_cases::<Autodiff<NdArray<f32>>>("ndarray", &Default::default(), false, F32_TOL);
    assert!(
        failed.is_empty(),
        "reference cases failed on ndarray: {failed:?}"
    );
}

#[cfg(feature = "wgpu")]
mod wgpu {
    use super::*;
    use burn::backend::wgpu::{CubeBackend, WgpuDevice, WgpuRuntime};
    use burn::backend::Wgpu;
    use burn::tensor::{FloatDType, IntDType};
    use mamba2_burn::ssd::ScanProducts;

    /// In `f16`, whose unit roundoff is 4.9e-4 (6e-8 in `f32`): about twice the worst
    /// errors measured (module docs).
    const HALF_TOL: Tolerance = Tolerance {
        forward: 1e-2,
        grad: 7.5e-2,
    };

    /// Burn's Wgpu backend as users get it: `Fusion<CubeBackend<..>>`.
    type Fused = Autodiff<Wgpu<f32, i32>>;
    /// The same without kernel fusion.
    type Unfused = Autodiff<CubeBackend<WgpuRuntime, f32, i32, u32>>;

    fn both_orders<B: SsdAutodiffBackend<Device = WgpuDevice>>(name: &str) {
        let dev = WgpuDevice::default();
        let mut failed = check_cases::<B>(name, &dev, false, F32_TOL);
        failed.extend(check_cases::<B>(
            &format!("{name}, reversed"),
            &dev,
            true,
            F32_TOL,
        ));
        assert!(
            failed.is_empty(),
            "reference cases failed on {name}: {failed:?}"
        );
    }

    #[test]
    #[ignore = "needs a device driver: run with -- --ignored"]
    fn reference_cases_wgpu_fused() {
        both_orders::<Fused>("wgpu (fused)");
    }

    /// The fused scan with the other variants of its intra-chunk products: through the
    /// matmul on each head's matrices written for the call, and on fragments (on lavapipe's
    /// ordinary cores: it has no tensor cores).
    #[test]
    #[ignore = "needs a device driver: run with -- --ignored"]
    fn reference_cases_wgpu_other_products() {
        for products in [ScanProducts::Transient, ScanProducts::TensorCores] {
            let _products = mamba2_burn::ssd::override_scan_products(products);
            both_orders::<Fused>(&format!("wgpu (fused, {products:?} products)"));
        }
    }

    #[test]
    #[ignore = "needs a device driver: run with -- --ignored"]
    fn reference_cases_wgpu_unfused() {
        both_orders::<Unfused>("wgpu (unfused)");
    }

    /// In `f16`, rounding the weights on loading, on a Wgpu device of its own: a device's
    /// float type is set once per process, before its first tensor, and the other Wgpu tests
    /// use the default device in `f32`. `WgpuDevice::Cpu` is the CPU adapter (lavapipe).
    #[test]
    #[ignore = "needs a device driver: run with -- --ignored"]
    fn reference_cases_wgpu_f16() {
        // the fused scan, whatever the default for `f16` on Wgpu
        let _fused = mamba2_burn::ssd::override_fused_kernels(mamba2_burn::FusedKernels::Always);
        let dev = WgpuDevice::Cpu;
        burn::tensor::set_default_dtypes::<Wgpu<f32, i32>>(&dev, FloatDType::F16, IntDType::I32)
            .expect("f16 as the float type of the CPU adapter, set before any tensor on it");
        // every variant of the intra-chunk products, on the one device of this type
        for products in [
            ScanProducts::Tiled,
            ScanProducts::Transient,
            ScanProducts::TensorCores,
        ] {
            let _products = mamba2_burn::ssd::override_scan_products(products);
            let name = format!("wgpu (fused, {products:?} products), f16");
            let failed = check_cases::<Fused>(&name, &dev, false, HALF_TOL);
            assert!(
                failed.is_empty(),
                "reference cases failed on {name}: {failed:?}"
            );
        }
    }
}

#[cfg(feature = "cuda-tests")]
mod cuda {
    use super::*;
    use burn::backend::cuda::CudaDevice;
    use burn::backend::Cuda;
    use mamba2_burn::ssd::ScanProducts;

    /// In `f32` on Cuda: Burn's matmul may run `f32` products on tensor cores as TF32
    /// (cubek's accelerated kernels, which its autotune picks where they are fastest), whose
    /// operands keep f16's 10-bit mantissa (unit roundoff 4.9e-4), so the tolerance is the
    /// half-precision one (`wgpu::HALF_TOL`), of a model whose every value is `f16`.
    const TF32_TOL: Tolerance = Tolerance {
        forward: 1e-2,
        grad: 7.5e-2,
    };

    /// Burn's Cuda backend with the fused scan; needs a GPU (`scripts/cuda-check.sh`).
    #[test]
    #[ignore = "needs a device driver: run with -- --ignored"]
    fn reference_cases_cuda() {
        // the fused scan (the default on Cuda is the tensor operations until measured there)
        let _fused = mamba2_burn::ssd::override_fused_kernels(mamba2_burn::FusedKernels::Always);
        let dev = CudaDevice::default();
        let mut failed = Vec::new();
        // every variant of the intra-chunk products
        for products in [
            ScanProducts::Tiled,
            ScanProducts::Transient,
            ScanProducts::TensorCores,
        ] {
            let _products = mamba2_burn::ssd::override_scan_products(products);
            let name = format!("cuda (fused, {products:?} products)");
            failed.extend(check_cases::<Autodiff<Cuda<f32, i32>>>(
                &name, &dev, false, TF32_TOL,
            ));
            failed.extend(check_cases::<Autodiff<Cuda<f32, i32>>>(
                &format!("{name}, reversed"),
                &dev,
                true,
                TF32_TOL,
            ));
        }
        assert!(
            failed.is_empty(),
            "reference cases failed on cuda: {failed:?}"
        );
    }
}
