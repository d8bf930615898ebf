//! The forecaster: shapes in both channel modes, RevIN's equivariance to per-window shift and
//! scale, config errors, and training through `TrainStep` on a CSV series.

use crate::common;

use std::path::Path;

use burn::backend::{Autodiff, NdArray};
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::optim::Optimizer;
use burn::tensor::{Distribution, Tensor};
use burn::train::TrainStep;
use mamba2_burn::data::timeseries::{ForecastData, Split, TimeSeries};
use mamba2_burn::train::WindowBatcher;
use mamba2_burn::train::{ForecastBatch, Mamba2OptimizerConfig, NonFiniteGuard};
use mamba2_burn::{
    Mamba2BackboneConfig, Mamba2Config, Mamba2Error, Mamba2Forecaster, Mamba2ForecasterConfig,
};

type B = NdArray<f32>;
type A = Autodiff<NdArray<f32>>;

fn config(n_in: usize, n_out: usize, revin: bool, ci: bool) -> Mamba2ForecasterConfig {
    let mixer = Mamba2Config::new(16)
        .with_d_state(8)
        .with_headdim(8)
        .with_chunk_size(8);
    Mamba2ForecasterConfig::new(n_in, n_out, 6, Mamba2BackboneConfig::new(1, mixer))
        .with_revin(revin)
        .with_channel_independent(ci)
}

#[test]
fn forecasts_have_the_horizon_shape_in_both_modes() {
    let dev = Default::default();
    let _rng = common::seeded(1);
    let x = Tensor::<B, 3>::random([2, 20, 3], Distribution::Normal(0.0, 1.0), &dev);
    for (revin, ci, n_out) in [
        (true, true, 3),
        (false, false, 2),
        (true, false, 3),
        (false, true, 3),
    ] {
        let f: Mamba2Forecaster<B> = config(3, n_out, revin, ci).init(&dev).unwrap();
        assert_eq!(
            f.forward(x.clone()).unwrap().dims(),
            [2, 6, n_out],
            "revin={revin} ci={ci}"
        );
    }
    let f: Mamba2Forecaster<B> = config(3, 3, true, true).init(&dev).unwrap();
    assert!(matches!(
        f.forward(Tensor::zeros([2, 20, 4], &dev)).unwrap_err(),
        Mamba2Error::Shape { name: "x", .. }
    ));
    match config(3, 2, true, false).init::<B>(&dev).unwrap_err() {
        Mamba2Error::InvalidConfig { field, .. } => assert_eq!(field, "n_targets"),
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
}

#[test]
fn revin_makes_forecasts_follow_shift_and_scale() {
    let dev = Default::default();
    let _rng = common::seeded(3);
    let f: Mamba2Forecaster<B> = config(2, 2, true, true).init(&dev).unwrap();
    let x = Tensor::<B, 3>::random([3, 24, 2], Distribution::Normal(0.0, 1.0), &dev);
    let y = f.forward(x.clone()).unwrap();
    let y2 = f.forward(x * 3.0 + 5.0).unwrap();
    let expected = y * 3.0 + 5.0;
    let scale: f32 = expected.clone().abs().max().into_scalar();
    let err: f32 = (y2 - expected).abs().max().into_scalar();
    // exact but for the 1e-5 added to each window's variance
    assert!(err / scale < 1e-3, "relative error {}", err / scale);
}

/// Two noisy sinusoids, 600 rows.
fn sines_csv() -> String {
    let mut csv = String::from("date,a,b\n");
    for t in 0..600 {
        let t = t as f32;
        csv.push_str(&format!(
            "{t},{},{}\n",
            (t * 0.3).sin() + 0.1 * (t * 1.7).sin(),
            (t * 0.11).cos()
        ));
    }
    csv
}

/// The windows of [`sines_csv`]: 32 steps of both columns in, 6 steps of `targets` (names;
/// empty: both columns) out, split 70/10/20.
fn sines(targets: &[String]) -> ForecastData {
    let series = TimeSeries::from_reader(sines_csv().as_bytes(), Path::new("sines.csv")).unwrap();
    let split = Split::Fractions {
        train: 0.7,
        test: 0.2,
    };
    ForecastData::new(&series, Path::new("sines.csv"), &[], targets, 32, 6, split).unwrap()
}

#[test]
fn training_steps_lower_the_forecast_error_on_a_csv_series() {
    let data = sines(&[]);
    let dev = Default::default();
    let _rng = common::seeded(5);
    let mut model: Mamba2Forecaster<A> = config(2, 2, true, true).init(&dev).unwrap();
    let mut optim =
        Mamba2OptimizerConfig::new().init::<A, Mamba2Forecaster<A>>(NonFiniteGuard::default());
    let batcher = WindowBatcher::new(32, 6);
    let test: ForecastBatch<A> = batcher.batch(
        (0..data.test.len())
            .filter_map(|i| data.test.get(i))
            .collect(),
        &dev,
    );
    let mse = |m: &Mamba2Forecaster<A>| -> f32 { m.forward_forecast(&test).loss.into_scalar() };
    let before = mse(&model);
    for step in 0..60 {
        let items = (0..16)
            .filter_map(|i| data.train.get((step * 16 + i) % data.train.len()))
            .collect();
        let out = TrainStep::step(&model, batcher.batch(items, &dev));
        model = optim.step(3e-3, model, out.grads);
    }
    let after = mse(&model);
    eprintln!("forecast test MSE {before:.4} -> {after:.4}");
    assert!(
        after < 0.5 * before,
        "test MSE did not fall: {before} -> {after}"
    );
}

/// `train::direction_accuracy` against the same count made here from the windows' host data:
/// per window and target, the first forecast step and the actual next value, both
/// un-standardised with that target's column statistics (targets in another order than the
/// columns, batches of 7 that do not divide the windows), and a scaler too short for the
/// target columns refused.
#[test]
fn direction_accuracy_counts_the_signs_of_the_first_step() {
    use mamba2_burn::data::timeseries::Standardizer;
    use mamba2_burn::train::direction_accuracy;
    let data = sines(&["b".into(), "a".into()]);
    assert_eq!(data.test.target_columns(), [1, 0]);
    let dev = Default::default();
    let _rng = common::seeded(11);
    let model: Mamba2Forecaster<B> = config(2, 2, false, true).init(&dev).unwrap();
    let got = direction_accuracy(&model, &data.test, &data.scaler, 32, 7, &dev).unwrap();

    let batcher = WindowBatcher::new(32, 6);
    let (mut hits, mut counted) = (0usize, 0usize);
    let n = data.test.len();
    for start in (0..n).step_by(7) {
        let items: Vec<_> = (start..(start + 7).min(n))
            .filter_map(|i| data.test.get(i))
            .collect();
        let batch: ForecastBatch<B> = batcher.batch(items.clone(), &dev);
        // [rows, horizon 6, targets 2], row-major
        let predicted: Vec<f32> = model
            .forward(batch.inputs)
            .unwrap()
            .into_data()
            .to_vec()
            .unwrap();
        for (row, item) in items.iter().enumerate() {
            for (j, column) in [1usize, 0].into_iter().enumerate() {
                let (mean, std) = (data.scaler.mean[column], data.scaler.std[column]);
                let p = predicted[row * 12 + j] * std + mean;
                let a = item.target[j] * std + mean;
                if a != 0.0 {
                    counted += 1;
                    hits += usize::from((p > 0.0) == (a > 0.0));
                }
            }
        }
    }
    assert!(counted > 100, "{counted} values scored");
    assert_eq!(got, hits as f64 / counted as f64);

    let short = Standardizer {
        mean: vec![0.0],
        std: vec![1.0],
    };
    match direction_accuracy(&model, &data.test, &short, 32, 7, &dev) {
        Err(Mamba2Error::InvalidInput { name: "scaler", .. }) => {}
        other => panic!("expected a scaler error, got {other:?}"),
    }
}

/// After every observation, the streaming forecast equals the batch forward over the whole
/// history so far (relative tolerance 1e-5 of the forecast's magnitude), in both channel
/// modes; RevIN models and malformed observations are refused.
#[test]
fn streaming_forecaster_equals_batch_forward_at_every_step() {
    use mamba2_burn::StreamingForecaster;
    let dev = Default::default();
    let _rng = common::seeded(5);
    let mut worst: f64 = 0.0;
    for (ci, n_out) in [(true, 3), (false, 2)] {
        let model: Mamba2Forecaster<B> = config(3, n_out, false, ci).init(&dev).unwrap();
        let mut stream = StreamingForecaster::new(&model).unwrap();
        let t_len = 21; // beyond two chunks of 8
        let x = Tensor::<B, 3>::random([1, t_len, 3], Distribution::Normal(0.0, 1.0), &dev);
        let rows: Vec<f32> = x.clone().into_data().to_vec().unwrap();
        for t in 0..t_len {
            let got = stream.push(&rows[t * 3..(t + 1) * 3]).unwrap().to_vec();
            let expected: Vec<f32> = model
                .forward(x.clone().narrow(1, 0, t + 1))
                .unwrap()
                .into_data()
                .to_vec()
                .unwrap();
            assert_eq!(got.len(), expected.len());
            let scale = expected.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64;
            let err = got
                .iter()
                .zip(&expected)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs())) as f64;
            let rel = err / scale.max(1e-30);
            assert!(
                rel <= 1e-5,
                "channel_independent={ci}, step {t}: relative error {rel:.2e}"
            );
            worst = worst.max(rel);
        }
        assert_eq!(stream.observations(), t_len);
        assert!(matches!(
            stream.push(&[0.0; 4]),
            Err(Mamba2Error::Shape {
                name: "observation",
                ..
            })
        ));
        assert!(matches!(
            stream.push(&[0.0, f32::NAN, 0.0]),
            Err(Mamba2Error::InvalidInput {
                name: "observation",
                ..
            })
        ));
        // a reset starts a new history
        stream.reset();
        let first = stream.push(&rows[0..3]).unwrap().to_vec();
        let expected: Vec<f32> = model
            .forward(x.clone().narrow(1, 0, 1))
            .unwrap()
            .into_data()
            .to_vec()
            .unwrap();
        for (a, b) in first.iter().zip(&expected) {
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0));
        }
    }
    let with_revin: Mamba2Forecaster<B> = config(3, 3, true, true).init(&dev).unwrap();
    assert!(matches!(
        StreamingForecaster::new(&with_revin),
        Err(Mamba2Error::InvalidConfig { field: "revin", .. })
    ));
    eprintln!("streaming forecaster: worst relative error {worst:.2e}");
}

/// A whole `train_forecaster` run with the Learner: artifacts on disk, a test MSE below the
/// untrained model's, and the saved model reloads to the same forecasts.
#[test]
fn forecasting_run_writes_artifacts_and_reloads() {
    use mamba2_burn::train::{
        evaluate_forecaster, load_forecaster, train_forecaster, ForecastTrainingConfig,
        ProgressMode, RunConfig,
    };
    let dir = tempfile::tempdir().unwrap();
    let csv_path = dir.path().join("sines.csv");
    std::fs::write(&csv_path, sines_csv()).unwrap();
    let series = TimeSeries::from_csv(&csv_path).unwrap();
    let split = Split::Fractions {
        train: 0.7,
        test: 0.2,
    };
    let data = ForecastData::new(&series, &csv_path, &[], &[], 32, 6, split).unwrap();
    let dev = Default::default();
    let run = ForecastTrainingConfig::new(config(2, 2, true, true), 32)
        .with_run(RunConfig::new(3e-3).with_batch_size(16).with_epochs(2));
    // held through the run: `train_forecaster` seeds the generator with `run.run.seed` and draws
    let _rng = common::seeded(run.run.seed);
    let untrained: Mamba2Forecaster<B> = run.model.init(&dev).unwrap();
    let before = evaluate_forecaster(&untrained, &data.test, 32, 64, &dev).unwrap();
    let artifacts = dir.path().join("run");
    let model = train_forecaster::<A, _, _>(
        &run,
        data.train.clone(),
        data.valid.clone(),
        &artifacts,
        false,
        ProgressMode::Plain,
        &dev,
    )
    .unwrap();
    let after = evaluate_forecaster(&model, &data.test, 32, 64, &dev).unwrap();
    eprintln!(
        "forecasting run: test MSE {:.4} -> {:.4}",
        before.mse, after.mse
    );
    assert!(after.mse < 0.5 * before.mse, "{before:?} -> {after:?}");
    assert_eq!(after.windows, data.test.len());
    for file in [
        "config.json",
        "metrics.csv",
        "model/config.json",
        "model/model.mpk",
    ] {
        assert!(artifacts.join(file).is_file(), "missing {file}");
    }
    let (reloaded, _) = load_forecaster::<B>(&artifacts, &dev).unwrap();
    let again = evaluate_forecaster(&reloaded, &data.test, 32, 64, &dev).unwrap();
    assert!(
        (again.mse - after.mse).abs() <= 1e-6 * after.mse,
        "{again:?} vs {after:?}"
    );
    assert!(matches!(
        load_forecaster::<B>(dir.path().join("missing"), &dev),
        Err(Mamba2Error::File { .. })
    ));
}

/// Patches are the window's steps as documented: `patch_len` steps, `patch_stride` apart, the
/// last ending at the last step, each step's variables side by side; the flatten head reads
/// every token. Checked against the model's own layers applied to patches built on the host
/// (relative 1e-6: the same operations in the same order, on other but equal-valued inputs).
#[test]
fn patches_and_the_flatten_head_follow_the_documented_layout() {
    use mamba2_burn::ForecastHead;
    let dev = Default::default();
    let _rng = common::seeded(11);
    let lookback = 13; // stride 3, patch 5: 3 patches at steps 2..7, 5..10, 8..13
    let (len, stride, n) = (5, 3, 3);
    let x = Tensor::<B, 3>::random([2, lookback, 3], Distribution::Normal(0.0, 1.0), &dev);
    let rows: Vec<f32> = x.clone().into_data().to_vec().unwrap();
    for ci in [true, false] {
        let model: Mamba2Forecaster<B> = config(3, 3, false, ci)
            .with_patch_len(len)
            .with_patch_stride(Some(stride))
            .with_head(ForecastHead::Flatten)
            .with_lookback(Some(lookback))
            .init(&dev)
            .unwrap();
        let got = model.forward(x.clone()).unwrap();
        assert_eq!(got.dims(), [2, 6, 3]);
        // host-built tokens: [sequences, n, len · vars]
        let (seqs, vars) = if ci { (2 * 3, 1) } else { (2, 3) };
        let mut tokens = Vec::new();
        for s in 0..seqs {
            for p in 0..n {
                for t in 0..len {
                    let step = lookback - len - (n - 1 - p) * stride + t;
                    for v in 0..vars {
                        let (row, var) = if ci { (s / 3, s % 3) } else { (s, v) };
                        tokens.push(rows[(row * lookback + step) * 3 + var]);
                    }
                }
            }
        }
        let tokens = Tensor::<B, 3>::from_data(
            burn::tensor::TensorData::new(tokens, [seqs, n, len * vars]),
            &dev,
        );
        let (h, _) = model
            .backbone
            .forward(model.input.forward(tokens), None)
            .unwrap();
        let out = model.head.forward(h.reshape([seqs, n * 16]));
        let expected = if ci {
            out.reshape([2, 3, 6]).swap_dims(1, 2)
        } else {
            out.reshape([2, 6, 3])
        };
        let scale: f32 = expected.clone().abs().max().into_scalar();
        let err: f32 = (got - expected).abs().max().into_scalar();
        assert!(err <= 1e-6 * scale, "ci={ci}: error {err} of {scale}");
    }
}

/// Bad patch settings and windows are typed errors naming the field or input; a patched or
/// flatten-head model does not stream.
#[test]
fn patch_settings_are_checked() {
    use mamba2_burn::{ForecastHead, StreamingForecaster};
    let dev = Default::default();
    let _rng = common::seeded(12);
    let field = |c: Mamba2ForecasterConfig| match c.init::<B>(&dev) {
        Err(Mamba2Error::InvalidConfig { field, .. }) => field,
        other => panic!("expected InvalidConfig, got {other:?}"),
    };
    let base = || config(3, 3, true, true);
    assert_eq!(field(base().with_patch_len(0)), "patch_len");
    assert_eq!(
        field(base().with_patch_len(4).with_patch_stride(Some(5))),
        "patch_stride"
    );
    assert_eq!(
        field(base().with_patch_len(4).with_patch_stride(Some(0))),
        "patch_stride"
    );
    assert_eq!(field(base().with_head(ForecastHead::Flatten)), "lookback");
    assert_eq!(
        field(base().with_patch_len(8).with_lookback(Some(7))),
        "lookback"
    );
    assert_eq!(field(base().with_head_dropout(1.0)), "head_dropout");
    let flat: Mamba2Forecaster<B> = base()
        .with_patch_len(4)
        .with_patch_stride(Some(2))
        .with_head(ForecastHead::Flatten)
        .with_lookback(Some(16))
        .init(&dev)
        .unwrap();
    assert_eq!(
        flat.forward(Tensor::zeros([2, 16, 3], &dev))
            .unwrap()
            .dims(),
        [2, 6, 3]
    );
    assert!(matches!(
        flat.forward(Tensor::zeros([2, 15, 3], &dev)),
        Err(Mamba2Error::Shape { name: "x", .. })
    ));
    let last: Mamba2Forecaster<B> = base().with_patch_len(4).init(&dev).unwrap();
    assert!(matches!(
        last.forward(Tensor::zeros([2, 3, 3], &dev)),
        Err(Mamba2Error::Shape { name: "x", .. })
    ));
    assert_eq!(
        last.forward(Tensor::zeros([2, 9, 3], &dev)).unwrap().dims(),
        [2, 6, 3]
    );
    let unpatched_flat: Mamba2Forecaster<B> = config(3, 3, false, true)
        .with_head(ForecastHead::Flatten)
        .with_lookback(Some(8))
        .init(&dev)
        .unwrap();
    let patched: Mamba2Forecaster<B> = config(3, 3, false, true)
        .with_patch_len(2)
        .init(&dev)
        .unwrap();
    for (model, name) in [(&unpatched_flat, "head"), (&patched, "patch_len")] {
        match StreamingForecaster::new(model) {
            Err(Mamba2Error::InvalidConfig { field, .. }) => assert_eq!(field, name),
            other => panic!("expected InvalidConfig {name}, got {:?}", other.map(|_| ())),
        }
    }
}

/// Early stopping and the best epoch: with a learning rate of 0 no epoch improves on the
/// first, so a patience of 1 stops at the end of epoch 3 of 5 (epoch 2 brought no
/// improvement, and it is read once complete); with training on one series and validation on
/// faster oscillations, the validation loss is lowest at an early epoch, and the model
/// returned and saved is that epoch's checkpoint (kept besides the last two).
#[test]
fn forecasting_run_stops_early_and_keeps_the_best_epoch() {
    use mamba2_burn::checkpoint::load_module_record;
    use mamba2_burn::train::{
        evaluate_forecaster, train_forecaster, ForecastTrainingConfig, ProgressMode, RunConfig,
    };
    let dir = tempfile::tempdir().unwrap();
    let data = sines(&[]);
    let split = Split::Fractions {
        train: 0.7,
        test: 0.2,
    };
    // validation windows of faster oscillations than the training ones: the better the model
    // continues the training series, the worse it does on these after a point
    let mut fast = String::from("date,a,b\n");
    for t in 0..600 {
        let t = t as f32 * 3.1;
        fast.push_str(&format!("{t},{},{}\n", (t * 0.3).sin(), (t * 0.11).cos()));
    }
    let fast = TimeSeries::from_reader(fast.as_bytes(), Path::new("fast.csv")).unwrap();
    let valid = ForecastData::new(&fast, Path::new("fast.csv"), &[], &[], 32, 6, split)
        .unwrap()
        .valid;
    let dev = Default::default();
    let valid_losses = |artifacts: &Path| -> Vec<(usize, f64)> {
        std::fs::read_to_string(artifacts.join("metrics.csv"))
            .unwrap()
            .lines()
            .filter_map(|line| {
                let f: Vec<&str> = line.split(',').collect();
                (f.len() == 4 && f[1] == "valid" && f[2] == "Loss")
                    .then(|| (f[0].parse().unwrap(), f[3].parse().unwrap()))
            })
            .collect()
    };
    let model = config(2, 2, true, true)
        .with_patch_len(4)
        .with_patch_stride(Some(2));
    let run = |lr: f64, patience: Option<usize>, name: &str| {
        let run = ForecastTrainingConfig::new(model.clone(), 32)
            .with_run(RunConfig::new(lr).with_batch_size(16).with_epochs(5))
            .with_patience(patience);
        let _rng = common::seeded(run.run.seed);
        let artifacts = dir.path().join(name);
        let trained = train_forecaster::<A, _, _>(
            &run,
            data.train.clone(),
            valid.clone(),
            &artifacts,
            false,
            ProgressMode::Plain,
            &dev,
        )
        .unwrap();
        (trained, artifacts)
    };

    let (_, frozen) = run(0.0, Some(1), "frozen");
    let epochs: Vec<usize> = valid_losses(&frozen).iter().map(|(e, _)| *e).collect();
    assert_eq!(epochs, [1, 2, 3], "patience 1 without improvement");
    let kept = mamba2_burn::train::checkpoint_epochs(&frozen.join("checkpoint"));
    assert_eq!(kept, [1, 2, 3], "the best (1) and the last two");

    let (trained, artifacts) = run(3e-2, None, "trained");
    let losses = valid_losses(&artifacts);
    assert_eq!(losses.len(), 5);
    let best = losses
        .iter()
        .fold(losses[0], |b, &l| if l.1 < b.1 { l } else { b })
        .0;
    eprintln!("validation loss by epoch {losses:?}: best epoch {best}");
    // the case this test is for: the best epoch is not among the last two
    assert!(best <= 3, "best epoch {best}");
    let kept = mamba2_burn::train::checkpoint_epochs(&artifacts.join("checkpoint"));
    assert_eq!(kept, [best, 4, 5]);
    let fresh: Mamba2Forecaster<B> = model.init(&dev).unwrap();
    let checkpoint = artifacts.join("checkpoint").join(format!("model-{best}"));
    let best_model = load_module_record(fresh, checkpoint, &dev).unwrap();
    let got = evaluate_forecaster(&trained, &valid, 32, 64, &dev).unwrap();
    let want = evaluate_forecaster(&best_model, &valid, 32, 64, &dev).unwrap();
    assert_eq!(
        got, want,
        "the returned model is the best epoch's checkpoint"
    );
}

/// The training loss is the batch's: the MSE or the MAE of the flattened forecast, equal to
/// the same means taken on the host (relative 1e-6).
#[test]
fn forecast_batches_are_scored_with_their_loss() {
    use mamba2_burn::train::ForecastLoss;
    let dev = Default::default();
    let _rng = common::seeded(14);
    let model: Mamba2Forecaster<B> = config(2, 2, true, true).init(&dev).unwrap();
    let batch = ForecastBatch::<B> {
        inputs: Tensor::random([3, 20, 2], Distribution::Normal(0.0, 1.0), &dev),
        targets: Tensor::random([3, 6, 2], Distribution::Normal(0.0, 1.0), &dev),
        loss: ForecastLoss::Mse,
    };
    let forecast: Vec<f32> = model
        .forward(batch.inputs.clone())
        .unwrap()
        .into_data()
        .to_vec()
        .unwrap();
    let targets: Vec<f32> = batch.targets.clone().into_data().to_vec().unwrap();
    let n = forecast.len() as f64;
    let diffs = forecast.iter().zip(&targets).map(|(f, t)| (f - t) as f64);
    let mse = diffs.clone().map(|d| d * d).sum::<f64>() / n;
    let mae = diffs.map(f64::abs).sum::<f64>() / n;
    for (loss, want) in [(ForecastLoss::Mse, mse), (ForecastLoss::Mae, mae)] {
        let batch = ForecastBatch {
            loss,
            ..batch.clone()
        };
        let got = model.forward_forecast(&batch).loss.into_scalar() as f64;
        assert!(
            (got - want).abs() <= 1e-6 * want,
            "{loss:?}: {got} vs {want}"
        );
    }
}
