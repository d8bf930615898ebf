//! A complete training run of the language model with Burn's `SupervisedTraining` + `Learner`:
//! data loaders, metrics, atomic checkpoints, resume, progress, the non-finite guard, and the
//! artifacts a run leaves behind.

use crate::{SsdAutodiffBackend, SsdBackend};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::config::Config;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::module::{AutodiffModule, ModuleDisplay};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ElementConversion;
use burn::train::metric::{
    AccuracyMetric, ItemLazy, LearningRateMetric, LossMetric, PerplexityMetric,
};
use burn::train::{Learner, LearningComponentsMarker, SupervisedTraining};

use super::{
    Mamba2Optimizer, Mamba2OptimizerConfig, NonFiniteGuard, PlainProgress, SupervisedModel,
    Threaded, WarmupCosineLr,
};
use crate::checkpoint::save_lm;
use crate::data::loader::{BucketKey, EpochLoader};
use crate::data::{SequenceBatcher, SequenceItem};
use crate::error::Mamba2Error;
use crate::lm::check_in_vocab;
use crate::lm::{Mamba2Lm, Mamba2LmConfig};

/// Configuration of a language-model training run (saved as `config.json` in its artifacts).
#[derive(Config, Debug)]
pub struct LmTrainingConfig {
    /// The model.
    pub model: Mamba2LmConfig,
    /// The optimizer.
    #[config(default = "Mamba2OptimizerConfig::new()")]
    pub optimizer: Mamba2OptimizerConfig,
    /// Peak learning rate. Default: 3e-3.
    #[config(default = 3e-3)]
    pub lr: f64,
    /// Final learning rate, as a fraction of the peak. Default: 0.1.
    #[config(default = 0.1)]
    pub min_lr_ratio: f64,
    /// Warmup length, as a fraction of all steps. Default: 0.05.
    #[config(default = 0.05)]
    pub warmup_fraction: f64,
    /// Sequences per batch. Default: 32.
    #[config(default = 32)]
    pub batch_size: usize,
    /// Passes over the training set. Default: 10.
    #[config(default = 10)]
    pub epochs: usize,
    /// Seed of the weights and the data order. Default: 42.
    #[config(default = 42)]
    pub seed: u64,
    /// Target id of unscored positions (`None`: all positions are scored).
    pub ignore_index: Option<usize>,
    /// Threads each training step spreads its batch over (same gradient as one thread; see
    /// [`Threaded`]). Worth the cores of a CPU backend; 1 on a GPU.
    /// Default: 1.
    #[config(default = 1)]
    pub step_threads: usize,
}

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
) -> crate::Result<Option<usize>> {
    if batch_size == 0 || epochs == 0 {
        return Err(Mamba2Error::InvalidConfig {
            field: "batch_size",
            reason: format!(
                "batch_size and epochs must be at least 1, got {batch_size} and {epochs}"
            ),
        });
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
    config
        .save(&config_file)
        .map_err(|e| Mamba2Error::file(&config_file, format!("cannot write: {e}")))?;
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
    T: burn::data::dataloader::batcher::Batcher<B, I, O>
        + burn::data::dataloader::batcher::Batcher<B::InnerBackend, I, OV>
        + Clone
        + 'static,
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
) -> crate::Result<()> {
    let checkpoint_dir = artifacts.join("checkpoint");
    if let Some(step) = guard.tripped_at() {
        let checkpoint = checkpoint_epochs(&checkpoint_dir)
            .into_iter()
            .filter(|e| e * steps_per_epoch < step)
            .next_back()
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

/// What every training run of this crate shares: its schedule, its threads, its data order
/// and where it writes ([`run_of`] takes them from a run config).
pub(crate) struct Run<'a> {
    pub optimizer: &'a Mamba2OptimizerConfig,
    pub lr: f64,
    pub min_lr_ratio: f64,
    pub warmup_fraction: f64,
    pub batch_size: usize,
    pub epochs: usize,
    pub seed: u64,
    pub step_threads: usize,
    pub artifacts: &'a Path,
    pub resume: bool,
    pub progress: ProgressMode,
}

/// The [`Run`] of a run config (the fields both run configs name alike), its artifacts
/// directory, resume flag and progress mode.
macro_rules! run_of {
    ($config:expr, $artifacts:expr, $resume:expr, $progress:expr) => {
        $crate::train::runner::Run {
            optimizer: &$config.optimizer,
            lr: $config.lr,
            min_lr_ratio: $config.min_lr_ratio,
            warmup_fraction: $config.warmup_fraction,
            batch_size: $config.batch_size,
            epochs: $config.epochs,
            seed: $config.seed,
            step_threads: $config.step_threads,
            artifacts: $artifacts,
            resume: $resume,
            progress: $progress,
        }
    };
}
pub(crate) use run_of;

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
/// and launches Burn's `Learner` with the learning-rate metric, atomic checkpoints, plain or
/// TUI progress, resume, the schedule over every step, the non-finite guard and the optimizer.
/// `configure` adds the run's metrics (its loss among them: a metric reads the output type's
/// synced form, which only the caller names) and strategies, given the resumed epoch. Returns
/// the trained model, or the non-finite error ([`finish_run`]).
#[allow(clippy::type_complexity)]
pub(crate) fn launch<B, M, C, I, D, V, T>(
    run: &Run<'_>,
    config: &C,
    init: impl FnOnce(&B::Device) -> crate::Result<M>,
    data: RunData<D, V, T, I>,
    device: &B::Device,
    configure: impl FnOnce(
        SupervisedTraining<RunComponents<B, M>>,
        Option<usize>,
    ) -> SupervisedTraining<RunComponents<B, M>>,
) -> crate::Result<M::InnerModule>
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
    let sizes = (data.train.len(), data.valid.len());
    let start_epoch = prepare_run(
        config,
        run.batch_size,
        run.epochs,
        sizes,
        run.artifacts,
        run.resume,
    )?;
    B::seed(device, run.seed);
    let model = Threaded::new(init(device)?, run.step_threads);
    let (dl_train, dl_valid) = loaders::<B, _, _, _, _, _, _>(
        data.train,
        data.valid,
        data.batcher,
        data.valid_batcher,
        run.batch_size,
        run.seed,
        start_epoch,
        data.bucket,
        device,
    );
    let steps_per_epoch = dl_train.batches_per_epoch();
    let scheduler = WarmupCosineLr::from_fractions(
        run.lr,
        run.min_lr_ratio,
        run.warmup_fraction,
        steps_per_epoch * run.epochs,
    );
    let mut training = SupervisedTraining::new(run.artifacts, dl_train, dl_valid)
        .metric_train_numeric(LearningRateMetric::new())
        .with_file_checkpointer(crate::CheckpointRecorder::default())
        .num_epochs(run.epochs);
    if plain_progress(run.progress) {
        training = training.renderer(PlainProgress::new(4));
    }
    if let Some(epoch) = start_epoch {
        training = training.checkpoint(epoch);
    }
    let training = configure(training, start_epoch);
    let guard = NonFiniteGuard::new(Some(training.interrupter()));
    let optimizer = run.optimizer.init::<B, Threaded<B, M>>(guard.clone());
    let result = training.launch(Learner::new(model, optimizer, scheduler));
    finish_run(&guard, run.artifacts, steps_per_epoch, run.epochs)?;
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

/// Trains a [`Mamba2Lm`] on `train`, validating on `valid` after every epoch, and leaves in
/// `artifacts`: `config.json` (this config), `checkpoint/` (model, optimizer and scheduler
/// after each epoch, written atomically), `model/` (the final model, loadable with
/// [`load_lm`](crate::load_lm)), `metrics.csv` (each metric's mean per epoch and split) and
/// Burn's per-iteration logs.
///
/// With `resume`, the run continues from the last complete checkpoint in `artifacts` (with the
/// same data order as an uninterrupted run, so it ends with the same weights); the config must
/// be the one the run started with.
///
/// A NaN or infinite loss stops the run before the bad update is applied, with
/// [`Mamba2Error::NonFiniteLoss`] naming the step and the last good checkpoint.
pub fn train_lm<B, D, V>(
    config: &LmTrainingConfig,
    train: D,
    valid: V,
    artifacts: &Path,
    resume: bool,
    progress: ProgressMode,
    device: &B::Device,
) -> crate::Result<Mamba2Lm<B::InnerBackend>>
where
    B: SsdAutodiffBackend,
    D: Dataset<SequenceItem> + 'static,
    V: Dataset<SequenceItem> + 'static,
{
    config.model.validate()?;
    // token ids are checked here, on the host, once: the model's forward does not read them back
    let vocab = config.model.padded_vocab_size();
    check_sequence_tokens(&train, "train data", vocab, config.ignore_index)?;
    check_sequence_tokens(&valid, "validation data", vocab, config.ignore_index)?;
    let accuracy = || match config.ignore_index {
        Some(i) => AccuracyMetric::new().with_pad_token(i),
        None => AccuracyMetric::new(),
    };
    let perplexity = || match config.ignore_index {
        Some(i) => PerplexityMetric::new().with_pad_token(i),
        None => PerplexityMetric::new(),
    };
    let batcher = SequenceBatcher {
        ignore_index: config.ignore_index,
    };
    let data = RunData {
        train,
        valid,
        batcher: batcher.clone(),
        valid_batcher: batcher,
        // sequences of different lengths (a mixed training set) are batched apart
        bucket: Some(Arc::new(|item: &SequenceItem| item.input.len())),
    };
    let run = run_of!(config, artifacts, resume, progress);
    let init = |device: &B::Device| config.model.init::<B>(device);
    let model = launch(&run, config, init, data, device, |training, _| {
        training
            .metric_train_numeric(LossMetric::new())
            .metric_valid_numeric(LossMetric::new())
            .metric_train_numeric(accuracy())
            .metric_valid_numeric(accuracy())
            .metric_valid_numeric(perplexity())
    })?;
    save_lm(&model, &config.model, artifacts.join("model"))?;
    Ok(model)
}

/// Checks every item of `data`: inputs in `[0, vocab)`, targets too or equal to `ignore_index`.
fn check_sequence_tokens<D: Dataset<SequenceItem>>(
    data: &D,
    name: &'static str,
    vocab: usize,
    ignore_index: Option<usize>,
) -> crate::Result<()> {
    let ignore = ignore_index.map(|i| i as i64);
    for i in 0..data.len() {
        let Some(item) = data.get(i) else { continue };
        check_in_vocab(&item.input, vocab, None, name)
            .and_then(|()| check_in_vocab(&item.target, vocab, ignore, name))
            .map_err(|e| match e {
                Mamba2Error::InvalidInput { name, reason } => Mamba2Error::InvalidInput {
                    name,
                    reason: format!("item {i}: {reason}"),
                },
                other => other,
            })?;
    }
    Ok(())
}

/// Held-out scores of a language model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LmScores {
    /// Mean cross-entropy (nats) over the scored positions.
    pub loss: f64,
    /// `exp(loss)`.
    pub perplexity: f64,
    /// Fraction of scored positions whose most likely token is the target.
    pub accuracy: f64,
    /// Scored positions.
    pub count: usize,
}

/// Scores `model` on every item of `dataset` (positions whose target is `ignore_index` are not
/// scored), its batches spread over `threads` threads.
pub fn evaluate_lm<B: SsdBackend, D: Dataset<SequenceItem>>(
    model: &Mamba2Lm<B>,
    dataset: &D,
    batch_size: usize,
    ignore_index: Option<usize>,
    threads: usize,
    device: &B::Device,
) -> crate::Result<LmScores> {
    let n = dataset.len();
    let batch_size = batch_size.max(1);
    let batches: Vec<Vec<SequenceItem>> = (0..n)
        .step_by(batch_size)
        .map(|start| {
            (start..(start + batch_size).min(n))
                .filter_map(|i| dataset.get(i))
                .collect()
        })
        .collect();
    // contiguous runs of batches, one per thread
    let mut batches = batches.into_iter();
    let groups: Vec<(Mamba2Lm<B>, Vec<Vec<SequenceItem>>)> =
        super::split_rows(batches.len(), threads)
            .into_iter()
            .map(|(_, len)| (model.clone(), batches.by_ref().take(len).collect()))
            .collect();
    let add =
        |(n1, c1, k1): (f64, i64, i64), (n2, c2, k2): (f64, i64, i64)| (n1 + n2, c1 + c2, k1 + k2);
    let zero = (0.0f64, 0i64, 0i64);
    let (nll_sum, correct, count) = super::parallel_map(groups, |(model, batches)| {
        batches.into_iter().try_fold(zero, |sum, items| {
            Ok::<_, Mamba2Error>(add(sum, score_batch(&model, items, ignore_index, device)?))
        })
    })
    .into_iter()
    .try_fold(zero, |sum, group| group.map(|g| add(sum, g)))?;
    if count == 0 {
        return Err(Mamba2Error::InvalidInput {
            name: "dataset",
            reason: "no scored positions to evaluate".into(),
        });
    }
    let loss = nll_sum / count as f64;
    Ok(LmScores {
        loss,
        perplexity: loss.exp(),
        accuracy: correct as f64 / count as f64,
        count: count as usize,
    })
}

/// Summed negative log-likelihood, correct predictions and scored positions of one batch.
fn score_batch<B: SsdBackend>(
    model: &Mamba2Lm<B>,
    items: Vec<SequenceItem>,
    ignore_index: Option<usize>,
    device: &B::Device,
) -> crate::Result<(f64, i64, i64)> {
    use crate::activation::log_softmax;
    use burn::data::dataloader::batcher::Batcher;
    let batch: super::LmBatch<B> = SequenceBatcher { ignore_index }.batch(items, device);
    let (logits, _) = model.forward_inner(batch.inputs, batch.documents.as_ref(), None)?;
    let [b, l, v] = logits.dims();
    let targets = batch.targets.reshape([b * l, 1]);
    let log_probs = log_softmax(logits.reshape([b * l, v]), 1);
    let nll = log_probs
        .clone()
        .gather(1, targets.clone())
        .reshape([b * l])
        .neg();
    let predicted = log_probs.argmax(1).reshape([b * l]);
    let targets = targets.reshape([b * l]);
    let keep = match ignore_index {
        Some(i) => targets.clone().not_equal_elem(i as i64),
        None => targets.clone().equal(targets.clone()),
    };
    let nll = (nll * keep.clone().float())
        .sum()
        .into_scalar()
        .elem::<f64>();
    let correct = predicted
        .equal(targets)
        .int()
        .mul(keep.clone().int())
        .sum()
        .into_scalar()
        .elem::<i64>();
    let count = keep.int().sum().into_scalar().elem::<i64>();
    Ok((nll, correct, count))
}
