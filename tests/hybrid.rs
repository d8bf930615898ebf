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

/// A copy of the `granite_dense` fixture in a new folder, its config edited by `edit` and its
/// tensors by `tensors`.
fn edited_case(
    edit: impl FnOnce(&mut serde_json::Value),
    tensors: impl FnOnce(&mut Vec<crate::common::safetensors::Entry>),
) -> tempfile::TempDir {
    edited_fixture("granite_dense", edit, tensors)
}

/// A copy of fixture `case` in a new folder, its config edited by `edit` and its tensors by
/// `tensors`.
fn edited_fixture(
    case: &str,
    edit: impl FnOnce(&mut serde_json::Value),
    tensors: impl FnOnce(&mut Vec<crate::common::safetensors::Entry>),
) -> tempfile::TempDir {
    use crate::common::safetensors::{read_entries, write_entries};
    let src = root_fixture(case);
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
    // a hybrid family the crate does not have
    let dir = edited_case(|c| c["model_type"] = "jamba".into(), same);
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::Unsupported { reason, .. } if reason.contains("jamba")),
        "{e}"
    );
    // Granite's experts: more a token than there are, one expert tensor missing, one of
    // Nemotron-H's experts of the wrong shape
    let dir = edited_fixture(
        "granite_moe_nope_tied",
        |c| c["num_experts_per_tok"] = 5.into(),
        same,
    );
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::ConfigFile { field, .. } if *field == "num_experts_per_tok"),
        "{e}"
    );
    let missing = "model.layers.2.block_sparse_moe.output_linear.weight";
    let dir = edited_fixture(
        "granite_moe_nope_tied",
        |_| {},
        |t| t.retain(|e| e.name != missing),
    );
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::MissingTensor { name, .. } if name == missing),
        "{e}"
    );
    let expert = "backbone.layers.4.mixer.experts.5.up_proj.weight";
    let dir = edited_fixture(
        "nemotron_h_moe",
        |_| {},
        |t| {
            let e = t.iter_mut().find(|e| e.name == expert).unwrap();
            e.shape = vec![e.shape[1], e.shape[0]];
        },
    );
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::TensorShape { name, .. } if name == expert),
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

/// The parameter count of each fixture's config is the number of values in its files.
#[test]
fn param_count_is_what_the_files_hold() {
    use crate::common::safetensors::read_entries;
    for dir in case_dirs(&root()) {
        let config = read_hybrid_config(&dir).unwrap();
        let in_files: usize = read_entries(&dir.join("model.safetensors"))
            .iter()
            .map(|e| e.shape.iter().product::<usize>())
            .sum();
        assert_eq!(config.num_params(), in_files, "{}", dir.display());
    }
}

/// The presets of published models have their published parameter counts.
#[test]
fn presets_have_the_published_parameter_counts() {
    use mamba2_burn::checkpoint::{hybrid_preset, HYBRID_PRESETS};
    for (name, _, published) in HYBRID_PRESETS {
        let config = hybrid_preset(name).unwrap();
        assert_eq!(config.num_params() as u64, published, "{name}");
    }
    assert!(hybrid_preset("granite-4.0-h-2t").is_err());
}

/// `generate` batches prompts of different lengths (each length its own batch, with its own
/// KV cache) and gives each the tokens it gets alone; stop tokens end a prompt, and the host
/// step, which hybrids do not have, is refused.
#[test]
fn generate_takes_prompts_of_any_lengths() {
    use mamba2_burn::generate::{DecodeStep, Finish};
    let dev = Default::default();
    let model: HybridLm<NdArray<f32>> = load_hybrid(root_fixture("granite_dense"), &dev).unwrap();
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

/// Bamba's, Nemotron-H's and Falcon-H1's own ways of writing a config: the older names and
/// pattern read as the new ones, each family's defaults; what the families do not have, or the
/// crate not yet, is refused by name.
#[test]
fn family_configs() {
    use mamba2_burn::Mamba2Error;
    let same = |_: &mut Vec<_>| {};
    let config = |dir: &Path| format!("{:?}", read_hybrid_config(dir).expect("config"));
    // Nemotron-H: the pattern string and the older `mamba_*` names of transformers' renames
    let original = config(&root_fixture("nemotron_h_moe"));
    let dir = edited_fixture(
        "nemotron_h_moe",
        |c| {
            let c = c.as_object_mut().unwrap();
            c.remove("layers_block_type");
            c.insert("hybrid_override_pattern".into(), "M*-ME".into());
            let groups = c.remove("n_groups").unwrap();
            c.insert("mamba_n_groups".into(), groups);
            let chunk = c.remove("chunk_size").unwrap();
            c.insert("mamba_chunk_size".into(), chunk);
        },
        same,
    );
    assert_eq!(config(dir.path()), original);
    // its head is its own tensor even where the config says tied
    let nemotron = read_hybrid_config(&root_fixture("nemotron_h_moe")).unwrap();
    assert!(!nemotron.tie_embeddings && !nemotron.mlp_after_mixer);
    assert_eq!(
        nemotron.mixer.d_inner(),
        48,
        "mamba_num_heads · mamba_head_dim"
    );
    // its experts: relu², no gate, a sigmoid router over groups, the shared expert's width
    let moe = nemotron.moe.as_ref().expect("experts");
    assert_eq!(
        (
            moe.n_experts,
            moe.top_k,
            moe.d_expert,
            moe.n_group,
            moe.topk_group
        ),
        (8, 3, 24, 4, 2)
    );
    assert!(!moe.gated && moe.router == mamba2_burn::RouterKind::Sigmoid);
    assert_eq!(moe.shared.as_ref().map(|s| s.d_hidden), Some(36));
    // the experts' latent projections, and multi-token prediction, are refused by name; groups
    // that do not divide the experts are an error naming the field
    let dir = edited_fixture("nemotron_h_moe", |c| c["moe_latent_size"] = 16.into(), same);
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::Unsupported { reason, .. } if reason.contains("moe_latent_size")),
        "{e}"
    );
    let dir = edited_fixture("nemotron_h_moe", |c| c["n_group"] = 3.into(), same);
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::ConfigFile { field, .. } if *field == "n_group"),
        "{e}"
    );
    let dir = edited_fixture(
        "nemotron_h_moe",
        |c| c["num_nextn_predict_layers"] = 1.into(),
        same,
    );
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::Unsupported { reason, .. } if reason.contains("num_nextn_predict_layers")),
        "{e}"
    );
    // Bamba: half of each head rotated unless `rope_parameters` says otherwise; an attention
    // index past the last layer
    let bamba = read_hybrid_config(&root_fixture("bamba_partial_rope")).unwrap();
    let rope = bamba.attention.rope.as_ref().unwrap();
    assert_eq!((rope.head_dim, rope.rotary_dim), (8, Some(4)));
    let dir = edited_fixture(
        "bamba_partial_rope",
        |c| {
            c["rope_parameters"]
                .as_object_mut()
                .unwrap()
                .remove("partial_rotary_factor");
        },
        same,
    );
    let rope = read_hybrid_config(dir.path())
        .unwrap()
        .attention
        .rope
        .unwrap();
    assert_eq!(rope.rotary_dim, Some(4));
    let dir = edited_fixture(
        "bamba_partial_rope",
        |c| c["attn_layer_indices"] = serde_json::json!([1, 4]),
        same,
    );
    let e = load_err(dir.path());
    assert!(
        matches!(
            &e,
            Mamba2Error::ConfigFile {
                field: "attn_layer_indices",
                ..
            }
        ),
        "{e}"
    );
    // Falcon-H1: its μP multipliers, out_proj's own bias flag, a width of its own or
    // expand · hidden_size where `mamba_d_ssm` is null; the whole head rotated even where
    // `rope_parameters` has a partial factor (this family's code does not read it)
    let falcon = read_hybrid_config(&root_fixture("falcon_h1_mup")).unwrap();
    assert_eq!(
        falcon.mixer.in_proj_multipliers,
        Some([0.9, 1.1, 1.2, 0.8, 1.3])
    );
    assert!(falcon.mixer.bias && !falcon.mixer.has_out_proj_bias());
    assert_eq!(falcon.mixer.d_inner(), 48);
    assert_eq!(falcon.mamba_multipliers, (1.4, 0.75));
    assert_eq!(falcon.attention_multipliers, (1.2, 0.9));
    assert_eq!(falcon.attention.key_multiplier, 0.6);
    assert_eq!(falcon.mlp.multipliers, (1.3, 0.8));
    assert_eq!(falcon.logits_multiplier, 0.7);
    let plain = read_hybrid_config(&root_fixture("falcon_h1_plain")).unwrap();
    assert_eq!(plain.mixer.d_inner(), 64, "mamba_expand · hidden_size");
    assert!(!plain.mixer.rmsnorm);
    let dir = edited_fixture(
        "falcon_h1_mup",
        |c| c["rope_parameters"]["partial_rotary_factor"] = 0.5.into(),
        same,
    );
    let rope = read_hybrid_config(dir.path())
        .unwrap()
        .attention
        .rope
        .unwrap();
    assert_eq!(rope.rotary_dim, None);
    // a Bamba folder without its MLP's gate names the tensor as the file has it
    let dir = edited_fixture(
        "bamba_partial_rope",
        |_| {},
        |t| t.retain(|e| e.name != "model.layers.2.feed_forward.gate_proj.weight"),
    );
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::MissingTensor { name, .. } if name == "model.layers.2.feed_forward.gate_proj.weight"),
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
