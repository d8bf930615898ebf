//! The forecaster: shapes in both channel modes, RevIN's equivariance to per-window shift and
//! scale, config errors, and training through `TrainStep` on a CSV series.

use std::path::Path;

use burn::backend::{Autodiff, NdArray};
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::optim::Optimizer;
use burn::tensor::backend::Backend;
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
    B::seed(&dev, 3);
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

#[test]
fn training_steps_lower_the_forecast_error_on_a_csv_series() {
    // two noisy sinusoids, 600 hourly rows
    let mut csv = String::from("date,a,b\n");
    for t in 0..600 {
        let t = t as f32;
        csv.push_str(&format!(
            "{t},{},{}\n",
            (t * 0.3).sin() + 0.1 * (t * 1.7).sin(),
            (t * 0.11).cos()
        ));
    }
    let series = TimeSeries::from_reader(csv.as_bytes(), Path::new("sines.csv")).unwrap();
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
    A::seed(&dev, 5);
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
