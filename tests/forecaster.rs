//! The forecaster: shapes in both channel modes, RevIN's equivariance to per-window shift and
//! scale, config errors, and training through `TrainStep` on a CSV series.

mod common;

use std::path::Path;

use burn::backend::{Autodiff, NdArray};
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::optim::Optimizer;
use burn::tensor::{Distribution, Tensor};
use burn::train::TrainStep;
use mamba2_burn::data::timeseries::{ForecastData, Split, TimeSeries, WindowBatcher};
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

#[test]
fn training_steps_lower_the_forecast_error_on_a_csv_series() {
    let series = TimeSeries::from_reader(sines_csv().as_bytes(), Path::new("sines.csv")).unwrap();
    let data = ForecastData::new(
        &series,
        Path::new("sines.csv"),
        &[],
        &[],
        32,
        6,
        Split::Fractions {
            train: 0.7,
            test: 0.2,
        },
    )
    .unwrap();
    let dev = Default::default();
    let _rng = common::seeded(5);
    let mut model: Mamba2Forecaster<A> = config(2, 2, true, true).init(&dev).unwrap();
    let mut optim =
        Mamba2OptimizerConfig::new().init::<A, Mamba2Forecaster<A>>(NonFiniteGuard::default());
    let batcher = WindowBatcher {
        lookback: 32,
        horizon: 6,
    };
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
        ProgressMode,
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
        .with_lr(3e-3)
        .with_batch_size(16)
        .with_epochs(2);
    // held through the run: `train_forecaster` seeds the generator with `run.seed` and draws
    let _rng = common::seeded(run.seed);
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
