//! Training with Burn's Learner: a run writes its artifacts and lowers the loss, a resumed run
//! ends with the same weights as an uninterrupted one, the optimizer refuses non-finite
//! gradients, and the selective-copying loss falls within a few hundred steps.

use crate::common;

use std::path::Path;

use burn::backend::{Autodiff, NdArray};
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::Tensor;
use mamba2_burn::data::{GeneratedDataset, SequenceItem};
use mamba2_burn::train::{
    evaluate_lm, train_lm, LmTrainingConfig, Mamba2OptimizerConfig, NonFiniteGuard, ProgressMode,
};
use mamba2_burn::{load_lm, Mamba2Error, Mamba2Lm};

type B = Autodiff<NdArray<f32>>;
type Inner = NdArray<f32>;

fn dev() -> <Inner as burn::tensor::backend::BackendTypes>::Device {
    Default::default()
}

fn data(
    seed: u64,
    len: usize,
) -> GeneratedDataset<impl Fn(u64, u64) -> SequenceItem + Send + Sync> {
    common::copy_data(seed, len)
}

fn config(epochs: usize, lr: f64) -> LmTrainingConfig {
    common::copy_lm_config(epochs, lr)
}

/// All float parameters, in visiting order.
struct Flatten(Vec<f32>);

impl ModuleVisitor<Inner> for Flatten {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Inner, D>>) {
        self.0
            .extend(param.val().into_data().to_vec::<f32>().unwrap());
    }
}

fn weights(model: &Mamba2Lm<Inner>) -> Vec<f32> {
    let mut f = Flatten(Vec::new());
    model.visit(&mut f);
    f.0
}

fn train(
    config: &LmTrainingConfig,
    dir: &Path,
    resume: bool,
) -> mamba2_burn::Result<Mamba2Lm<Inner>> {
    train_on(config, dir, resume, &dev())
}

/// [`train`] on `devices`.
fn train_on(
    config: &LmTrainingConfig,
    dir: &Path,
    resume: bool,
    devices: impl Into<mamba2_burn::train::TrainDevices<B>>,
) -> mamba2_burn::Result<Mamba2Lm<Inner>> {
    train_lm::<B, _, _, _>(
        config,
        data(1, 64),
        data(2, 32),
        dir,
        resume,
        ProgressMode::Plain,
        devices,
    )
}

#[test]
fn learner_run_writes_artifacts_and_lowers_the_loss() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(2, 5e-3);
    // held through the run: `train_lm` seeds the generator with `config.run.seed` and draws
    let _rng = common::seeded(config.run.seed);
    let initial = config.model.init::<Inner>(&dev()).unwrap();
    let before = evaluate_lm(&initial, &data(3, 64), 32, Some(0), 1, &dev()).unwrap();
    let model = train(&config, dir.path(), false).unwrap();
    let after = evaluate_lm(&model, &data(3, 64), 32, Some(0), 1, &dev()).unwrap();
    assert!(
        after.loss < before.loss - 0.1,
        "loss did not fall: {} -> {}",
        before.loss,
        after.loss
    );
    // the same scores with the batches spread over 2 threads: every batch is scored as on one
    // thread, only the f64 sum of the batches' losses runs in another order
    let spread = evaluate_lm(&model, &data(3, 64), 32, Some(0), 2, &dev()).unwrap();
    assert_eq!(
        (spread.count, spread.accuracy),
        (after.count, after.accuracy)
    );
    assert!((spread.loss - after.loss).abs() <= 1e-12 * after.loss);

    for file in [
        "config.json",
        "metrics.csv",
        "model/config.json",
        "model/model.mpk",
        "checkpoint/model-2.mpk",
        "checkpoint/optim-2.mpk",
        "checkpoint/scheduler-2.mpk",
    ] {
        assert!(dir.path().join(file).is_file(), "missing artifact {file}");
    }
    let metrics = std::fs::read_to_string(dir.path().join("metrics.csv")).unwrap();
    assert!(
        metrics.contains("2,valid,Loss,") && metrics.contains("1,train,Accuracy,"),
        "{metrics}"
    );
    // no temporary files left by the atomic writes
    let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("checkpoint"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // the final model loads back
    let loaded = load_lm::<Inner>(dir.path().join("model"), &dev()).unwrap();
    assert_eq!(weights(&loaded), weights(&model));
}

#[test]
fn resumed_run_reaches_the_same_weights() {
    // batches spread over 2 threads: the parallel step is deterministic too
    let mut config = config(3, 5e-3);
    config.run.step_threads = 2;
    let _rng = common::seeded(config.run.seed);
    let full = tempfile::tempdir().unwrap();
    let uninterrupted = train(&config, full.path(), false).unwrap();

    // a run that stopped during epoch 3: the checkpoint of epoch 2 is the last one
    let cut = common::stopped_after(full.path(), 2);
    let resumed = train(&config, cut.path(), true).unwrap();
    // With the generator held by this test, a run repeats bit for bit (the same weights, the
    // same batches in the same order, the same operations), and so must a resumed one; a resume
    // that replayed the wrong data order or lost the optimizer state is off by about 1e-3.
    let again = train(&config, tempfile::tempdir().unwrap().path(), false).unwrap();
    let diff = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max)
    };
    let rerun = diff(&weights(&again), &weights(&uninterrupted));
    let resume = diff(&weights(&resumed), &weights(&uninterrupted));
    eprintln!("max weight difference: rerun {rerun:e}, resumed {resume:e}");
    assert_eq!(rerun, 0.0, "two uninterrupted runs differ by {rerun:e}");
    assert_eq!(resume, 0.0, "resumed weights differ by {resume:e}");

    // resuming with another config, or with no checkpoint, is an error
    let mut other = config.clone();
    other.run.lr = 1e-3;
    assert!(matches!(
        train(&other, cut.path(), true).unwrap_err(),
        Mamba2Error::File { .. }
    ));
    let empty = tempfile::tempdir().unwrap();
    assert!(matches!(
        train(&config, empty.path(), true).unwrap_err(),
        Mamba2Error::File { .. }
    ));
}

#[test]
fn non_finite_gradients_are_refused() {
    let _rng = common::seeded(9);
    let model = config(1, 1e-3)
        .model
        .init::<B>(&Default::default())
        .unwrap();
    let before = {
        let mut f = Flatten(Vec::new());
        model.valid().visit(&mut f);
        f.0
    };
    let guard = NonFiniteGuard::new(None);
    let mut optim = Mamba2OptimizerConfig::new().init::<B, Mamba2Lm<B>>(guard.clone());
    let batch = {
        use burn::data::dataloader::batcher::Batcher;
        use burn::data::dataset::Dataset;
        let items = (0..4).map(|i| data(0, 4).get(i).unwrap()).collect();
        mamba2_burn::train::SequenceBatcher {
            ignore_index: Some(0),
        }
        .batch(items, &Default::default())
    };
    let out = model.forward_loss(&batch);
    let grads = GradientsParams::from_grads((out.loss * f32::NAN).backward(), &model);
    let model = optim.step(1e-3, model, grads);
    assert_eq!(guard.tripped_at(), Some(1));
    let mut after = Flatten(Vec::new());
    model.valid().visit(&mut after);
    assert_eq!(after.0, before, "a non-finite step changed the weights");
}

#[test]
fn a_diverging_run_stops_with_an_error_naming_the_step() {
    let dir = tempfile::tempdir().unwrap();
    let _rng = common::seeded(7);
    match train(&config(2, 1e30), dir.path(), false).unwrap_err() {
        Mamba2Error::NonFiniteLoss { step, .. } => assert!(step >= 2, "step {step}"),
        other => panic!("expected NonFiniteLoss, got {other:?}"),
    }
}

#[test]
fn copy_task_loss_falls_within_a_few_hundred_steps() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(1, 1e-2);
    let _rng = common::seeded(config.run.seed);
    let initial = config.model.init::<Inner>(&dev()).unwrap();
    let before = evaluate_lm(&initial, &data(3, 128), 64, Some(0), 1, &dev()).unwrap();
    // 600 steps of 16 sequences
    let model = train_lm::<B, _, _, _>(
        &config,
        data(1, 600 * 16),
        data(2, 32),
        dir.path(),
        false,
        ProgressMode::Plain,
        &dev(),
    )
    .unwrap();
    let after = evaluate_lm(&model, &data(3, 128), 64, Some(0), 1, &dev()).unwrap();
    eprintln!(
        "copy task: loss {:.3} -> {:.3}, accuracy {:.3} -> {:.3}",
        before.loss, after.loss, before.accuracy, after.accuracy
    );
    // Guessing any of the 8 data tokens uniformly scores ln 8 = 2.08: a loss well below that
    // means the model copies, not only that it learned which tokens are data.
    let guess = (8.0f64).ln();
    assert!(
        after.loss < guess - 0.25,
        "copy loss did not fall below guessing: {} -> {}",
        before.loss,
        after.loss
    );
}

#[test]
fn length_buckets_batch_each_length_apart_and_cover_every_item_once() {
    use burn::data::dataloader::DataLoader;
    use mamba2_burn::data::loader::EpochLoader;
    use mamba2_burn::train::LmBatch;
    use mamba2_burn::train::SequenceBatcher;
    use std::sync::Arc;

    // item i has length 4, 8 or 16 (i % 3) and carries its index as its first token
    let n = 100;
    let item = |_: u64, i: u64| {
        let len = [4, 8, 16][(i % 3) as usize];
        let mut input = vec![i as i64; len];
        input[1..].fill(-1);
        SequenceItem::new(input.clone(), input)
    };
    let make = || {
        EpochLoader::<Inner, _, _>::new(
            Arc::new(GeneratedDataset::new(item, 0, n)),
            Arc::new(SequenceBatcher { ignore_index: None }),
            8,
            Some(7),
            dev(),
        )
        .with_buckets(Arc::new(|s: &SequenceItem| s.input.len()))
    };
    let loader = make();
    // 34 + 33 + 33 items: 5 + 5 + 5 batches of at most 8
    assert_eq!(loader.batches_per_epoch(), 15);

    let epoch = |loader: &EpochLoader<Inner, SequenceItem, LmBatch<Inner>>| {
        let mut seen = Vec::new();
        let mut lengths = Vec::new();
        for batch in loader.iter() {
            let [b, l] = batch.inputs.dims();
            let firsts: Vec<i64> = batch.inputs.narrow(1, 0, 1).into_data().to_vec().unwrap();
            assert_eq!(firsts.len(), b);
            for i in &firsts {
                // every item of the batch has the batch's length
                assert_eq!(
                    [4, 8, 16][(*i % 3) as usize],
                    l,
                    "item {i} in a batch of length {l}"
                );
            }
            seen.extend(firsts);
            lengths.push(l);
        }
        (seen, lengths)
    };
    let (mut first, lengths) = epoch(&loader);
    assert_eq!(lengths.len(), 15);
    // the batches of the three lengths are shuffled together, not run length by length
    let changes = lengths.windows(2).filter(|w| w[0] != w[1]).count();
    assert!(changes > 2, "batch lengths not shuffled: {lengths:?}");
    let (second, _) = epoch(&loader);
    assert_ne!(first, second, "two epochs in the same order");
    first.sort_unstable();
    assert_eq!(first, (0..n as i64).collect::<Vec<_>>());

    // the steps of a multi-device epoch: the most batches any of the shares that Burn's
    // strategies cut (`split_dataloader`) yields in an epoch
    for shares in [2, 3, 7] {
        let split = burn::data::dataloader::split::split_dataloader(
            Arc::new(make()) as Arc<dyn DataLoader<Inner, _>>,
            &vec![dev(); shares],
        );
        let most = split.iter().map(|s| s.iter().count()).max().unwrap();
        assert_eq!(
            loader.batches_per_epoch_in_shares(shares),
            most,
            "{shares} shares"
        );
    }
}

/// An optimizer that keeps every gradient it is given (flattened in visiting order) and leaves
/// the model as it is.
#[derive(Clone, Default)]
struct GradientRecorder(std::sync::Arc<std::sync::Mutex<Vec<Vec<f32>>>>);

struct FlattenGrads<'a>(&'a GradientsParams, Vec<f32>);

impl ModuleVisitor<B> for FlattenGrads<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let g = self
            .0
            .get::<Inner, D>(param.id)
            .expect("a gradient per parameter");
        self.1.extend(g.into_data().to_vec::<f32>().unwrap());
    }
}

impl<M: AutodiffModule<B>> Optimizer<M, B> for GradientRecorder {
    type Record = ();

    fn step(&mut self, _lr: f64, module: M, grads: GradientsParams) -> M {
        let mut flat = FlattenGrads(&grads, Vec::new());
        module.visit(&mut flat);
        self.0.lock().unwrap().push(flat.1);
        module
    }

    fn step_multi(&mut self, _lr: f64, _module: M, _grads: burn::optim::MultiGradientsParams) -> M {
        unreachable!("the runs here step on the main device")
    }

    fn to_record(&self) {}

    fn load_record(self, _record: ()) -> Self {
        self
    }
}

/// Burn's multi-device strategy over two (CPU) devices, each with a batch of 8 sequences,
/// hands the optimizer the gradient of one device on the 16 sequences together: the devices'
/// gradients, each divided by the device count (`Threaded::with_replicas`), summed by Burn.
/// Within 1e-5 of the largest gradient element (f32 sums in another order); without the
/// division the gradient would be twice as large.
#[test]
fn a_two_device_step_has_the_gradient_of_both_batches() {
    use burn::train::{
        ExecutionStrategy, Learner, LearningComponentsMarker, MultiDeviceOptim, SupervisedTraining,
    };
    use mamba2_burn::data::loader::EpochLoader;
    use mamba2_burn::train::{LmBatch, PlainProgress, SequenceBatcher, Threaded};
    use std::sync::Arc;

    let config = config(1, 1e-3);
    let batcher = Arc::new(SequenceBatcher {
        ignore_index: config.ignore_index,
    });
    let gradient = |devices: usize, threads: usize| -> Vec<f32> {
        let _rng = common::seeded(5);
        let model = config.model.init::<B>(&dev()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        // 16 sequences in dataset order: one batch of 16, or one of 8 on each device
        let train = EpochLoader::<B, _, LmBatch<B>>::new(
            Arc::new(data(1, 16)),
            batcher.clone(),
            16 / devices,
            None,
            dev(),
        );
        let valid = EpochLoader::<Inner, _, LmBatch<Inner>>::new(
            Arc::new(data(2, 4)),
            batcher.clone(),
            4,
            None,
            dev(),
        );
        let recorder = GradientRecorder::default();
        type Components =
            LearningComponentsMarker<B, f64, Threaded<B, Mamba2Lm<B>>, GradientRecorder>;
        let mut training =
            SupervisedTraining::<Components>::new(dir.path(), Arc::new(train), Arc::new(valid))
                .num_epochs(1)
                .renderer(PlainProgress::new(1));
        if devices > 1 {
            training = training.with_training_strategy(
                ExecutionStrategy::multi(vec![dev(); devices], MultiDeviceOptim::OptimMainDevice)
                    .into(),
            );
        }
        let model = Threaded::new(model, threads).with_replicas(devices);
        training.launch(Learner::new(model, recorder.clone(), 1e-3));
        let mut steps = recorder.0.lock().unwrap().clone();
        assert_eq!(steps.len(), 1, "one optimizer step");
        steps.remove(0)
    };
    let one = gradient(1, 1);
    // each device's batch spread over two threads as well
    let two = gradient(2, 2);
    assert_eq!(one.len(), two.len());
    let largest = one.iter().fold(0.0f32, |m, g| m.max(g.abs()));
    let worst = one
        .iter()
        .zip(&two)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    eprintln!("largest gradient element {largest:e}, largest difference {worst:e}");
    assert!(largest > 0.0);
    assert!(worst <= 1e-5 * largest, "{worst:e} against {largest:e}");
}

/// `train_lm` over two devices (Burn's multi-device strategy, batches of 8 on each) lowers the
/// loss as the one-device run of batches of 16 does, writes its checkpoints, and an empty
/// device list is an error that names it.
#[test]
fn a_two_device_run_learns() {
    use mamba2_burn::train::TrainDevices;

    let dir = tempfile::tempdir().unwrap();
    let mut config = config(2, 5e-3);
    config.run.batch_size = 8;
    let _rng = common::seeded(config.run.seed);
    let initial = config.model.init::<Inner>(&dev()).unwrap();
    let before = evaluate_lm(&initial, &data(3, 64), 32, Some(0), 1, &dev()).unwrap();
    let devices = TrainDevices::<B>::multi(vec![dev(), dev()]).unwrap();
    let model = train_on(&config, dir.path(), false, devices).unwrap();
    let after = evaluate_lm(&model, &data(3, 64), 32, Some(0), 1, &dev()).unwrap();
    eprintln!("two devices: loss {} -> {}", before.loss, after.loss);
    assert!(after.loss < before.loss - 0.1, "loss did not fall");
    assert!(dir.path().join("checkpoint/model-2.mpk").is_file());
    assert!(matches!(
        TrainDevices::<B>::multi(Vec::new()),
        Err(Mamba2Error::InvalidInput {
            name: "devices",
            ..
        })
    ));
}

/// A batch of packed rows (items with document lengths) scores every document as if it were
/// run on its own: the batch's mean cross-entropy equals the mean over the documents run one
/// by one (relative 1e-5, the f32 tolerance of the path tests), and it differs from the same
/// rows without documents. The byte corpus packs paragraphs into such items.
#[test]
fn a_packed_batch_scores_each_document_on_its_own() {
    use burn::data::dataloader::batcher::Batcher;
    use burn::tensor::{Int, TensorData};
    use mamba2_burn::data::text::ByteCorpus;
    use mamba2_burn::train::SequenceBatcher;
    use mamba2_burn::train::{masked_cross_entropy, LmBatch};

    let _rng = common::seeded(21);
    let model: Mamba2Lm<Inner> = config(1, 1e-3).model.init(&dev()).unwrap();
    let text = b"one fish\n\ntwo fish\n\nred fish, blue fish. ".repeat(4);
    let corpus = ByteCorpus::packed(&text, 12, b"\n\n").unwrap();
    let items: Vec<SequenceItem> = corpus.train.iter().take(6).cloned().collect();
    assert!(items.iter().any(|i| i.documents.len() > 1));
    // the model's vocabulary is 10 (padded to 16): map the bytes into it
    let items: Vec<SequenceItem> = items
        .into_iter()
        .map(|mut item| {
            item.input.iter_mut().for_each(|t| *t %= 10);
            item.target.iter_mut().for_each(|t| *t %= 10);
            item
        })
        .collect();
    let batch: LmBatch<Inner> = SequenceBatcher { ignore_index: None }.batch(items.clone(), &dev());
    assert_eq!(batch.documents.as_ref().unwrap().dims(), [6, 12]);
    let packed: f32 = model.forward_loss(&batch).loss.into_scalar();

    let (mut nll, mut count) = (0.0f64, 0usize);
    for item in &items {
        let lengths = if item.documents.is_empty() {
            vec![item.input.len()]
        } else {
            item.documents.clone()
        };
        let mut at = 0;
        for n in lengths {
            let ids = |v: &[i64]| {
                Tensor::<Inner, 2, Int>::from_data(TensorData::new(v.to_vec(), [1, n]), &dev())
            };
            let (logits, _) = model.forward(ids(&item.input[at..at + n]), None).unwrap();
            let mean: f32 =
                masked_cross_entropy(logits, ids(&item.target[at..at + n]), None).into_scalar();
            nll += mean as f64 * n as f64;
            count += n;
            at += n;
        }
    }
    let one_by_one = nll / count as f64;
    let rel = (packed as f64 - one_by_one).abs() / one_by_one;
    eprintln!("packed loss {packed} vs documents one by one {one_by_one}: relative {rel:.1e}");
    assert!(rel <= 1e-5, "packed {packed} vs one by one {one_by_one}");

    let unpacked: Vec<SequenceItem> = items
        .into_iter()
        .map(|i| SequenceItem::new(i.input, i.target))
        .collect();
    let plain: LmBatch<Inner> = SequenceBatcher { ignore_index: None }.batch(unpacked, &dev());
    assert!(plain.documents.is_none());
    let plain: f32 = model.forward_loss(&plain).loss.into_scalar();
    assert!(
        (plain - packed).abs() > 1e-4 * packed,
        "documents change the loss"
    );
}

/// Training configs save and load back to the same config (resume compares the saved config
/// with the run's); one of the layout before the run's settings were nested under `run`
/// (`tests/fixtures/configs`) is refused with an error that names `run`, never read with some
/// settings at their defaults.
#[test]
fn training_configs_round_trip_and_the_flat_layout_is_refused() {
    use burn::config::Config;
    use mamba2_burn::train::{ForecastTrainingConfig, RunConfig};

    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/configs");
    let tmp = tempfile::tempdir().unwrap();

    let lm = common::copy_lm_config(2, 0.005)
        .with_run(
            RunConfig::new(0.005)
                .with_batch_size(16)
                .with_epochs(2)
                .with_seed(7),
        )
        .with_ignore_index(Some(0));
    let saved = tmp.path().join("lm.json");
    lm.save(&saved).unwrap();
    let nested: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    assert_eq!(nested["run"]["lr"], serde_json::json!(0.005));
    assert!(nested.get("lr").is_none(), "lr stays in run");
    let again = LmTrainingConfig::load(&saved).unwrap();
    assert_eq!(again.to_string(), lm.to_string());

    let fc = ForecastTrainingConfig::load(dir.join("forecast-training-flat.json"));
    let e = fc.unwrap_err().to_string();
    assert!(e.contains("`run`"), "{e}");
    let e = LmTrainingConfig::load(dir.join("lm-training-flat.json"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("`run`"), "{e}");
}
