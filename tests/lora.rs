//! Fine-tuning with low-rank adapters: only the adapters train (the model's own weights come out
//! bit for bit as they went in, and the optimizer keeps state for the adapters alone), the run's
//! `model/` holds them folded into the weights, a resumed run ends where an uninterrupted one
//! does, and on a hybrid every targeted projection gets one.

use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, Param};
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::{Distribution, Tensor, Tolerance};
use mamba2_burn::checkpoint::load_hybrid;
use mamba2_burn::hybrid::HybridLm;
use mamba2_burn::train::{
    evaluate_lm, LmTrainingConfig, Mamba2OptimizerConfig, NonFiniteGuard, RunConfig,
};
use mamba2_burn::{load_lm, LoraConfig, Mamba2Error, Mamba2Lm};

use crate::common;
use crate::fine_tune::{ids, run};

type B = Autodiff<NdArray<f32>>;
type Inner = NdArray<f32>;

/// A LoRA fine-tune of the `tiny` golden case (transformers' layout) on the copy task.
fn lora_run() -> LmTrainingConfig {
    let folder = crate::reference::fixture_root().join("tiny");
    LmTrainingConfig::from_checkpoint(&folder)
        .unwrap()
        .with_lora(Some(LoraConfig::new(4)))
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
/// the two matrices of each adapted projection (two projections a layer) and nothing else.
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
    assert_eq!(states(lora), 2 * 2 * layers);
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
            assert!(m.in_proj_lora.is_some() && m.out_proj_lora.is_some());
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
