//! A complete forecasting run with Burn's `SupervisedTraining` + `Learner`, sharing the run
//! machinery of [`train_lm`](super::train_lm) (resume, atomic checkpoints, the non-finite
//! guard, `metrics.csv`), and the held-out scores of a forecaster.

use crate::ssd::{SsdAutodiffBackend, SsdBackend};
use std::path::Path;

use burn::config::Config;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Tensor};
use burn::train::metric::LossMetric;

use super::batch::{ForecastBatch, ForecastLoss, WindowBatcher};
use super::config::{training_config_io, RunConfig};
use super::devices::TrainDevices;
use super::run::{best_valid_epoch, launch, ProgressMode, Run, RunData};
use super::stopping::{KeepBestAndLast, ValidLossStopping};
use crate::checkpoint::record::{load_module_record, save_config, save_record};
use crate::data::timeseries::{Standardizer, WindowDataset, WindowItem};
use crate::error::Mamba2Error;
use crate::models::forecaster::{Mamba2Forecaster, Mamba2ForecasterConfig};

/// Configuration of a forecasting run (saved as `config.json` in its artifacts).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ForecastTrainingConfig {
    /// The model.
    pub model: Mamba2ForecasterConfig,
    /// Steps per input window.
    pub lookback: usize,
    /// The optimizer, schedule, batch size (windows per batch), epochs, seed and threads.
    /// Default: `RunConfig::new(1e-3)` (peak learning rate 1e-3).
    pub run: RunConfig,
    /// The training loss (validation always reports the MSE). Default: MSE.
    pub loss: ForecastLoss,
    /// Stop when the validation loss has not improved for this many epochs (`None`: run every
    /// epoch; see [`ValidLossStopping`](super::ValidLossStopping)). Default: None.
    pub patience: Option<usize>,
    /// End with the weights of the epoch with the lowest validation loss instead of the last
    /// epoch's. Default: true.
    pub restore_best: bool,
}

/// The peak learning rate of a forecasting run unless set.
const DEFAULT_LR: f64 = 1e-3;

impl ForecastTrainingConfig {
    /// A run of `model` on windows of `lookback` steps, with the default settings.
    pub fn new(model: Mamba2ForecasterConfig, lookback: usize) -> Self {
        Self {
            model,
            lookback,
            run: RunConfig::new(DEFAULT_LR),
            loss: ForecastLoss::Mse,
            patience: None,
            restore_best: true,
        }
    }

    /// With these run settings.
    pub fn with_run(mut self, run: RunConfig) -> Self {
        self.run = run;
        self
    }

    /// With this training loss.
    pub fn with_loss(mut self, loss: ForecastLoss) -> Self {
        self.loss = loss;
        self
    }

    /// With early stopping after this many epochs without improvement (`None`: none).
    pub fn with_patience(mut self, patience: Option<usize>) -> Self {
        self.patience = patience;
        self
    }

    /// Ending with the best validation epoch's weights (`true`) or the last epoch's.
    pub fn with_restore_best(mut self, restore_best: bool) -> Self {
        self.restore_best = restore_best;
        self
    }
}

training_config_io!(ForecastTrainingConfig);

/// Trains a [`Mamba2Forecaster`] on the windows of `train` with the configured loss, validating
/// on `valid` (by the MSE) after every epoch, and leaves in `artifacts` what [`train_lm`](super::train_lm)
/// leaves (`config.json`, `checkpoint/`, `metrics.csv`, Burn's logs) with the final model in
/// `model/` (loadable with [`load_forecaster`]). `resume` and the non-finite guard work as
/// there. With `patience` the run stops early once the validation loss stops improving; with
/// `restore_best` the model returned and saved is the epoch with the lowest validation loss
/// (whose checkpoint is kept besides the last two: [`KeepBestAndLast`]).
///
/// `devices` is one device (`&device`) or several, as for [`train_lm`](super::train_lm).
pub fn train_forecaster<B, D, V>(
    config: &ForecastTrainingConfig,
    train: D,
    valid: V,
    artifacts: &Path,
    resume: bool,
    progress: ProgressMode,
    devices: impl Into<TrainDevices<B>>,
) -> crate::error::Result<Mamba2Forecaster<B::InnerBackend>>
where
    B: SsdAutodiffBackend,
    D: Dataset<WindowItem> + 'static,
    V: Dataset<WindowItem> + 'static,
{
    config.model.backbone.validate()?;
    // trained on the configured loss, validated (and stopped early) on the MSE
    let batcher = WindowBatcher::new(config.lookback, config.model.horizon);
    let data = RunData {
        train,
        valid,
        batcher: batcher.clone().with_loss(config.loss),
        valid_batcher: batcher,
        bucket: None,
    };
    let run = Run {
        config: &config.run,
        artifacts,
        resume,
        progress,
    };
    let init = |device: &B::Device| config.model.init::<B>(device);
    let devices = devices.into();
    let device = devices.main().clone();
    let mut model = launch(
        &run,
        config,
        init,
        data,
        devices,
        |training, start_epoch| {
            let retention = match start_epoch {
                Some(epoch) => KeepBestAndLast::resumed(artifacts, epoch),
                None => KeepBestAndLast::new(),
            };
            let training = training
                .metric_train_numeric(LossMetric::new())
                .metric_valid_numeric(LossMetric::new())
                .with_checkpointing_strategy(retention);
            match config.patience {
                Some(patience) => training.early_stopping(ValidLossStopping::new(patience)),
                None => training,
            }
        },
    )?;
    if config.restore_best {
        if let Some(epoch) = best_valid_epoch(artifacts, config.run.epochs) {
            let checkpoint = artifacts.join("checkpoint").join(format!("model-{epoch}"));
            model = load_module_record(model, checkpoint, &device)?;
        }
    }
    save_forecaster(&model, &config.model, artifacts.join("model"))?;
    Ok(model)
}

/// Writes `config.json` and `model.mpk` (full precision) into `dir`.
pub fn save_forecaster<B: Backend>(
    model: &Mamba2Forecaster<B>,
    config: &Mamba2ForecasterConfig,
    dir: impl AsRef<Path>,
) -> crate::error::Result<()> {
    let dir = dir.as_ref();
    std::fs::create_dir_all(dir).map_err(|e| Mamba2Error::file(dir, e))?;
    save_config(config, &dir.join("config.json"))?;
    save_record(model, dir.join("model"))
}

/// Loads a forecaster written by [`save_forecaster`] (or a run's `artifacts/model`; a run's
/// artifacts directory itself also works).
pub fn load_forecaster<B: Backend>(
    dir: impl AsRef<Path>,
    device: &B::Device,
) -> crate::error::Result<(Mamba2Forecaster<B>, Mamba2ForecasterConfig)> {
    let mut dir = dir.as_ref().to_path_buf();
    if !dir.join("model.mpk").exists() && dir.join("model").join("model.mpk").exists() {
        dir = dir.join("model");
    }
    let config_file = dir.join("config.json");
    let config = Mamba2ForecasterConfig::load(&config_file).map_err(|e| {
        Mamba2Error::file(
            &config_file,
            format!("not a readable forecaster config: {e}"),
        )
    })?;
    let model = config.init::<B>(device)?;
    let model = load_module_record(model, dir.join("model"), device)?;
    Ok((model, config))
}

/// Held-out scores of a forecaster, on the (standardised) scale of its data.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ForecastScores {
    /// Mean squared error over every window, step and target.
    pub mse: f64,
    /// Mean absolute error over every window, step and target.
    pub mae: f64,
    /// Windows scored.
    pub windows: usize,
}

/// Scores `model` on every window of `dataset`.
pub fn evaluate_forecaster<B: SsdBackend, D: Dataset<WindowItem>>(
    model: &Mamba2Forecaster<B>,
    dataset: &D,
    lookback: usize,
    batch_size: usize,
    device: &B::Device,
) -> crate::error::Result<ForecastScores> {
    let (mut se, mut ae, mut count) = (0.0f64, 0.0f64, 0usize);
    let n = dataset.len();
    if n == 0 {
        return Err(Mamba2Error::InvalidInput {
            name: "dataset",
            reason: "no windows to evaluate".into(),
        });
    }
    for batch in window_batches(dataset, lookback, model.horizon(), batch_size, device) {
        let error = model.forward(batch.inputs)? - batch.targets;
        count += error.shape().num_elements();
        se += error.clone().square().sum().into_scalar().elem::<f64>();
        ae += error.abs().sum().into_scalar().elem::<f64>();
    }
    Ok(ForecastScores {
        mse: se / count as f64,
        mae: ae / count as f64,
        windows: n,
    })
}

/// The share of forecasts with the right sign: for every window of `dataset` and every target,
/// whether the forecast of the next step and that step's actual value have the same sign on
/// the original scale (`scaler`, the data's standardisation, undone on the target columns).
/// Actual values of exactly 0 are not counted. For a series of returns, the share of moves
/// whose direction the model called.
pub fn direction_accuracy<B: SsdBackend>(
    model: &Mamba2Forecaster<B>,
    dataset: &WindowDataset,
    scaler: &Standardizer,
    lookback: usize,
    batch_size: usize,
    device: &B::Device,
) -> crate::error::Result<f64> {
    let columns = dataset.target_columns();
    let n_targets = columns.len();
    if let Some(&c) = columns.iter().find(|&&c| c >= scaler.mean.len()) {
        return Err(Mamba2Error::InvalidInput {
            name: "scaler",
            reason: format!(
                "has {} columns, the dataset's targets include column {c}",
                scaler.mean.len()
            ),
        });
    }
    let (mut hits, mut counted) = (0usize, 0usize);
    for batch in window_batches(dataset, lookback, model.horizon(), batch_size, device) {
        let [b, _, _] = batch.targets.dims();
        // the first forecast step: [b, n_targets]
        let first = |t: Tensor<B, 3>| -> Vec<f32> {
            t.narrow(1, 0, 1)
                .reshape([b * n_targets])
                .into_data()
                .convert::<f32>()
                .to_vec()
                .expect("f32 data after convert")
        };
        let predicted = first(model.forward(batch.inputs)?);
        let actual = first(batch.targets);
        for (i, (p, a)) in predicted.iter().zip(&actual).enumerate() {
            let column = columns[i % n_targets];
            let (mean, std) = (scaler.mean[column], scaler.std[column]);
            let (p, a) = (p * std + mean, a * std + mean);
            if a != 0.0 {
                counted += 1;
                hits += usize::from((p > 0.0) == (a > 0.0));
            }
        }
    }
    if counted == 0 {
        return Err(Mamba2Error::InvalidInput {
            name: "dataset",
            reason: "no window with a nonzero actual value to score".into(),
        });
    }
    Ok(hits as f64 / counted as f64)
}

/// The windows of `dataset` in order, as batches of `batch_size` (at least 1) with `horizon`
/// target steps.
fn window_batches<'a, B: SsdBackend, D: Dataset<WindowItem>>(
    dataset: &'a D,
    lookback: usize,
    horizon: usize,
    batch_size: usize,
    device: &'a B::Device,
) -> impl Iterator<Item = ForecastBatch<B>> + 'a {
    let batcher = WindowBatcher::new(lookback, horizon);
    let (n, size) = (dataset.len(), batch_size.max(1));
    (0..n).step_by(size).map(move |start| {
        let items: Vec<WindowItem> = (start..(start + size).min(n))
            .filter_map(|i| dataset.get(i))
            .collect();
        batcher.batch(items, device)
    })
}
