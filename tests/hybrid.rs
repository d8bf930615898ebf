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
use std::path::{Path, PathBuf};

use burn::backend::{Autodiff, NdArray};
use burn::tensor::TensorData;
use mamba2_burn::checkpoint::{hybrid_tensor_name, load_hybrid, read_hybrid_config};
use mamba2_burn::hybrid::{HybridCache, HybridLm};
use mamba2_burn::train::masked_cross_entropy;
use mamba2_burn::GenerateConfig;
use mamba2_burn::SsdAutodiffBackend;

use crate::common::golden::{
    case_dirs, check_each, collect_grads, transpose, values, Expected, Report, Tolerance, F32_TOL,
};

/// The hybrid cases of `MAMBA2_HYBRID_REFERENCE_DIR`, or the repository's.
pub(crate) fn root() -> PathBuf {
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
/// the blocks of a fused tensor stacked back in order, a stack of tensors split into them.
fn grads_by_name(
    config: &mamba2_burn::hybrid::HybridConfig,
    grads: BTreeMap<String, TensorData>,
) -> BTreeMap<String, TensorData> {
    let mut blocks: BTreeMap<String, Vec<(usize, TensorData)>> = BTreeMap::new();
    for (path, grad) in grads {
        let source = hybrid_tensor_name(config, &path);
        if source.names.len() > 1 {
            let (shape, v) = values(grad);
            let item = v.len() / shape[0];
            for (e, name) in source.names.into_iter().enumerate() {
                let part = v[e * item..(e + 1) * item].to_vec();
                blocks
                    .entry(name)
                    .or_default()
                    .push((0, TensorData::new(part, shape[1..].to_vec())));
            }
            continue;
        }
        let grad = if source.transposed {
            transpose(grad)
        } else {
            grad
        };
        let index = source.part.map_or(0, |(index, _)| index);
        let name = source.names.into_iter().next().unwrap();
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

    // transformers' greedy tokens, from the library's `generate`
    if report.tol.forward <= F32_TOL.forward {
        let want: Vec<i64> = expected
            .get("greedy")
            .unwrap()
            .clone()
            .convert::<i64>()
            .to_vec()
            .unwrap();
        let new = want.len() / b;
        let prompts: Vec<Vec<i64>> = ids
            .clone()
            .into_data()
            .convert::<i64>()
            .to_vec::<i64>()
            .unwrap()
            .chunks(l)
            .map(<[i64]>::to_vec)
            .collect();
        let got = model
            .generate(&prompts, &GenerateConfig::new().with_max_new_tokens(new))
            .expect("generate")
            .tokens;
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
    let ours = grads_by_name(&config, collect_grads(&model, &grads));
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
    check_cases_where::<B>(name, dev, tol, |_| true)
}

/// [`check_cases`] for the cases whose index among the folder's (in name order) `take`s.
fn check_cases_where<B: SsdAutodiffBackend>(
    name: &str,
    dev: &B::Device,
    tol: Tolerance,
    take: impl Fn(usize) -> bool,
) -> Vec<String> {
    let root = root();
    let dirs = case_dirs(&root);
    assert!(
        !dirs.is_empty(),
        "no hybrid case folders in {}",
        root.display()
    );
    let dirs: Vec<PathBuf> = dirs
        .into_iter()
        .enumerate()
        .filter(|(i, _)| take(*i))
        .map(|(_, dir)| dir)
        .collect();
    check_each("hybrid", name, &dirs, tol, |dir, expected, report| {
        check_case::<B>(dir, expected, report, dev)
    })
}

#[test]
fn hybrid_cases() {
    let failed = check_cases::<Autodiff<NdArray<f32>>>("ndarray", &Default::default(), F32_TOL);
    assert!(
        failed.is_empty(),
        "hybrid cases failed on ndarray: {failed:?}"
    );
}

/// `generate` batches prompts of different lengths (each length its own batch, with its own
/// KV cache) and gives each the tokens it gets alone; stop tokens end a prompt, and the host
/// step, which hybrids do not have, is refused.
#[test]
fn generate_takes_prompts_of_any_lengths() {
    use mamba2_burn::generate::{DecodeStep, Finish};
    let dev = Default::default();
    let model: HybridLm<NdArray<f32>> =
        load_hybrid(crate::hybrid_files::root_fixture("granite_dense"), &dev).unwrap();
    let prompts = vec![
        vec![5, 17, 3, 9, 44],
        vec![8, 1],
        vec![60, 2, 2, 31, 7],
        vec![12],
    ];
    let config = GenerateConfig::new().with_max_new_tokens(6);
    let together = model.generate(&prompts, &config).unwrap();
    for (prompt, tokens) in prompts.iter().zip(&together.tokens) {
        let alone = model
            .generate(std::slice::from_ref(prompt), &config)
            .unwrap();
        assert_eq!(&alone.tokens[0], tokens, "prompt {prompt:?}");
    }
    let stop = together.tokens[1][2];
    let stopped = model
        .generate(&prompts, &config.clone().with_stop_tokens(vec![stop]))
        .unwrap();
    let first = together.tokens[1].iter().position(|&t| t == stop).unwrap();
    assert_eq!(stopped.tokens[1], together.tokens[1][..=first]);
    assert_eq!(stopped.finish[1], Finish::Stop);
    let e = model
        .generate(&prompts, &config.with_step(DecodeStep::Cpu))
        .unwrap_err();
    assert!(
        matches!(
            &e,
            mamba2_burn::Mamba2Error::InvalidInput { name: "step", .. }
        ),
        "{e}"
    );
}

#[cfg(feature = "wgpu")]
mod wgpu {
    use super::*;
    use burn::backend::wgpu::WgpuDevice;
    use burn::backend::Wgpu;

    /// On Burn's Wgpu backend as users get it (with kernel fusion): the Mamba layers run the
    /// fused SSD, as the Mamba-2 model does there. The cases in two halves (the even and the
    /// odd ones in name order), so that CI's two Wgpu processes share them: nearly all of
    /// their time is lavapipe compiling kernels, one at a time in a process.
    fn wgpu_cases(half: usize) {
        let failed = check_cases_where::<Autodiff<Wgpu<f32, i32>>>(
            "wgpu (fused)",
            &WgpuDevice::default(),
            F32_TOL,
            |i| i % 2 == half,
        );
        assert!(failed.is_empty(), "hybrid cases failed on wgpu: {failed:?}");
    }

    #[test]
    #[ignore = "needs a device driver: run with -- --ignored"]
    fn hybrid_cases_wgpu_even() {
        wgpu_cases(0);
    }

    #[test]
    #[ignore = "needs a device driver: run with -- --ignored"]
    fn hybrid_cases_wgpu_odd() {
        wgpu_cases(1);
    }
}
