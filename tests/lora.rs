//! Fine-tuning with low-rank adapters: only the adapters train (the model's own weights come out
//! bit for bit as they went in, and the optimizer keeps state for the adapters alone), the run's
//! `model/` holds them folded into the weights, a resumed run ends where an uninterrupted one
//! does, on a hybrid every targeted projection gets one, and PEFT's files of them hold the
//! difference between the merged weights and the base's.

use std::collections::BTreeMap;
use std::path::Path;

use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, Param};
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::{Distribution, Tensor, Tolerance};
use mamba2_burn::checkpoint::{
    load_hybrid, read_config, save_checkpoint, save_hybrid, save_hybrid_lora_adapter,
    save_lora_adapter, HybridSpec,
};
use mamba2_burn::hybrid::HybridLm;
use mamba2_burn::train::{
    evaluate_lm, LmTrainingConfig, Mamba2OptimizerConfig, NonFiniteGuard, RunConfig,
};
use mamba2_burn::{load_lm, LoraConfig, Mamba2Error, Mamba2Lm};

use crate::common;
use crate::common::safetensors::read_entries;
use crate::fine_tune::{ids, run};

type B = Autodiff<NdArray<f32>>;
type Inner = NdArray<f32>;

/// A LoRA fine-tune of the `tiny` golden case (transformers' layout) on the copy task.
fn lora_run() -> LmTrainingConfig {
    let folder = crate::reference::fixture_root().join("tiny");
    LmTrainingConfig::from_checkpoint(&folder)
        .unwrap()
        .with_lora(Some(
            LoraConfig::new(4).with_targets(vec!["in_proj".into(), "out_proj".into()]),
        ))
        .with_run(
            RunConfig::new(1e-2)
                .with_batch_size(16)
                .with_epochs(2)
                .with_seed(7),
        )
}

/// The model without its adapters.
fn without_lora(mut model: Mamba2Lm<Inner>) -> Mamba2Lm<Inner> {
    for block in &mut model.backbone.layers {
        block.mixer.in_proj_lora = None;
        block.mixer.out_proj_lora = None;
    }
    model
}

#[test]
fn a_lora_fine_tune_trains_only_its_adapters_and_saves_them_merged() {
    let dev = Default::default();
    let config = lora_run();
    let folder = config.init_from.clone().unwrap();
    let _rng = common::seeded(7);
    let artifacts = tempfile::tempdir().unwrap();
    let tuned = run(&config, artifacts.path(), false).unwrap();
    assert!(tuned.has_lora());
    let start = load_lm::<Inner>(&folder, &dev).unwrap();
    let logits = |m: &Mamba2Lm<Inner>| m.forward(ids(), None).unwrap().0;

    // every weight of the model as it was, bit for bit: the adapters are all that moved
    assert_eq!(
        logits(&without_lora(tuned.clone())).into_data(),
        logits(&start).into_data()
    );
    // and they learnt: the held-out loss fell
    let score = |m: &Mamba2Lm<Inner>| {
        evaluate_lm(m, &common::copy_data(3, 64), 32, None, 1, &dev)
            .unwrap()
            .loss
    };
    let (before, after) = (score(&start), score(&tuned));
    assert!(
        after < before - 0.05,
        "loss did not fall: {before} -> {after}"
    );

    // `model/` holds the adapters folded into the weights, in the folder's layout
    let saved = load_lm::<Inner>(artifacts.path().join("model"), &dev).unwrap();
    assert!(!saved.has_lora());
    assert!(artifacts.path().join("model/model.safetensors").exists());
    logits(&saved)
        .into_data()
        .assert_approx_eq::<f32>(&logits(&tuned).into_data(), Tolerance::absolute(1e-5));
    // the run's config.json records the adapters
    let recorded =
        <LmTrainingConfig as burn::config::Config>::load(artifacts.path().join("config.json"))
            .unwrap();
    assert_eq!(recorded.lora.map(|l| l.rank), Some(4));
}

/// A LoRA fine-tune stopped after its first epoch and resumed ends with the adapters of an
/// uninterrupted one.
#[test]
fn a_resumed_lora_fine_tune_reaches_the_same_adapters() {
    let config = lora_run();
    let _rng = common::seeded(7);
    let full = tempfile::tempdir().unwrap();
    let uninterrupted = run(&config, full.path(), false).unwrap();
    let cut = common::stopped_after(full.path(), 1);
    let resumed = run(&config, cut.path(), true).unwrap();
    assert!(resumed.has_lora());
    let logits = |m: &Mamba2Lm<Inner>| m.forward(ids(), None).unwrap().0.into_data();
    assert_eq!(logits(&resumed), logits(&uninterrupted));
}

/// The optimizer's state after a step: one entry per parameter that trains. With adapters,
/// the two matrices of each adapted projection (the default: in_proj, one a layer) and
/// nothing else.
#[test]
fn the_optimizer_keeps_state_for_the_adapters_alone() {
    let dev = Default::default();
    let folder = crate::reference::fixture_root().join("tiny");
    let states = |model: Mamba2Lm<B>| {
        let mut optim =
            Mamba2OptimizerConfig::new().init::<B, Mamba2Lm<B>>(NonFiniteGuard::default());
        let ids = ids().to_device(&dev);
        let ids = Tensor::<B, 2, burn::tensor::Int>::from_data(ids.into_data(), &dev);
        let loss = model.forward(ids, None).unwrap().0.powi_scalar(2).mean();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let _ = optim.step(1e-3, model, grads);
        let (decay, no_decay, _) = optim.to_record();
        decay.len() + no_decay.len()
    };
    let base = load_lm::<B>(&folder, &dev).unwrap();
    let layers = base.backbone.layers.len();
    let all = base.num_params();
    let full = states(base.clone());
    let lora = base.with_lora(&LoraConfig::new(2)).unwrap();
    assert!(lora.num_params() > all);
    assert_eq!(states(lora), 2 * layers);
    // every parameter trains without them (embedding, norms, convolution, dt_bias, A_log, D,
    // the projections): many more
    assert!(full > 6 * layers, "{full}");
}

/// On a hybrid (Granite's golden case: Mamba, attention and MLP layers), every projection the
/// config targets gets an adapter, a fresh one changes nothing, only adapters get gradients,
/// and merging keeps the logits.
#[test]
fn a_hybrid_gets_adapters_on_each_targeted_projection() {
    let dev = Default::default();
    let folder = crate::hybrid_files::root_fixture("granite_dense");
    let base: HybridLm<B> = load_hybrid(&folder, &dev).unwrap();
    let ids = Tensor::<B, 2, burn::tensor::Int>::from_data(ids().into_data(), &dev);
    let logits = |m: &HybridLm<B>| m.forward(ids.clone(), None).unwrap().0;
    let expected = logits(&base);
    let _rng = common::seeded(3);
    let mut lora = base.clone().with_lora(&LoraConfig::new(2)).unwrap();
    for layer in &lora.layers {
        if let Some(m) = &layer.mamba {
            // out_proj only when named (DEFAULT_LORA_TARGETS)
            assert!(m.in_proj_lora.is_some() && m.out_proj_lora.is_none());
        }
        if let Some(a) = &layer.attention {
            assert!(a.q_proj_lora.is_some() && a.k_proj_lora.is_some());
            assert!(a.v_proj_lora.is_some() && a.o_proj_lora.is_some());
        }
        if let Some(m) = &layer.mlp {
            assert!(m.up_lora.is_some() && m.down_lora.is_some());
            assert_eq!(m.gate.is_some(), m.gate_lora.is_some());
        }
    }
    assert!(lora.layers.iter().any(|l| l.attention.is_some()));
    assert_eq!(logits(&lora).into_data(), expected.clone().into_data());

    // only the adapters get gradients
    let grads = logits(&lora).powi_scalar(2).mean().backward();
    assert!(lora.embedding.weight.grad(&grads).is_none());
    assert!(lora.norm.weight.grad(&grads).is_none());
    let attention = lora
        .layers
        .iter()
        .find_map(|l| l.attention.as_ref())
        .unwrap();
    assert!(attention.q_proj.weight.grad(&grads).is_none());
    let q = attention.q_proj_lora.as_ref().unwrap();
    assert!(q.b.grad(&grads).is_some());

    // trained adapters (B drawn), merged: the same logits
    for layer in &mut lora.layers {
        if let Some(a) = &mut layer.attention {
            let b = a.v_proj_lora.as_mut().unwrap();
            b.b = Param::from_tensor(Tensor::random(
                b.b.shape(),
                Distribution::Normal(0.0, 0.1),
                &dev,
            ));
        }
        if let Some(m) = &mut layer.mlp {
            let down = m.down_lora.as_mut().unwrap();
            down.b = Param::from_tensor(Tensor::random(
                down.b.shape(),
                Distribution::Normal(0.0, 0.1),
                &dev,
            ));
        }
    }
    let adapted = logits(&lora);
    assert!(
        (adapted.clone() - expected).abs().max().into_scalar() > 1e-3,
        "the drawn updates change the logits"
    );
    let merged = lora.merge_lora();
    assert!(!merged.has_lora());
    logits(&merged)
        .into_data()
        .assert_approx_eq::<f32>(&adapted.into_data(), Tolerance::absolute(1e-5));
}

/// Targets the model does not have, or none the crate knows, are errors naming `targets`.
#[test]
fn targets_that_adapt_nothing_are_named() {
    let folder = crate::reference::fixture_root().join("tiny");
    let model = load_lm::<Inner>(&folder, &Default::default()).unwrap();
    for targets in [vec!["q_proj".to_string()], vec!["x_proj".to_string()]] {
        let e = model
            .clone()
            .with_lora(&LoraConfig::new(2).with_targets(targets))
            .unwrap_err();
        assert!(
            matches!(
                &e,
                Mamba2Error::InvalidConfig {
                    field: "targets",
                    ..
                }
            ),
            "{e}"
        );
    }
}

/// Draws every adapter's `B` (zero when fresh), so that each adapter changes its projection.
struct DrawB {
    path: Vec<String>,
}

impl<Bk: burn::tensor::backend::Backend> burn::module::ModuleMapper<Bk> for DrawB {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<Bk, D>>) -> Param<Tensor<Bk, D>> {
        if !self.path.join(".").ends_with("_lora.b") {
            return param;
        }
        let t = param.val();
        Param::from_tensor(Tensor::random(
            t.shape(),
            Distribution::Normal(0.0, 0.1),
            &t.device(),
        ))
    }
}

/// The tensors of a safetensors file by name: shape and values.
fn tensors(file: &Path) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    read_entries(file)
        .into_iter()
        .map(|e| {
            let values = e
                .bytes
                .chunks(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            (e.name, (e.shape, values))
        })
        .collect()
}

/// PEFT's files against the weights: for each module they name, `lora_B · lora_A · alpha / r`
/// (the module's own rank and alpha where the patterns set them) is the merged weight less the
/// base's, in the files' names and layout; every other tensor is the base's.
fn check_peft_files(base: &Path, merged: &Path, adapter: &Path) -> usize {
    let (base, merged) = (tensors(base), tensors(merged));
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(adapter.join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    let (r, alpha) = (
        config["r"].as_f64().unwrap(),
        config["lora_alpha"].as_f64().unwrap(),
    );
    let files = tensors(&adapter.join("adapter_model.safetensors"));
    let mut modules = Vec::new();
    for (name, (a_shape, a)) in &files {
        let Some(module) = name
            .strip_prefix("base_model.model.")
            .and_then(|n| n.strip_suffix(".lora_A.weight"))
        else {
            continue;
        };
        let (b_shape, b) = &files[&format!("base_model.model.{module}.lora_B.weight")];
        let rank = config["rank_pattern"][module].as_f64().unwrap_or(r);
        let scale = config["alpha_pattern"][module].as_f64().unwrap_or(alpha) / rank;
        let ([k, d_in], [d_out, k2]) = ([a_shape[0], a_shape[1]], [b_shape[0], b_shape[1]]);
        assert_eq!((k, k2), (rank as usize, rank as usize), "{module}");
        let weight = format!("{module}.weight");
        let (shape, w1) = &merged[&weight];
        let (_, w0) = &base[&weight];
        assert_eq!(shape, &vec![d_out, d_in], "{weight}");
        for o in 0..d_out {
            for i in 0..d_in {
                let delta: f64 = (0..k)
                    .map(|j| b[o * k + j] as f64 * a[j * d_in + i] as f64)
                    .sum::<f64>()
                    * scale;
                let found = (w1[o * d_in + i] - w0[o * d_in + i]) as f64;
                assert!(
                    (found - delta).abs() < 1e-5,
                    "{weight}[{o}, {i}]: {found} against {delta}"
                );
            }
        }
        modules.push(module.to_string());
    }
    let targets: Vec<String> = config["target_modules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(targets, modules);
    for (name, (_, w0)) in &base {
        let adapted = modules.iter().any(|m| name == &format!("{m}.weight"));
        if !adapted {
            assert_eq!(&merged[name].1, w0, "{name} changed");
        }
    }
    modules.len()
}

/// A LoRA model's adapters in PEFT's layout, for Mamba-2 in transformers' layout (in_proj and
/// out_proj) and for Granite, whose file fuses the MLP's gate and up rows into one module
/// (`input_linear`: one update of twice the rank).
#[test]
fn peft_files_hold_the_update_of_the_merged_weights() {
    let dev = Default::default();
    let tmp = tempfile::tempdir().unwrap();
    let _rng = common::seeded(5);

    let folder = crate::reference::fixture_root().join("tiny");
    let lora = LoraConfig::new(3)
        .with_alpha(6.0)
        .with_targets(vec!["in_proj".into(), "out_proj".into()]);
    let model = load_lm::<Inner>(&folder, &dev)
        .unwrap()
        .with_lora(&lora)
        .unwrap()
        .map(&mut DrawB { path: vec![] });
    let (config, format) = read_config(&folder).unwrap();
    save_checkpoint(&model, &config, tmp.path().join("m"), format).unwrap();
    save_lora_adapter(&model, &lora, format, None, tmp.path().join("ma")).unwrap();
    let n = check_peft_files(
        &folder.join("model.safetensors"),
        &tmp.path().join("m/model.safetensors"),
        &tmp.path().join("ma"),
    );
    assert_eq!(n, 2 * model.backbone.layers.len());

    let folder = crate::hybrid_files::root_fixture("granite_dense");
    let spec = HybridSpec::from_file(&folder).unwrap();
    let lora = LoraConfig::new(2);
    let model = load_hybrid::<Inner>(&folder, &dev)
        .unwrap()
        .with_lora(&lora)
        .unwrap()
        .map(&mut DrawB { path: vec![] });
    save_hybrid(&model, &spec.config_json, tmp.path().join("h")).unwrap();
    let config = spec.config().unwrap();
    save_hybrid_lora_adapter(&model, &config, &lora, None, tmp.path().join("ha")).unwrap();
    check_peft_files(
        &folder.join("model.safetensors"),
        &tmp.path().join("h/model.safetensors"),
        &tmp.path().join("ha"),
    );
    let written = std::fs::read_to_string(tmp.path().join("ha/adapter_config.json")).unwrap();
    assert!(written.contains("shared_mlp.input_linear"), "{written}");
}
