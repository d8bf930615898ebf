//! Golden tests of the hybrid language models against transformers 5.25 (float64 arithmetic on
//! float32 weights; `scripts/make_hybrid_reference.py`): logits, every layer's output, the
//! hidden states, each layer's cache after the prompt (SSM and conv states, keys and values),
//! the logits of single-token decode steps through the cache, transformers' greedy tokens, the
//! loss and the gradient of every weight under its checkpoint name.
//!
//! Tolerances are the Mamba-2 cases' (`reference.rs`): max abs error relative to the largest
//! magnitude of the expected tensor, 1e-4 for forward values and states, 1e-3 for gradients.
//!
//! `MAMBA2_HYBRID_REFERENCE_DIR=DIR cargo test --release --test suite hybrid` checks every case
//! folder in DIR instead of `tests/fixtures/hybrid`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use burn::backend::{Autodiff, NdArray};
use burn::tensor::TensorData;
use mamba2_burn::checkpoint::{hybrid_tensor_name, load_hybrid, read_hybrid_config};
use mamba2_burn::hybrid::{HybridCache, HybridLm};
use mamba2_burn::train::masked_cross_entropy;
use mamba2_burn::SsdAutodiffBackend;

use crate::common::golden::{
    case_dirs, collect_grads, transpose, values, Expected, Report, Tolerance, F32_TOL,
};

/// The hybrid cases of `MAMBA2_HYBRID_REFERENCE_DIR`, or the repository's.
fn root() -> PathBuf {
    match std::env::var_os("MAMBA2_HYBRID_REFERENCE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hybrid"),
    }
}

/// Compares each layer's cache with the expected states of its kind.
fn compare_cache<B: SsdAutodiffBackend>(
    report: &mut Report,
    cache: &HybridCache<B>,
    expected: &Expected,
) {
    for (i, layer) in cache.layers.iter().enumerate() {
        let mut pairs = Vec::new();
        if let Some(s) = &layer.mamba {
            pairs.push((format!("ssm_state.{i}"), s.ssm.clone().into_data()));
            pairs.push((format!("conv_state.{i}"), s.conv.clone().into_data()));
        }
        if let Some(kv) = &layer.kv {
            pairs.push((format!("key.{i}"), kv.key.clone().into_data()));
            pairs.push((format!("value.{i}"), kv.value.clone().into_data()));
        }
        for (name, actual) in pairs {
            match expected.get(&name) {
                Some(e) => report.compare(&name, actual, e, false),
                None => report.failures.push(format!("no expected {name}")),
            }
        }
    }
}

/// Our gradients under the checkpoint's names: transposed where the file holds the transpose,
/// the blocks of a fused tensor stacked back in order.
fn grads_by_name(
    family: mamba2_burn::hybrid::HybridFamily,
    grads: BTreeMap<String, TensorData>,
) -> BTreeMap<String, TensorData> {
    let mut blocks: BTreeMap<String, Vec<(usize, TensorData)>> = BTreeMap::new();
    for (path, grad) in grads {
        let (name, transposed, part) = hybrid_tensor_name(family, &path);
        let grad = if transposed { transpose(grad) } else { grad };
        let index = part.map_or(0, |(index, _)| index);
        blocks.entry(name).or_default().push((index, grad));
    }
    blocks
        .into_iter()
        .map(|(name, mut parts)| {
            parts.sort_by_key(|(i, _)| *i);
            if parts.len() == 1 {
                return (name, parts.pop().unwrap().1);
            }
            let mut shape = Vec::new();
            let mut all = Vec::new();
            for (_, data) in parts {
                let (s, v) = values(data);
                if shape.is_empty() {
                    shape = s;
                } else {
                    shape[0] += s[0];
                }
                all.extend(v);
            }
            (name, TensorData::new(all, shape))
        })
        .collect()
}

fn check_case<B: SsdAutodiffBackend>(
    dir: &Path,
    expected: &Expected,
    report: &mut Report,
    dev: &B::Device,
) {
    let config = read_hybrid_config(dir).expect("config");
    let model: HybridLm<B> = load_hybrid(dir, dev).expect("checkpoint loads");
    let ids = expected.int::<B, 2>("input_ids", dev);
    let [b, l] = ids.dims();
    let vocab = model.vocab_size();

    // the whole prompt: each layer's output, the hidden states, the logits, the caches
    let (layers, _) = model.forward_layers(ids.clone(), None).expect("forward");
    for (i, out) in layers.into_iter().enumerate() {
        let name = format!("layer_out.{i}");
        report.compare(&name, out.into_data(), expected.get(&name).unwrap(), false);
    }
    let hidden = model.hidden_states(ids.clone()).expect("forward");
    report.compare(
        "hidden_states",
        hidden.into_data(),
        expected.get("hidden_states").unwrap(),
        false,
    );
    let (logits, cache) = model.forward(ids.clone(), None).expect("forward");
    report.compare(
        "logits",
        logits.clone().into_data(),
        expected.get("logits").unwrap(),
        false,
    );
    compare_cache(report, &cache, expected);

    // single tokens through the cache
    let dec = expected.int::<B, 2>("decode_ids", dev);
    let want = expected.float::<B, 3>("decode_logits", dev);
    let mut state = cache;
    for t in 0..dec.dims()[1] {
        let token = dec.clone().narrow(1, t, 1).reshape([b]);
        let (step_logits, s) = model.step(token, state).expect("step");
        state = s;
        let want_t = want.clone().narrow(1, t, 1).reshape([b, vocab]);
        report.compare(
            &format!("decode_logits[{t}]"),
            step_logits.into_data(),
            &want_t.into_data(),
            false,
        );
    }

    // transformers' greedy tokens: prefill, then the most likely token at each step
    if report.tol.forward <= F32_TOL.forward {
        let want: Vec<i64> = expected
            .get("greedy")
            .unwrap()
            .clone()
            .convert::<i64>()
            .to_vec()
            .unwrap();
        let new = want.len() / b;
        let (logits, mut cache) = model.forward(ids.clone(), None).expect("prefill");
        let mut next = logits
            .narrow(1, l - 1, 1)
            .reshape([b, vocab])
            .argmax(1)
            .reshape([b]);
        let mut got = vec![Vec::new(); b];
        for t in 0..new {
            let tokens: Vec<i64> = next.clone().into_data().convert::<i64>().to_vec().unwrap();
            for (row, token) in got.iter_mut().zip(tokens) {
                row.push(token);
            }
            if t + 1 < new {
                let (logits, c) = model.step(next, cache).expect("step");
                cache = c;
                next = logits.argmax(1).reshape([b]);
            } else {
                break;
            }
        }
        report.checked += 1;
        if got.concat() != want {
            report
                .failures
                .push(format!("greedy: {got:?}, expected {want:?}"));
        }
    }

    // the loss and every gradient, under the checkpoint's names
    let loss = masked_cross_entropy(logits.narrow(1, 0, l - 1), ids.narrow(1, 1, l - 1), None);
    report.compare(
        "loss",
        loss.clone().into_data(),
        expected.get("loss").unwrap(),
        false,
    );
    let grads = loss.backward();
    let ours = grads_by_name(config.family, collect_grads(&model, &grads));
    let n_expected = expected.0.keys().filter(|k| k.starts_with("grad.")).count();
    let mut matched = 0;
    for (name, grad) in ours {
        let key = format!("grad.{name}");
        match expected.get(&key) {
            Some(e) => {
                report.compare(&key, grad, e, true);
                matched += 1;
            }
            None => report.failures.push(format!("no expected gradient {key}")),
        }
    }
    if matched != n_expected {
        report.failures.push(format!(
            "matched {matched} of {n_expected} expected gradients"
        ));
    }
}

/// Checks every case on backend `B` within `tol`, printing each case's worst errors under
/// `name`; the names of the failed cases.
fn check_cases<B: SsdAutodiffBackend>(name: &str, dev: &B::Device, tol: Tolerance) -> Vec<String> {
    let root = root();
    let dirs = case_dirs(&root);
    assert!(
        !dirs.is_empty(),
        "no hybrid case folders in {}",
        root.display()
    );
    let mut failed = Vec::new();
    let mut stderr = std::io::stderr();
    for dir in &dirs {
        let case = dir.file_name().unwrap().to_string_lossy().to_string();
        let expected = Expected::read(&dir.join("expected.safetensors"));
        let mut report = Report::new(tol);
        check_case::<B>(dir, &expected, &mut report, dev);
        writeln!(
            stderr,
            "hybrid case {case} on {name}: {} tensors; worst forward {:.2e} ({}), worst gradient {:.2e} ({})",
            report.checked, report.worst_forward.0, report.worst_forward.1, report.worst_grad.0, report.worst_grad.1
        )
        .unwrap();
        for f in &report.failures {
            writeln!(stderr, "  FAIL {case} on {name}: {f}").unwrap();
        }
        if !report.failures.is_empty() {
            failed.push(case);
        }
    }
    failed
}

#[test]
fn hybrid_cases() {
    let failed = check_cases::<Autodiff<NdArray<f32>>>("ndarray", &Default::default(), F32_TOL);
    assert!(
        failed.is_empty(),
        "hybrid cases failed on ndarray: {failed:?}"
    );
}

/// A copy of the `granite_dense` fixture in a new folder, its config edited by `edit` and its
/// tensors by `tensors`.
fn edited_case(
    edit: impl FnOnce(&mut serde_json::Value),
    tensors: impl FnOnce(&mut Vec<crate::common::safetensors::Entry>),
) -> tempfile::TempDir {
    use crate::common::safetensors::{read_entries, write_entries};
    let src = root_fixture("granite_dense");
    let dir = tempfile::tempdir().unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let mut entries = read_entries(&src.join("model.safetensors"));
    tensors(&mut entries);
    write_entries(&dir.path().join("model.safetensors"), &entries);
    dir
}

fn load_err(dir: &Path) -> mamba2_burn::Mamba2Error {
    load_hybrid::<NdArray<f32>>(dir, &Default::default()).unwrap_err()
}

#[test]
fn hybrid_folders_with_errors_name_the_fault() {
    use mamba2_burn::Mamba2Error;
    let same = |_: &mut Vec<_>| {};
    // a family not implemented yet, and a model that is not a hybrid at all
    let dir = edited_case(|c| c["model_type"] = "bamba".into(), same);
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::Unsupported { reason, .. } if reason.contains("bamba")),
        "{e}"
    );
    // Granite's mixture of experts (to come)
    let dir = edited_case(|c| c["num_local_experts"] = 8.into(), same);
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::Unsupported { reason, .. } if reason.contains("num_local_experts")),
        "{e}"
    );
    // a pattern of the wrong length, a layer kind the family does not have
    let dir = edited_case(
        |c| c["layer_types"] = serde_json::json!(["mamba", "attention"]),
        same,
    );
    let e = load_err(dir.path());
    assert!(
        matches!(
            &e,
            Mamba2Error::ConfigFile {
                field: "layer_types",
                ..
            }
        ),
        "{e}"
    );
    let dir = edited_case(|c| c["layer_types"][1] = "mlp".into(), same);
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::Unsupported { reason, .. } if reason.contains("\"mlp\"")),
        "{e}"
    );
    // GQA that does not divide, RoPE scaling
    let dir = edited_case(|c| c["num_key_value_heads"] = 3.into(), same);
    let e = load_err(dir.path());
    assert!(
        matches!(
            &e,
            Mamba2Error::ConfigFile {
                field: "num_key_value_heads",
                ..
            }
        ),
        "{e}"
    );
    let dir = edited_case(|c| c["rope_parameters"]["rope_type"] = "yarn".into(), same);
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::Unsupported { reason, .. } if reason.contains("yarn")),
        "{e}"
    );
    // a missing tensor, one of the wrong shape, one the model does not have
    let dir = edited_case(
        |_| {},
        |t| t.retain(|e| e.name != "model.layers.1.self_attn.k_proj.weight"),
    );
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::MissingTensor { name, .. } if name == "model.layers.1.self_attn.k_proj.weight"),
        "{e}"
    );
    let dir = edited_case(
        |_| {},
        |t| {
            let fused = t
                .iter_mut()
                .find(|e| e.name == "model.layers.0.shared_mlp.input_linear.weight")
                .unwrap();
            fused.shape[0] -= 1;
            fused
                .bytes
                .truncate(fused.shape.iter().product::<usize>() * 4);
        },
    );
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::TensorShape { name, .. } if name == "model.layers.0.shared_mlp.input_linear.weight"),
        "{e}"
    );
    let dir = edited_case(
        |_| {},
        |t| {
            let extra = crate::common::safetensors::f32_entry(
                "model.layers.0.mamba.extra",
                vec![2],
                &[0.0, 1.0],
            );
            t.push(extra);
        },
    );
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::UnexpectedTensor { name, .. } if name == "model.layers.0.mamba.extra"),
        "{e}"
    );
    // the Mamba-2 loader refuses a hybrid folder, and says which loader reads it
    let e =
        mamba2_burn::load_lm::<NdArray<f32>>(root_fixture("granite_dense"), &Default::default())
            .unwrap_err();
    assert!(
        matches!(&e, Mamba2Error::Unsupported { reason, .. } if reason.contains("load_hybrid")),
        "{e}"
    );
}

fn root_fixture(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hybrid")
        .join(case)
}

#[cfg(feature = "wgpu")]
mod wgpu {
    use super::*;
    use burn::backend::wgpu::WgpuDevice;
    use burn::backend::Wgpu;

    /// On Burn's Wgpu backend as users get it (with kernel fusion): the Mamba layers run the
    /// fused SSD, as the Mamba-2 model does there.
    #[test]
    #[ignore = "needs a device driver: run with -- --ignored"]
    fn hybrid_cases_wgpu() {
        let failed = check_cases::<Autodiff<Wgpu<f32, i32>>>(
            "wgpu (fused)",
            &WgpuDevice::default(),
            F32_TOL,
        );
        assert!(failed.is_empty(), "hybrid cases failed on wgpu: {failed:?}");
    }
}
