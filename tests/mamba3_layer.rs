//! Mamba-3's layer cases (tests/fixtures/mamba3, `MAMBA3_REFERENCE_DIR` replaces them; see
//! `mamba3`): SISO and MIMO layers loaded from `mamba_ssm`'s state dict into [`Mamba3`], their
//! forward (output, the state after the prompt, the gradient of the input and of every
//! parameter), the decode tokens continued from that state by the forward and by the step,
//! and the prompt run through the step from a fresh state, each at the case's chunk length, at
//! 5 and at the whole length, within the Mamba-2 cases' `f32` tolerances; a layer written back
//! in `mamba_ssm`'s form; the errors that name each bad setting or shape. Every case again on
//! Wgpu (ignored: it needs a device driver; CI runs it over lavapipe).

use std::path::Path;

use burn::tensor::Tensor;
use mamba2_burn::checkpoint::{load_mamba3, mamba3_config_from_json, mamba3_name, save_mamba3};
use mamba2_burn::ssd::{SsdAutodiffBackend, TrapezoidalState};
use mamba2_burn::{Mamba3, Mamba3Config};

use crate::common::golden::{collect_grads, transpose, Expected, Report};
use crate::mamba3::{case_json, cases, check_cases, compare_angles, leaf, B};

/// A layer case's layer, loaded from its `model.safetensors` (`mamba_ssm`'s state dict) with
/// the scan at chunk length `chunk`.
fn layer_of<A: SsdAutodiffBackend>(dir: &Path, chunk: usize, dev: &A::Device) -> Mamba3<A> {
    let json = std::fs::read_to_string(dir.join("config.json")).expect("config.json");
    let config = mamba3_config_from_json(&json, &dir.join("config.json"))
        .expect("the case's config")
        .with_chunk_size(chunk);
    load_mamba3::<A>(&config, &dir.join("model.safetensors"), "", dev).expect("the case's weights")
}

/// The layer's state against the case's `{prefix}.angle`, `.ssm`, `.k` and `.v`.
fn compare_state<A: SsdAutodiffBackend>(
    report: &mut Report,
    what: &str,
    state: &TrapezoidalState<A>,
    e: &Expected,
    prefix: &str,
) {
    let expect = |name: &str| {
        let key = format!("{prefix}.{name}");
        e.get(&key).unwrap_or_else(|| panic!("{key}")).clone()
    };
    compare_angles(
        report,
        &format!("{what}: {prefix}.angle"),
        state.angle.clone().into_data(),
        &expect("angle"),
    );
    for (name, t) in [
        ("ssm", state.ssm.clone().into_data()),
        ("k", state.k.clone().into_data()),
        ("v", state.v.clone().into_data()),
    ] {
        report.compare(&format!("{what}: {prefix}.{name}"), t, &expect(name), false);
    }
}

/// `mamba_ssm`'s name of a layer parameter's gradient, and whether ours is its transpose.
fn grad_name(path: &str) -> (String, bool) {
    let (name, transpose) = mamba3_name(path);
    (format!("grad.{name}"), transpose)
}

/// One layer case at chunk length `chunk`: the forward over the prompt (output, state,
/// the gradient of the input and of every parameter); the decode tokens continued from the
/// prompt's state by the forward and by the step; the prompt through the step from a fresh
/// state.
pub(crate) fn check_layer<A: SsdAutodiffBackend>(
    dir: &Path,
    chunk: usize,
    report: &mut Report,
    dev: &A::Device,
) {
    let e = Expected::read(&dir.join("expected.safetensors"));
    let layer = layer_of::<A>(dir, chunk, dev);
    let at = |what: &str| format!("chunk {chunk}: {what}");
    let expect = |name: &str| e.get(name).unwrap_or_else(|| panic!("{name}"));

    let x = leaf::<A, 3>(&e, "x", dev);
    let (y, state) = layer.forward(x.clone(), None).unwrap();
    report.compare(&at("y"), y.clone().into_data(), expect("y"), false);
    compare_state(report, &at("forward"), &state, &e, "state");
    let w = e.float::<A, 3>("w", dev);
    let loss = (y.clone() * w).sum();
    report.compare(&at("loss"), loss.clone().into_data(), expect("loss"), false);
    let grads = loss.backward();
    report.compare(
        &at("grad.x"),
        x.grad(&grads).unwrap().into_data(),
        expect("grad.x"),
        true,
    );
    let ours = collect_grads(&layer, &grads);
    let n_expected = e.0.keys().filter(|k| k.starts_with("grad.")).count() - 1;
    assert_eq!(ours.len(), n_expected, "a gradient for every parameter");
    for (path, grad) in ours {
        let (name, transposed) = grad_name(&path);
        let grad = if transposed { transpose(grad) } else { grad };
        report.compare(&at(&name), grad, expect(&name), true);
    }

    // decoding from the prompt's state: the forward over the decode tokens, and the step
    let state = TrapezoidalState {
        angle: state.angle.detach(),
        ssm: state.ssm.detach(),
        k: state.k.detach(),
        v: state.v.detach(),
    };
    let xd = e.float::<A, 3>("decode_x", dev);
    let (yd, after) = layer.forward(xd.clone(), Some(state.clone())).unwrap();
    report.compare(
        &at("forward: decode_y"),
        yd.into_data(),
        expect("decode_y"),
        false,
    );
    compare_state(report, &at("forward"), &after, &e, "decode_state");
    let [b, t, d] = xd.dims();
    let mut current = state;
    let mut ys = Vec::new();
    for i in 0..t {
        let token = xd.clone().narrow(1, i, 1).reshape([b, d]);
        let (out, next) = layer.step(token, current).unwrap();
        ys.push(out.unsqueeze_dim::<3>(1));
        current = next;
    }
    let yd = Tensor::cat(ys, 1);
    report.compare(
        &at("step: decode_y"),
        yd.into_data(),
        expect("decode_y"),
        false,
    );
    compare_state(report, &at("step"), &current, &e, "decode_state");

    // the prompt through the step, from a fresh state
    let [b, l, d] = x.dims();
    let mut current = layer.zero_state(b, dev);
    let mut ys = Vec::new();
    for i in 0..l {
        let token = x.clone().detach().narrow(1, i, 1).reshape([b, d]);
        let (out, next) = layer.step(token, current).unwrap();
        ys.push(out.unsqueeze_dim::<3>(1));
        current = next;
    }
    report.compare(
        &at("step from zero: y"),
        Tensor::cat(ys, 1).into_data(),
        expect("y"),
        false,
    );
    compare_state(report, &at("step from zero"), &current, &e, "state");
}

/// A layer case's chunk length (`config.json`).
fn layer_chunk(dir: &Path) -> usize {
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let config: serde_json::Value = serde_json::from_str(&text).unwrap();
    config["chunk_size"].as_u64().unwrap() as usize
}

/// The chunk lengths a layer case runs at: its own, 5 and its prompt's length (`case.json`).
fn layer_lengths(dir: &Path) -> Vec<usize> {
    let length = case_json(dir)["seqlen"].as_u64().unwrap() as usize;
    vec![layer_chunk(dir), 5, length]
}

/// Every layer case, SISO and MIMO (`mamba_ssm`'s `Mamba3` with its state dict): at its chunk
/// length, at 5 and at its whole length.
#[test]
fn layer_cases() {
    let dirs = [cases("layer", "siso"), cases("layer", "mimo")].concat();
    check_cases(dirs, layer_lengths, |dir, chunk, report| {
        check_layer::<B>(dir, chunk, report, &Default::default())
    });
}

/// A layer written back (`save_mamba3`) is the case's folder again: the state dict name for
/// name and bit for bit, and the constructor arguments that load back to the same config.
#[test]
fn a_saved_layer_is_the_state_dict_it_was_loaded_from() {
    for dir in [cases("layer", "siso"), cases("layer", "mimo")].concat() {
        let json = std::fs::read_to_string(dir.join("config.json")).unwrap();
        let config = mamba3_config_from_json(&json, &dir.join("config.json")).unwrap();
        let layer = load_mamba3::<B>(
            &config,
            &dir.join("model.safetensors"),
            "",
            &Default::default(),
        )
        .unwrap();
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let out = std::env::temp_dir().join(format!("mamba3-save-{}-{name}", std::process::id()));
        let file = save_mamba3(&layer, &config, &out).unwrap();
        let (ours, theirs) = (
            Expected::read(&file),
            Expected::read(&dir.join("model.safetensors")),
        );
        assert_eq!(
            ours.0.keys().collect::<Vec<_>>(),
            theirs.0.keys().collect::<Vec<_>>(),
            "{name}: the state dict's names"
        );
        for (key, data) in &theirs.0 {
            assert_eq!(&ours.0[key], data, "{name}: {key}");
        }
        let text = std::fs::read_to_string(out.join("config.json")).unwrap();
        let again = mamba3_config_from_json(&text, &out.join("config.json")).unwrap();
        assert_eq!(
            format!("{again:?}"),
            format!("{config:?}"),
            "{name}: config"
        );
        std::fs::remove_dir_all(&out).unwrap();
    }
}

/// Each bad setting or shape is an error naming it.
#[test]
fn bad_layer_settings_and_shapes_are_named() {
    let device = Default::default();
    let message = |e: mamba2_burn::Mamba2Error| e.to_string();
    let base = || Mamba3Config::new(16).with_d_state(8).with_headdim(8);
    for (config, field) in [
        (base().with_rope_fraction(0.7), "rope_fraction"),
        (base().with_headdim(12), "headdim"),
        (base().with_ngroups(3), "ngroups"),
        (base().with_chunk_size(0), "chunk_size"),
        (base().with_a_floor(-1.0), "a_floor"),
    ] {
        let e = message(config.init::<B>(&device).unwrap_err());
        assert!(e.contains(field), "{field}: {e}");
    }
    for (config, field) in [
        (base().with_is_mimo(true).with_mimo_rank(0), "mimo_rank"),
        (base().with_is_mimo(true).with_d_state(7), "d_state"),
    ] {
        let e = message(config.init::<B>(&device).unwrap_err());
        assert!(e.contains(field), "{field}: {e}");
    }
    let unknown = r#"{"d_model": 16, "d_conv": 4}"#;
    let e = message(mamba3_config_from_json(unknown, Path::new("config.json")).unwrap_err());
    assert!(e.contains("d_conv"), "{e}");

    let layer = base().init::<B>(&device).unwrap();
    let e = message(
        layer
            .forward(Tensor::zeros([2, 5, 15], &device), None)
            .unwrap_err(),
    );
    assert!(e.contains("x"), "{e}");
    let e = message(
        layer
            .forward(Tensor::zeros([2, 0, 16], &device), None)
            .unwrap_err(),
    );
    assert!(e.contains("x"), "{e}");
    let mut state = layer.zero_state(2, &device);
    state.k = Tensor::zeros([2, 1, 4, 9], &device);
    let e = message(
        layer
            .step(Tensor::zeros([2, 16], &device), state)
            .unwrap_err(),
    );
    assert!(e.contains("state.k"), "{e}");
    let state = layer.zero_state(3, &device);
    let e = message(
        layer
            .forward(Tensor::zeros([2, 5, 16], &device), Some(state))
            .unwrap_err(),
    );
    assert!(e.contains("state.angle"), "{e}");
}

/// Every Mamba-3 layer case at its chunk length (forward, every gradient, decode by the forward
/// and by the step, the step from a fresh state) on Burn's Wgpu backend with kernel fusion, as
/// `burn::backend::Wgpu` and `Cuda` are: Burn's GPU code path (burn-cubecl, shared with
/// burn-cuda) over lavapipe in CI. The op-level cases and the other chunk lengths run the same
/// tensor operations on other shapes: NdArray checks them (each new shape is kernels lavapipe
/// compiles: all of them took over 12 minutes there).
#[cfg(feature = "wgpu")]
#[test]
#[ignore = "needs a device driver: run with -- --ignored"]
fn mamba3_cases_wgpu() {
    type A = burn::backend::Autodiff<burn::backend::Wgpu<f32, i32>>;
    let dev = burn::backend::wgpu::WgpuDevice::default();
    let dirs = [cases("layer", "siso"), cases("layer", "mimo")].concat();
    let own_chunk = |dir: &Path| vec![layer_chunk(dir)];
    check_cases(dirs, own_chunk, |dir, chunk, report| {
        check_layer::<A>(dir, chunk, report, &dev)
    });
}
