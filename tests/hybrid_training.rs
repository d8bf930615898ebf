//! A hybrid model's training run: `train_lm` with a [`HybridTrainingConfig`] (Burn's `Learner`,
//! the crate's optimizer and schedule) lowers the loss and leaves a transformers folder that
//! loads back to the same model.

use burn::backend::{Autodiff, NdArray};
use mamba2_burn::checkpoint::{load_hybrid, HybridSpec};
use mamba2_burn::data::copy;
use mamba2_burn::hybrid::HybridLm;
use mamba2_burn::train::{
    evaluate_lm, train_lm, HybridTrainingConfig, LmConfig, ProgressMode, RunConfig,
};

use crate::common;

type B = Autodiff<NdArray<f32>>;
type Inner = NdArray<f32>;

/// Granite's golden case (Mamba, attention and Mamba layers, rotary, GQA, every multiplier set)
/// trained two epochs on the selective-copying task of the Mamba-2 training tests.
#[test]
fn a_hybrid_run_lowers_the_loss_and_saves_a_transformers_folder() {
    let spec = HybridSpec::from_file(crate::hybrid_files::root_fixture("granite_dense")).unwrap();
    check_run(spec);
}

/// The same for the training example's Mamba-3 model (`mamba_ssm`'s layout, two Mamba-3 layers).
#[test]
fn a_mamba3_run_lowers_the_loss_and_saves_a_mamba_ssm_folder() {
    check_run(HybridSpec::new(crate::mamba3_lm::TRAIN_CONFIG));
}

/// `spec` with the copying task's vocabulary trained two epochs: the loss falls, and the run's
/// model folder (the family's config.json and weights) loads back to the trained model.
fn check_run(spec: HybridSpec) {
    let dev = Default::default();
    let dir = tempfile::tempdir().unwrap();
    let spec = spec.with_vocab_size(10).unwrap();
    let config = HybridTrainingConfig::new(spec)
        .with_run(
            RunConfig::new(1e-2)
                .with_batch_size(16)
                .with_epochs(2)
                .with_seed(7),
        )
        .with_ignore_index(Some(copy::NOISE as usize));
    // held through the run: `train_lm` seeds the generator with `config.run.seed` and draws
    let _rng = common::seeded(config.run.seed);
    let initial: HybridLm<Inner> = config.model.init_model(&dev).unwrap();
    let score = |model: &HybridLm<Inner>| {
        evaluate_lm(model, &common::copy_data(3, 64), 32, Some(0), 1, &dev).unwrap()
    };
    let before = score(&initial);
    let model = train_lm::<B, _, _, _>(
        &config,
        common::copy_data(1, 64),
        common::copy_data(2, 32),
        dir.path(),
        false,
        ProgressMode::Plain,
        &dev,
    )
    .unwrap();
    let after = score(&model);
    assert!(
        after.loss < before.loss - 0.1,
        "loss did not fall: {} -> {}",
        before.loss,
        after.loss
    );
    // the run's model folder is the family's: its config.json, and weights that load back
    let saved = dir.path().join("model");
    let text = std::fs::read_to_string(saved.join("config.json")).unwrap();
    assert_eq!(text, config.model.config_json);
    assert!(saved.join("model.safetensors").is_file());
    let loaded: HybridLm<Inner> = load_hybrid(&saved, &dev).unwrap();
    let rows: Vec<Vec<i64>> = (0..2)
        .map(|r| (0..10).map(|t| (r + t) % 10).collect())
        .collect();
    let ids = model.input_ids(&rows, &dev).unwrap();
    // an id outside the vocabulary is an error naming the input, not a failure in the backend
    let e = model
        .input_ids(&[vec![3, model.vocab_size() as i64]], &dev)
        .unwrap_err();
    assert!(
        matches!(
            &e,
            mamba2_burn::Mamba2Error::InvalidInput {
                name: "input_ids",
                ..
            }
        ),
        "{e}"
    );
    let (expected, _) = model.forward(ids.clone(), None).unwrap();
    let (actual, _) = loaded.forward(ids, None).unwrap();
    assert_eq!(actual.into_data(), expected.into_data());
    // and the run's config.json reads back
    let again =
        <HybridTrainingConfig as burn::config::Config>::load(dir.path().join("config.json"))
            .unwrap();
    assert_eq!(again.model, config.model);
}

/// A run's init ranges reach every Mamba layer (`softplus(dt_bias)` inside the `dt` range,
/// `exp(A_log)` inside the `-A` range) and leave `config.json` as it was; a range the mixer
/// refuses is an error naming it, before any model is built.
#[test]
fn a_spec_sets_the_mamba_layers_init() {
    let dev = Default::default();
    let spec = HybridSpec::from_file(crate::hybrid_files::root_fixture("granite_dense")).unwrap();
    let set = spec
        .clone()
        .with_dt_init_range(Some((2e-4, 3e-4)))
        .with_a_init_range(Some((5.0, 6.0)));
    assert_eq!(set.config_json, spec.config_json);
    let model: HybridLm<Inner> = set.init_model(&dev).unwrap();
    let mut layers = 0;
    for mamba in model.layers.iter().filter_map(|l| l.mamba.as_ref()) {
        let dt = burn::tensor::activation::softplus(mamba.dt_bias.val(), 1.0);
        for v in dt.into_data().to_vec::<f32>().unwrap() {
            assert!((2e-4 * 0.999..=3e-4 * 1.001).contains(&v), "dt {v}");
        }
        for v in mamba.a_log.val().exp().into_data().to_vec::<f32>().unwrap() {
            assert!((5.0 * 0.999..=6.0 * 1.001).contains(&v), "-A {v}");
        }
        layers += 1;
    }
    assert!(layers >= 2, "the case has Mamba layers");
    // and every Mamba-3 layer (whose `A` comes from its input: no range of its own)
    let mamba3 = HybridSpec::new(crate::mamba3_lm::TRAIN_CONFIG)
        .with_dt_init_range(Some((2e-4, 3e-4)))
        .init_model::<Inner>(&dev)
        .unwrap();
    for layer in &mamba3.layers {
        let dt_bias = layer.mamba3.as_ref().unwrap().dt_bias.val();
        let dt = burn::tensor::activation::softplus(dt_bias, 1.0);
        for v in dt.into_data().to_vec::<f32>().unwrap() {
            assert!((2e-4 * 0.999..=3e-4 * 1.001).contains(&v), "Mamba-3 dt {v}");
        }
    }
    let e = spec
        .with_dt_init_range(Some((1e-3, 1e-4)))
        .check()
        .unwrap_err();
    assert!(
        matches!(
            &e,
            mamba2_burn::Mamba2Error::InvalidConfig {
                field: "dt_min",
                ..
            }
        ),
        "{e}"
    );
}
