//! The forecasting tasks (a CSV series, DBN market data): their windows and run.

use std::time::Instant;

use burn::data::dataset::Dataset;
use mamba2_burn::data::timeseries::{ForecastData, Split, TimeSeries};
use mamba2_burn::train::{
    direction_accuracy, evaluate_forecaster, train_forecaster, ForecastLoss,
    ForecastTrainingConfig, RunConfig, TrainDevices,
};
use mamba2_burn::SsdAutodiffBackend;
use mamba2_burn::{ForecastHead, Mamba2ForecasterConfig};

use crate::args::{
    artifacts_dir, backbone_config, defaults, epochs_for, optimizer, progress_mode, step_threads,
    Args, HeadArg, LossArg, Task,
};

/// Forecasting: steps per token (patches overlap by half), dropout before the flatten head and
/// the early-stopping patience.
const FORECAST_PATCH_LEN: usize = 16;
const FORECAST_HEAD_DROPOUT: f64 = 0.3;
const FORECAST_PATIENCE: usize = 3;

/// The windows of a forecasting task and its description: a CSV series, or DBN market data.
fn windowed_data(args: &Args) -> Result<(ForecastData, String), Box<dyn std::error::Error>> {
    if args.task == Task::Market {
        return market_data(args);
    }
    let path = args
        .csv
        .as_ref()
        .ok_or("--task forecast needs --csv FILE")?;
    let series = TimeSeries::from_csv(path)?;
    let data = ForecastData::new(
        &series,
        path,
        &args.columns,
        &args.columns,
        args.lookback,
        args.horizon,
        Split::for_file(path),
    )?;
    let describe = format!(
        "{}: {} variables, lookback {}, horizon {}",
        path.display(),
        data.train.n_inputs(),
        args.lookback,
        args.horizon
    );
    Ok((data, describe))
}

#[cfg(feature = "dbn")]
fn market_data(args: &Args) -> Result<(ForecastData, String), Box<dyn std::error::Error>> {
    use mamba2_burn::data::market::{market_series, market_windows, MarketTarget};
    let interval_ns = args.interval_ms.saturating_mul(1_000_000);
    let all = market_series(&args.dbn, interval_ns)?;
    let (id, series) = match args.instrument {
        Some(id) => (
            id,
            all.get(&id)
                .ok_or_else(|| format!("instrument {id} is not in the files"))?,
        ),
        None => all
            .iter()
            .max_by_key(|(_, s)| s.len())
            .map(|(id, s)| (*id, s))
            .ok_or("the files hold no instrument")?,
    };
    let seq_len = args.seq_len.unwrap_or(60);
    let source = args
        .dbn
        .first()
        .ok_or("--task market needs --dbn FILE...")?;
    let data = market_windows(series, source, seq_len, MarketTarget::Return)?;
    let describe = format!(
        "instrument {id}: {} rows of {} ms, windows of {seq_len}",
        series.len(),
        args.interval_ms
    );
    Ok((data, describe))
}

#[cfg(not(feature = "dbn"))]
fn market_data(_: &Args) -> Result<(ForecastData, String), Box<dyn std::error::Error>> {
    Err("--task market needs the `dbn` feature: cargo run --release --features dbn --example train -- --task market --dbn FILE".into())
}

/// Trains a forecaster and prints its validation and test scores.
pub fn run<B: SsdAutodiffBackend>(
    args: &Args,
    devices: TrainDevices<B>,
) -> Result<(), Box<dyn std::error::Error>> {
    // the trained model comes back on the first device, where it is scored
    let device = devices.main().clone();
    let start = Instant::now();
    let d = defaults(args.task, args.preset);
    let (data, describe) = windowed_data(args)?;
    let market = args.task == Task::Market;
    let (lookback, horizon) = if market {
        (args.seq_len.unwrap_or(60), 1)
    } else {
        (args.lookback, args.horizon)
    };
    let n_vars = data.train.n_inputs();
    let n_targets = data.train.n_targets();
    let batch_size = args.batch_size.unwrap_or(d.batch_size);
    let epochs = epochs_for(args, &d, data.train.len(), batch_size);
    // market windows: five features in, one return out, so the variables mix and RevIN is off;
    // market models stream tick by tick, so one token per step and the last-token head
    let patch_len = args
        .patch_len
        .unwrap_or(if market { 1 } else { FORECAST_PATCH_LEN });
    let head = match args.head {
        Some(HeadArg::Flatten) => ForecastHead::Flatten,
        Some(HeadArg::Last) => ForecastHead::Last,
        None if market => ForecastHead::Last,
        None => ForecastHead::Flatten,
    };
    let model = Mamba2ForecasterConfig::new(n_vars, n_targets, horizon, backbone_config(args, &d)?)
        .with_revin(!args.no_revin && !market)
        .with_channel_independent(!args.channel_mixing && !market)
        .with_patch_len(patch_len)
        .with_patch_stride(Some(args.patch_stride.unwrap_or(patch_len.div_ceil(2))))
        .with_head(head)
        .with_lookback(Some(lookback))
        .with_head_dropout(args.head_dropout.unwrap_or(if market {
            0.0
        } else {
            FORECAST_HEAD_DROPOUT
        }));
    let patience = Some(args.patience.unwrap_or(FORECAST_PATIENCE)).filter(|&n| n > 0);
    let loss = match args.loss {
        Some(LossArg::Mse) => ForecastLoss::Mse,
        Some(LossArg::Mae) => ForecastLoss::Mae,
        None if market => ForecastLoss::Mse,
        None => ForecastLoss::Mae,
    };
    let config = ForecastTrainingConfig::new(model, lookback)
        .with_loss(loss)
        .with_patience(patience)
        .with_run(
            RunConfig::new(args.lr.unwrap_or(d.lr))
                .with_optimizer(optimizer(args))
                .with_batch_size(batch_size)
                .with_epochs(epochs)
                .with_seed(args.seed)
                .with_step_threads(step_threads(args))
                .with_mixed_precision(args.mixed_precision()),
        );
    let task_name = if market { "market" } else { "forecast" };
    let artifacts = artifacts_dir(args, task_name);
    println!(
        "task {task_name} ({describe}); {} / {} / {} windows, {epochs} epochs, batch {batch_size} on {} threads x {} devices; artifacts in {}",
        data.train.len(),
        data.valid.len(),
        data.test.len(),
        config.run.step_threads,
        args.devices,
        artifacts.display()
    );
    let model = train_forecaster::<B, _, _>(
        &config,
        data.train.clone(),
        data.valid.clone(),
        &artifacts,
        args.resume,
        progress_mode(args),
        devices,
    )?;
    let val = evaluate_forecaster(&model, &data.valid, lookback, 256, &device)?;
    let test = evaluate_forecaster(&model, &data.test, lookback, 256, &device)?;
    let extra = if market {
        // the share of test intervals whose move the model called
        format!(
            " direction_accuracy={:.4}",
            direction_accuracy(&model, &data.test, &data.scaler, lookback, 256, &device)?
        )
    } else {
        format!(" lookback={lookback} horizon={horizon}")
    };
    println!(
        "result: task={task_name} val_mse={:.4} val_mae={:.4} test_mse={:.4} test_mae={:.4}{extra} elapsed_s={:.1}",
        val.mse,
        val.mae,
        test.mse,
        test.mae,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
