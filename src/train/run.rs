//! A complete training run of any of the models with Burn's `SupervisedTraining` + `Learner`:
//! data loaders, the schedule, atomic checkpoints, resume, progress, the non-finite guard, and
//! the artifacts a run leaves behind. The task's runs (`lm`, `forecast`) add their data and
//! metrics.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::config::Config;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::module::{AutodiffModule, ModuleDisplay};
use burn::tensor::backend::AutodiffBackend;
use burn::train::metric::{ItemLazy, LearningRateMetric};
use burn::train::{Learner, LearningComponentsMarker, SupervisedTraining};

use super::config::RunConfig;
use super::devices::TrainDevices;
use super::optim::{Mamba2Optimizer, NonFiniteGuard};
use super::progress::PlainProgress;
use super::schedule::WarmupCosineLr;
use super::step::SupervisedModel;
use super::threaded::Threaded;
use crate::data::loader::{BucketKey, EpochLoader};
use crate::error::Mamba2Error;

/// How progress is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgressMode {
    /// Burn's TUI on a terminal, plain lines otherwise.
    Auto,
    /// Plain lines.
    Plain,
}

/// The epochs that have a complete checkpoint (model, optimizer and scheduler) in `dir`.
pub fn checkpoint_epochs(dir: &Path) -> Vec<usize> {
    let epochs_of = |prefix: &str| -> Vec<usize> {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().to_string();
                name.strip_prefix(prefix)?
                    .strip_suffix(".mpk")?
                    .parse()
                    .ok()
            })
            .collect()
    };
    let optim = epochs_of("optim-");
    let scheduler = epochs_of("scheduler-");
    let mut epochs: Vec<usize> = epochs_of("model-")
        .into_iter()
        .filter(|e| optim.contains(e) && scheduler.contains(e))
        .collect();
    epochs.sort_unstable();
    epochs
}

/// Mean of each metric per epoch and split, from the logs Burn's file logger writes
/// (`<split>/epoch-<n>/<Metric>.log`, lines of `value,count`): `(epoch, split, metric, mean)`
/// in epoch, split and metric order.
fn epoch_means(artifacts: &Path, epochs: usize) -> Vec<(usize, &'static str, String, f64)> {
    let mut out = Vec::new();
    for epoch in 1..=epochs {
        for split in ["train", "valid"] {
            let dir = artifacts.join(split).join(format!("epoch-{epoch}"));
            let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
                .into_iter()
                .flatten()
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "log"))
                .collect();
            files.sort();
            for file in files {
                let Ok(text) = std::fs::read_to_string(&file) else {
                    continue;
                };
                let (mut sum, mut count) = (0.0f64, 0.0f64);
                for line in text.lines() {
                    let mut parts = line.split(',');
                    let value = parts.next().and_then(|v| v.trim().parse::<f64>().ok());
                    let weight = parts
                        .next()
                        .and_then(|c| c.trim().parse::<f64>().ok())
                        .unwrap_or(1.0);
                    if let Some(v) = value {
                        sum += v * weight;
                        count += weight;
                    }
                }
                if count > 0.0 {
                    let name = file.file_stem().unwrap_or_default().to_string_lossy();
                    out.push((epoch, split, name.to_string(), sum / count));
                }
            }
        }
    }
    out
}

/// Each metric's mean per epoch and split as CSV `epoch,split,metric,value`.
fn metrics_csv(artifacts: &Path, epochs: usize) -> String {
    let mut out = String::from("epoch,split,metric,value\n");
    for (epoch, split, name, value) in epoch_means(artifacts, epochs) {
        out.push_str(&format!("{epoch},{split},{name},{value}\n"));
    }
    out
}

/// The epoch among `keep` with the lowest finite mean validation loss in the logs (the first of
/// equal ones) and that loss, if any.
fn lowest_valid_loss(
    artifacts: &Path,
    epochs: usize,
    keep: impl Fn(usize) -> bool,
) -> Option<(usize, f64)> {
    epoch_means(artifacts, epochs)
        .into_iter()
        .filter(|(e, split, name, v)| {
            *split == "valid" && name == "Loss" && v.is_finite() && keep(*e)
        })
        .fold(
            None,
            |best: Option<(usize, f64)>, (e, _, _, v)| match best {
                Some((_, b)) if b <= v => best,
                _ => Some((e, v)),
            },
        )
}

/// The epoch with the lowest mean validation loss in the logs, and that loss.
pub(crate) fn best_valid_loss(artifacts: &Path, epochs: usize) -> Option<(usize, f64)> {
    lowest_valid_loss(artifacts, epochs, |_| true)
}

/// The epoch with the lowest mean validation loss that has a complete checkpoint, if any.
pub(crate) fn best_valid_epoch(artifacts: &Path, epochs: usize) -> Option<usize> {
    let saved = checkpoint_epochs(&artifacts.join("checkpoint"));
    lowest_valid_loss(artifacts, epochs, |e| saved.contains(&e)).map(|(e, _)| e)
}

/// Checks a run's sizes, creates its artifacts directory, compares the config with the saved
/// one on resume, and writes it: returns the epoch to resume from.
fn prepare_run<C: Config + std::fmt::Display>(
    config: &C,
    batch_size: usize,
    epochs: usize,
    sizes: (usize, usize),
    artifacts: &Path,
    resume: bool,
) -> crate::error::Result<Option<usize>> {
    if batch_size == 0 || epochs == 0 {
        return Err(Mamba2Error::config(
            "batch_size",
            format!("batch_size and epochs must be at least 1, got {batch_size} and {epochs}"),
        ));
    }
    if sizes.0 == 0 || sizes.1 == 0 {
        return Err(Mamba2Error::InvalidInput {
            name: "dataset",
            reason: format!(
                "training and validation sets must not be empty ({} and {} items)",
                sizes.0, sizes.1
            ),
        });
    }
    std::fs::create_dir_all(artifacts).map_err(|e| {
        Mamba2Error::file(
            artifacts,
            format!("cannot create the artifacts directory: {e}"),
        )
    })?;
    let config_file = artifacts.join("config.json");
    let checkpoint_dir = artifacts.join("checkpoint");
    let start_epoch = if resume {
        let saved = C::load(&config_file).map_err(|e| {
            Mamba2Error::file(
                &config_file,
                format!("cannot resume, no readable run config: {e}"),
            )
        })?;
        if saved.to_string() != config.to_string() {
            return Err(Mamba2Error::file(
                &config_file,
                "cannot resume: this run's config differs from the saved one",
            ));
        }
        match checkpoint_epochs(&checkpoint_dir).last() {
            Some(&e) => Some(e),
            None => {
                return Err(Mamba2Error::file(
                    &checkpoint_dir,
                    "cannot resume: no complete checkpoint",
                ))
            }
        }
    } else {
        None
    };
    // atomically: a run killed while writing it, on resume, must find the old config or the
    // new one, never a part (resume refuses a run whose config it cannot read)
    crate::checkpoint::record::save_config(config, &config_file)?;
    Ok(start_epoch)
}

/// The training loader (shuffled per epoch from `seed`, starting at `start_epoch`, batched
/// apart by `bucket` when given) and the validation loader (in order, batched by
/// `valid_batcher`).
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
fn loaders<B, I, O, OV, D, V, T>(
    train: D,
    valid: V,
    batcher: T,
    valid_batcher: T,
    batch_size: usize,
    seed: u64,
    start_epoch: Option<usize>,
    bucket: Option<BucketKey<I>>,
    device: &B::Device,
) -> (
    Arc<EpochLoader<B, I, O>>,
    Arc<EpochLoader<B::InnerBackend, I, OV>>,
)
where
    B: AutodiffBackend,
    D: Dataset<I> + 'static,
    V: Dataset<I> + 'static,
    T: Batcher<B, I, O> + Batcher<B::InnerBackend, I, OV> + Clone + 'static,
{
    let mut dl_train = EpochLoader::new(
        Arc::new(train),
        Arc::new(batcher.clone()),
        batch_size,
        Some(seed),
        device.clone(),
    )
    .start_at_epoch(start_epoch.unwrap_or(0));
    if let Some(key) = bucket {
        dl_train = dl_train.with_buckets(key);
    }
    let dl_valid = EpochLoader::<B::InnerBackend, _, _>::new(
        Arc::new(valid),
        Arc::new(valid_batcher),
        batch_size,
        None,
        device.clone(),
    );
    (Arc::new(dl_train), Arc::new(dl_valid))
}

/// After `launch`: the non-finite error if the guard tripped (naming the last checkpoint
/// before the bad step), else `metrics.csv`.
fn finish_run(
    guard: &NonFiniteGuard,
    artifacts: &Path,
    steps_per_epoch: usize,
    epochs: usize,
) -> crate::error::Result<()> {
    let checkpoint_dir = artifacts.join("checkpoint");
    if let Some(step) = guard.tripped_at() {
        let checkpoint = checkpoint_epochs(&checkpoint_dir)
            .into_iter()
            .rfind(|e| e * steps_per_epoch < step)
            .map(|e| checkpoint_dir.join(format!("model-{e}.mpk")));
        return Err(Mamba2Error::NonFiniteLoss { step, checkpoint });
    }
    let metrics_file = artifacts.join("metrics.csv");
    std::fs::write(&metrics_file, metrics_csv(artifacts, epochs))
        .map_err(|e| Mamba2Error::file(&metrics_file, format!("cannot write: {e}")))
}

/// Plain progress lines unless `progress` is `Auto` and stdout is a terminal.
fn plain_progress(progress: ProgressMode) -> bool {
    progress == ProgressMode::Plain || !std::io::stdout().is_terminal()
}

/// A training run: its settings, where it writes, whether it resumes, how it shows progress.
pub(crate) struct Run<'a> {
    pub config: &'a RunConfig,
    pub artifacts: &'a Path,
    pub resume: bool,
    pub progress: ProgressMode,
}

/// A run's data: the training and validation sets, their batchers (validation may score
/// another loss), and the key that batches training items apart (items of one key per batch).
pub(crate) struct RunData<D, V, T, I> {
    pub train: D,
    pub valid: V,
    pub batcher: T,
    pub valid_batcher: T,
    pub bucket: Option<BucketKey<I>>,
}

/// The Learner's components in a run: the model spread over the run's threads, the warmup +
/// cosine schedule and the crate's optimizer.
pub(crate) type RunComponents<B, M> =
    LearningComponentsMarker<B, WarmupCosineLr, Threaded<B, M>, Mamba2Optimizer<Threaded<B, M>, B>>;

/// The one training run of this crate, for any of its models: checks the sizes, writes (or on
/// resume compares) `config` as `config.json`, seeds the generator and builds the model with
/// `init`, loads the data (shuffled per epoch from the seed, continuing at the resumed epoch),
/// and launches Burn's `Learner` on `devices` (Burn's strategy for them) with the learning-rate metric, atomic checkpoints, plain or
/// TUI progress, resume, the schedule over every step, the non-finite guard and the optimizer.
/// `configure` adds the run's metrics (its loss among them: a metric reads the output type's
/// synced form, which only the caller names) and strategies, given the resumed epoch. Returns
/// the trained model, or the non-finite error ([`finish_run`]).
#[allow(clippy::type_complexity)]
pub(crate) fn launch<B, M, C, I, D, V, T>(
    run: &Run<'_>,
    config: &C,
    init: impl FnOnce(&B::Device) -> crate::error::Result<M>,
    data: RunData<D, V, T, I>,
    devices: TrainDevices<B>,
    configure: impl FnOnce(
        SupervisedTraining<RunComponents<B, M>>,
        Option<usize>,
    ) -> SupervisedTraining<RunComponents<B, M>>,
) -> crate::error::Result<M::InnerModule>
where
    B: AutodiffBackend,
    C: Config + std::fmt::Display,
    I: Send + Sync + 'static,
    D: Dataset<I> + 'static,
    V: Dataset<I> + 'static,
    T: Batcher<B, I, M::Batch> + Batcher<B::InnerBackend, I, InnerBatch<B, M>> + Clone + 'static,
    M: SupervisedModel<B> + AutodiffModule<B> + ModuleDisplay + Send + 'static,
    M::InnerModule: SupervisedModel<B::InnerBackend> + ModuleDisplay,
    M::Batch: 'static,
    M::Output: ItemLazy + 'static,
    InnerBatch<B, M>: 'static,
    InnerOutput<B, M>: ItemLazy + 'static,
{
    let settings = run.config;
    let sizes = (data.train.len(), data.valid.len());
    let start_epoch = prepare_run(
        config,
        settings.batch_size,
        settings.epochs,
        sizes,
        run.artifacts,
        run.resume,
    )?;
    let placement = devices.placement();
    if !placement.threads_allowed && settings.step_threads > 1 {
        return Err(Mamba2Error::config(
            "step_threads",
            format!(
                "must be 1 with distributed data parallel training (one thread per device), got {}",
                settings.step_threads
            ),
        ));
    }
    let device = &placement.main;
    B::seed(device, settings.seed);
    let model = Threaded::new(init(device)?, settings.step_threads)
        .with_replicas(placement.replicas)
        .with_mixed_precision(settings.mixed_precision);
    let (dl_train, dl_valid) = loaders::<B, _, _, _, _, _, _>(
        data.train,
        data.valid,
        data.batcher,
        data.valid_batcher,
        settings.batch_size,
        settings.seed,
        start_epoch,
        data.bucket,
        device,
    );
    // optimizer steps: each takes one batch of every device's share of the training set
    let steps_per_epoch = dl_train.batches_per_epoch_in_shares(placement.shares);
    let scheduler = WarmupCosineLr::from_fractions(
        settings.lr,
        settings.min_lr_ratio,
        settings.warmup_fraction,
        steps_per_epoch * placement.lr_steps_per_step * settings.epochs,
    );
    let mut training = SupervisedTraining::new(run.artifacts, dl_train, dl_valid)
        .metric_train_numeric(LearningRateMetric::new())
        .with_file_checkpointer(crate::checkpoint::record::CheckpointRecorder::default())
        .num_epochs(settings.epochs);
    if plain_progress(run.progress) {
        training = training.renderer(PlainProgress::new(4));
    }
    if let Some(epoch) = start_epoch {
        training = training.checkpoint(epoch);
    }
    if let Some(strategy) = placement.strategy {
        training = training.with_training_strategy(strategy.into());
    }
    let training = configure(training, start_epoch);
    let guard = NonFiniteGuard::new(Some(training.interrupter()));
    let optimizer = settings.optimizer.init::<B, Threaded<B, M>>(guard.clone());
    let result = training.launch(Learner::new(model, optimizer, scheduler));
    finish_run(&guard, run.artifacts, steps_per_epoch, settings.epochs)?;
    Ok(result.model.into_inner())
}

/// The batch of a model's inference form.
pub(crate) type InnerBatch<B, M> = <<M as AutodiffModule<B>>::InnerModule as SupervisedModel<
    <B as AutodiffBackend>::InnerBackend,
>>::Batch;

/// The step output of a model's inference form.
pub(crate) type InnerOutput<B, M> = <<M as AutodiffModule<B>>::InnerModule as SupervisedModel<
    <B as AutodiffBackend>::InnerBackend,
>>::Output;
