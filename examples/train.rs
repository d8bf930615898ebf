//! Trains a Mamba-2 language model with Burn's `Learner` on a generated task or a text file.
//!
//! ```text
//! cargo run --release --example train                       # MQAR, 16 pairs, 128 tokens, vocab 256
//! cargo run --release --example train -- --task copy        # selective copying
//! cargo run --release --example train -- --task lm --text FILE   # byte-level language model
//! cargo run --release --example train -- --task forecast --csv ETTh1.csv --lookback 96 --horizon 96
//! cargo run --release --features dbn --example train -- --task market --dbn FILE.dbn.zst ...
//! ```
//!
//! The run leaves `config.json`, `checkpoint/`, `model/` and `metrics.csv` in its artifacts
//! directory (default `artifacts/<task>`); `--resume` continues it from its last checkpoint.
//! The last line on stdout is `result: task=<task> <metric>=<value> ... elapsed_s=<seconds>`.

use std::path::PathBuf;
use std::time::Instant;

mod common;

use burn::data::dataset::Dataset;
use burn::tensor::backend::AutodiffBackend;
use clap::{Parser, ValueEnum};
use mamba2_burn::data::copy::{self, CopyConfig};
use mamba2_burn::data::mqar::{self, MqarConfig};
use mamba2_burn::data::text::{ByteCorpus, BYTE_VOCAB, PARAGRAPH_SEPARATOR};
use mamba2_burn::data::timeseries::{ForecastData, Split, TimeSeries};
use mamba2_burn::data::{GeneratedDataset, SequenceItem};
use mamba2_burn::train::{
    evaluate_forecaster, evaluate_lm, train_forecaster, train_lm, ForecastLoss,
    ForecastTrainingConfig, LmTrainingConfig, Mamba2OptimizerConfig, ProgressMode,
};
use mamba2_burn::{
    ForecastHead, Mamba2BackboneConfig, Mamba2Config, Mamba2ForecasterConfig, Mamba2LmConfig,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Task {
    /// Multi-query associative recall.
    Mqar,
    /// Selective copying.
    Copy,
    /// Byte-level language modelling on --text.
    Lm,
    /// Time-series forecasting on --csv (standardised, split by time).
    Forecast,
    /// Next-interval return of DBN market data (--dbn; needs the `dbn` feature).
    Market,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Preset {
    /// 16 key-value pairs in 128 tokens, vocabulary 256.
    Default,
    /// 64 key-value pairs in 512 tokens, vocabulary 1,024.
    Hard,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum HeadArg {
    /// The last token's hidden state.
    Last,
    /// Every token's hidden state (PatchTST's flatten head).
    Flatten,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum LossArg {
    /// Mean squared error.
    Mse,
    /// Mean absolute error.
    Mae,
}

#[derive(Parser, Debug)]
#[command(about = "Train a Mamba-2 language model with Burn's Learner")]
struct Args {
    /// The task.
    #[arg(long, value_enum, default_value_t = Task::Mqar)]
    task: Task,
    /// Text file for --task lm.
    #[arg(long)]
    text: Option<PathBuf>,
    /// LM: the documents of --text each end with this (`\n`, `\t` and `\\` escapes; default
    /// a blank line, `\n\n`); no state flows from one document into the next. An empty
    /// string: no documents, windows of plain text.
    #[arg(long)]
    separator: Option<String>,
    /// Width of the residual stream.
    #[arg(long)]
    d_model: Option<usize>,
    /// Number of blocks.
    #[arg(long)]
    n_layer: Option<usize>,
    /// SSM state size per head.
    #[arg(long)]
    d_state: Option<usize>,
    /// Head dimension.
    #[arg(long)]
    headdim: Option<usize>,
    /// Chunk length of the SSD.
    #[arg(long)]
    chunk_size: Option<usize>,
    /// Range of the initial step sizes `dt` (log-uniform), as `MIN,MAX` (default 0.00001,0.001
    /// for MQAR, 0.001,0.1 otherwise).
    #[arg(long, value_delimiter = ',')]
    dt_range: Option<Vec<f64>>,
    /// Range of the initial decay rates `-A` (uniform), as `LO,HI` (default 1,16).
    #[arg(long, value_delimiter = ',')]
    a_init_range: Option<Vec<f64>>,
    /// Sequence length.
    #[arg(long)]
    seq_len: Option<usize>,
    /// Sequences per batch.
    #[arg(long)]
    batch_size: Option<usize>,
    /// Passes over the training set.
    #[arg(long, conflicts_with = "steps")]
    epochs: Option<usize>,
    /// Total optimizer steps (rounded up to whole epochs).
    #[arg(long)]
    steps: Option<usize>,
    /// Peak learning rate.
    #[arg(long)]
    lr: Option<f64>,
    /// AdamW weight decay of the matrices (default 0.1).
    #[arg(long)]
    weight_decay: Option<f32>,
    /// Seed of the weights, the data and its order.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Artifacts directory (default artifacts/<task>).
    #[arg(long)]
    artifacts: Option<PathBuf>,
    /// Continue the run in --artifacts from its last checkpoint.
    #[arg(long)]
    resume: bool,
    /// cpu, wgpu (with the `wgpu` feature) or cuda (with the `cuda` feature).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Threads each training step spreads its batch over (default: the available cores on
    /// cpu, 1 on cuda).
    #[arg(long)]
    step_threads: Option<usize>,
    /// MQAR: the task's size: `default` (16 key-value pairs in 128 tokens, vocabulary 256) or
    /// `hard` (64 pairs in 512 tokens, vocabulary 1,024; the longest point of the Mamba-2
    /// paper's MQAR figure); --kv-pairs, --seq-len and --vocab override either.
    #[arg(long, value_enum, default_value_t = Preset::Default)]
    preset: Preset,
    /// MQAR: key-value pairs per sequence.
    #[arg(long)]
    kv_pairs: Option<usize>,
    /// MQAR and copy: vocabulary size.
    #[arg(long)]
    vocab: Option<usize>,
    /// Copy: data tokens to copy.
    #[arg(long, default_value_t = 16)]
    n_data: usize,
    /// Synthetic tasks: training sequences per epoch.
    #[arg(long)]
    train_size: Option<usize>,
    /// Forecast: the CSV file (a timestamp column, then numeric columns).
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Forecast: columns used as inputs and forecast (comma separated; default all numeric).
    #[arg(long, value_delimiter = ',')]
    columns: Vec<String>,
    /// Forecast: steps of history per window.
    #[arg(long, default_value_t = 96)]
    lookback: usize,
    /// Forecast: steps forecast.
    #[arg(long, default_value_t = 96)]
    horizon: usize,
    /// Forecast: all variables in one sequence instead of one sequence per variable.
    #[arg(long)]
    channel_mixing: bool,
    /// Forecast: no reversible instance normalisation.
    #[arg(long)]
    no_revin: bool,
    /// Forecast: time steps per token (PatchTST's patches; default 16, 1: one token per step).
    #[arg(long)]
    patch_len: Option<usize>,
    /// Forecast: steps between patch starts (default: half the patch length).
    #[arg(long)]
    patch_stride: Option<usize>,
    /// Forecast: the head reads the last token (`last`) or every token (`flatten`, the default).
    #[arg(long, value_enum)]
    head: Option<HeadArg>,
    /// Forecast: dropout before the head (default 0.3).
    #[arg(long)]
    head_dropout: Option<f64>,
    /// Forecast: stop after this many epochs without a better validation loss (default 3; 0:
    /// never).
    #[arg(long)]
    patience: Option<usize>,
    /// Forecast: the training loss (default mae; validation and test report both).
    #[arg(long, value_enum)]
    loss: Option<LossArg>,
    /// Market: DBN files (MBP-1, trades or OHLCV; .dbn or .dbn.zst).
    #[arg(long, num_args = 1..)]
    dbn: Vec<PathBuf>,
    /// Market: grid interval in milliseconds.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// Market: instrument id (default: the one with the most grid rows).
    #[arg(long)]
    instrument: Option<u32>,
    /// Plain progress lines even on a terminal.
    #[arg(long)]
    plain: bool,
}

/// Per-task defaults of the model, the data and the schedule.
struct Defaults {
    d_model: usize,
    n_layer: usize,
    d_state: usize,
    headdim: usize,
    chunk_size: usize,
    seq_len: usize,
    batch_size: usize,
    epochs: usize,
    lr: f64,
    train_size: usize,
    vocab: usize,
    /// Range of the initial `dt` (`None`: the reference's 0.001..0.1).
    dt_range: Option<(f64, f64)>,
}

fn defaults(task: Task, preset: Preset) -> Defaults {
    match task {
        Task::Mqar if preset == Preset::Hard => Defaults {
            chunk_size: 64,
            seq_len: 512,
            vocab: 1024,
            ..defaults(Task::Mqar, Preset::Default)
        },
        Task::Mqar => Defaults {
            d_model: 64,
            n_layer: 2,
            d_state: 128,
            headdim: 16,
            chunk_size: 32,
            seq_len: 128,
            batch_size: 32,
            epochs: 12,
            lr: 1e-2,
            train_size: 8192,
            vocab: 256,
            // heads that remember the whole sequence from the start (see README, Training)
            dt_range: Some((1e-5, 1e-3)),
        },
        Task::Copy => Defaults {
            d_model: 64,
            n_layer: 2,
            d_state: 32,
            headdim: 16,
            chunk_size: 32,
            seq_len: 128,
            batch_size: 32,
            epochs: 4,
            lr: 5e-3,
            train_size: 4096,
            vocab: 16,
            dt_range: None,
        },
        Task::Forecast => Defaults {
            d_model: 64,
            n_layer: 2,
            d_state: 32,
            headdim: 16,
            chunk_size: 16,
            seq_len: 0,
            batch_size: 32,
            epochs: 10,
            lr: 3e-4,
            train_size: 0,
            vocab: 0,
            dt_range: None,
        },
        Task::Market => Defaults {
            d_model: 64,
            n_layer: 2,
            d_state: 32,
            headdim: 16,
            chunk_size: 32,
            seq_len: 0,
            batch_size: 32,
            epochs: 2,
            lr: 1e-3,
            train_size: 0,
            vocab: 0,
            dt_range: None,
        },
        Task::Lm => Defaults {
            d_model: 128,
            n_layer: 2,
            d_state: 32,
            headdim: 32,
            chunk_size: 64,
            seq_len: 128,
            batch_size: 16,
            epochs: 1,
            lr: 3e-3,
            train_size: 0,
            vocab: BYTE_VOCAB,
            dt_range: None,
        },
    }
}

/// Forecasting: steps per token (patches overlap by half), dropout before the flatten head and
/// the early-stopping patience.
const FORECAST_PATCH_LEN: usize = 16;
const FORECAST_HEAD_DROPOUT: f64 = 0.3;
const FORECAST_PATIENCE: usize = 3;

type Data = Box<dyn Dataset<SequenceItem>>;

/// Training, validation and held-out test sets, and the task's result fields.
struct TaskData {
    train: Data,
    valid: Data,
    test: Data,
    vocab: usize,
    ignore_index: Option<usize>,
    describe: String,
}

/// Generated training, validation and held-out test sets, from three seeds.
fn generated<T, E>(train: T, eval: E, seed: u64, train_size: usize) -> [Data; 3]
where
    T: Fn(u64, u64) -> SequenceItem + Send + Sync + 'static,
    E: Fn(u64, u64) -> SequenceItem + Send + Sync + Clone + 'static,
{
    let (valid_size, test_size) = (512, 2048);
    [
        Box::new(GeneratedDataset::new(train, seed, train_size)),
        Box::new(GeneratedDataset::new(
            eval.clone(),
            seed.wrapping_add(1),
            valid_size,
        )),
        Box::new(GeneratedDataset::new(eval, seed.wrapping_add(2), test_size)),
    ]
}

fn task_data(args: &Args, d: &Defaults, seq_len: usize) -> Result<TaskData, String> {
    let train_size = args.train_size.unwrap_or(d.train_size);
    let vocab = args.vocab.unwrap_or(d.vocab);
    match args.task {
        Task::Mqar => {
            let kv_pairs = args.kv_pairs.unwrap_or(match args.preset {
                Preset::Default => 16,
                Preset::Hard => 64,
            });
            let task = MqarConfig {
                vocab_size: vocab,
                seq_len,
                kv_pairs,
            };
            task.validate().map_err(|e| e.to_string())?;
            // training sequences cycle through k/4, k/2 and k pairs in sequences shortened in
            // proportion (easier examples at a fraction of the cost, as in Zoology's mixed
            // training sets of several lengths); validation and test use k pairs only
            let mix =
                [(kv_pairs / 4).max(1), (kv_pairs / 2).max(1), kv_pairs].map(|k| MqarConfig {
                    kv_pairs: k,
                    seq_len: (seq_len * k).div_ceil(kv_pairs).max(4 * k - 1).min(seq_len),
                    ..task
                });
            let mixed = move |seed, i: u64| mix[(i % mix.len() as u64) as usize].example(seed, i);
            let [train, valid, test] =
                generated(mixed, move |s, i| task.example(s, i), args.seed, train_size);
            Ok(TaskData {
                train,
                valid,
                test,
                vocab,
                ignore_index: Some(mqar::FILLER as usize),
                describe: format!("kv_pairs={kv_pairs} seq_len={seq_len} vocab={vocab}"),
            })
        }
        Task::Copy => {
            let task = CopyConfig {
                vocab_size: vocab,
                seq_len,
                n_data: args.n_data,
            };
            task.validate().map_err(|e| e.to_string())?;
            let gen = move |s, i| task.example(s, i);
            let [train, valid, test] = generated(gen, gen, args.seed, train_size);
            Ok(TaskData {
                train,
                valid,
                test,
                vocab,
                ignore_index: Some(copy::NOISE as usize),
                describe: format!("n_data={} seq_len={seq_len} vocab={vocab}", args.n_data),
            })
        }
        Task::Forecast | Task::Market => unreachable!("windowed tasks run in run_forecast"),
        Task::Lm => {
            let path = args.text.as_ref().ok_or("--task lm needs --text FILE")?;
            let corpus = match args.separator.as_deref() {
                Some("") => ByteCorpus::from_file(path, seq_len),
                separator => {
                    let separator = separator
                        .map(unescape)
                        .unwrap_or_else(|| PARAGRAPH_SEPARATOR.to_vec());
                    ByteCorpus::packed_from_file(path, seq_len, &separator)
                }
            }
            .map_err(|e| e.to_string())?;
            use burn::data::dataset::InMemDataset;
            Ok(TaskData {
                train: Box::new(InMemDataset::new(corpus.train)),
                valid: Box::new(InMemDataset::new(corpus.valid)),
                test: Box::new(InMemDataset::new(corpus.test)),
                vocab: BYTE_VOCAB,
                ignore_index: None,
                describe: format!("seq_len={seq_len}"),
            })
        }
    }
}

fn artifacts_dir(args: &Args, task_name: &str) -> PathBuf {
    args.artifacts
        .clone()
        .unwrap_or_else(|| PathBuf::from("artifacts").join(task_name))
}

fn progress_mode(args: &Args) -> ProgressMode {
    if args.plain {
        ProgressMode::Plain
    } else {
        ProgressMode::Auto
    }
}

/// The backbone of the flags, over the task's defaults.
fn backbone_config(args: &Args, d: &Defaults) -> Result<Mamba2BackboneConfig, String> {
    let pair = |flag: &str, values: &Option<Vec<f64>>| match values.as_deref() {
        None => Ok(None),
        Some(&[a, b]) => Ok(Some((a, b))),
        Some(other) => Err(format!("{flag} takes two values, got {other:?}")),
    };
    let mut mixer = Mamba2Config::new(args.d_model.unwrap_or(d.d_model))
        .with_d_state(args.d_state.unwrap_or(d.d_state))
        .with_headdim(args.headdim.unwrap_or(d.headdim))
        .with_chunk_size(args.chunk_size.unwrap_or(d.chunk_size));
    if let Some((min, max)) = pair("--dt-range", &args.dt_range)?.or(d.dt_range) {
        mixer = mixer.with_dt_min(min).with_dt_max(max);
    }
    if let Some(range) = pair("--a-init-range", &args.a_init_range)? {
        mixer = mixer.with_a_init_range(range);
    }
    Ok(Mamba2BackboneConfig::new(
        args.n_layer.unwrap_or(d.n_layer),
        mixer,
    ))
}

fn epochs_for(args: &Args, d: &Defaults, steps_per_epoch: usize) -> usize {
    match (args.epochs, args.steps) {
        (Some(e), _) => e,
        (None, Some(s)) => s.div_ceil(steps_per_epoch.max(1)).max(1),
        (None, None) => d.epochs,
    }
}

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

/// Share of test windows whose forecast has the sign of the next interval's actual value
/// (on the original scale of the target).
fn direction_accuracy<B: burn::tensor::backend::Backend>(
    model: &mamba2_burn::Mamba2Forecaster<B>,
    data: &ForecastData,
    lookback: usize,
    target: usize,
    device: &B::Device,
) -> Result<f64, Box<dyn std::error::Error>> {
    use burn::data::dataloader::batcher::Batcher;
    let batcher = mamba2_burn::data::timeseries::WindowBatcher::new(lookback, 1);
    let (mean, std) = (data.scaler.mean[target], data.scaler.std[target]);
    let (mut hits, mut total) = (0usize, 0usize);
    let n = data.test.len();
    for start in (0..n).step_by(256) {
        let items: Vec<_> = (start..(start + 256).min(n))
            .filter_map(|i| data.test.get(i))
            .collect();
        let batch: mamba2_burn::train::ForecastBatch<B> = batcher.batch(items, device);
        let predicted: Vec<f32> = model.forward(batch.inputs)?.into_data().to_vec()?;
        let actual: Vec<f32> = batch.targets.into_data().to_vec()?;
        for (p, a) in predicted.iter().zip(&actual) {
            let (p, a) = (p * std + mean, a * std + mean);
            if a != 0.0 {
                total += 1;
                hits += usize::from((p > 0.0) == (a > 0.0));
            }
        }
    }
    Ok(hits as f64 / total.max(1) as f64)
}

fn run_forecast<B: AutodiffBackend>(
    args: &Args,
    device: B::Device,
) -> Result<(), Box<dyn std::error::Error>> {
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
    let epochs = epochs_for(args, &d, data.train.len().div_ceil(batch_size.max(1)));
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
        .with_lr(args.lr.unwrap_or(d.lr))
        .with_optimizer(optimizer(args))
        .with_batch_size(batch_size)
        .with_epochs(epochs)
        .with_seed(args.seed)
        .with_step_threads(step_threads(args));
    let task_name = if market { "market" } else { "forecast" };
    let artifacts = artifacts_dir(args, task_name);
    println!(
        "task {task_name} ({describe}); {} / {} / {} windows, {epochs} epochs, batch {batch_size} on {} threads; artifacts in {}",
        data.train.len(),
        data.valid.len(),
        data.test.len(),
        config.step_threads,
        artifacts.display()
    );
    let model = train_forecaster::<B, _, _>(
        &config,
        data.train.clone(),
        data.valid.clone(),
        &artifacts,
        args.resume,
        progress_mode(args),
        &device,
    )?;
    let val = evaluate_forecaster(&model, &data.valid, lookback, 256, &device)?;
    let test = evaluate_forecaster(&model, &data.test, lookback, 256, &device)?;
    let extra = if market {
        // the target is the first column of the market series (`return`)
        format!(
            " direction_accuracy={:.4}",
            direction_accuracy(&model, &data, lookback, 0, &device)?
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

fn run<B: AutodiffBackend>(
    args: &Args,
    device: B::Device,
) -> Result<(), Box<dyn std::error::Error>> {
    if matches!(args.task, Task::Forecast | Task::Market) {
        return run_forecast::<B>(args, device);
    }
    let start = Instant::now();
    let d = defaults(args.task, args.preset);
    let seq_len = args.seq_len.unwrap_or(d.seq_len);
    let data = task_data(args, &d, seq_len)?;
    let batch_size = args.batch_size.unwrap_or(d.batch_size);
    let steps_per_epoch = data.train.len().div_ceil(batch_size.max(1));
    let epochs = epochs_for(args, &d, steps_per_epoch);
    let model =
        Mamba2LmConfig::new(backbone_config(args, &d)?, data.vocab).with_pad_vocab_size_multiple(8);
    let config = LmTrainingConfig::new(model)
        .with_lr(args.lr.unwrap_or(d.lr))
        .with_optimizer(optimizer(args))
        .with_batch_size(batch_size)
        .with_epochs(epochs)
        .with_seed(args.seed)
        .with_ignore_index(data.ignore_index)
        .with_step_threads(step_threads(args));
    let task_name = format!("{:?}", args.task).to_lowercase();
    let artifacts = artifacts_dir(args, &task_name);
    println!(
        "task {task_name} ({}); {} training sequences x {epochs} epochs, batch {batch_size} on {} threads; artifacts in {}",
        data.describe,
        data.train.len(),
        config.step_threads,
        artifacts.display()
    );

    let progress = progress_mode(args);
    let TaskData {
        train,
        valid,
        test,
        ignore_index,
        describe,
        ..
    } = data;
    let model = train_lm::<B, _, _>(
        &config,
        train,
        valid,
        &artifacts,
        args.resume,
        progress,
        &device,
    )?;
    let scores = evaluate_lm(&model, &test, 64, ignore_index, &device)?;
    let elapsed = start.elapsed().as_secs_f64();
    let metrics = match args.task {
        Task::Lm => format!(
            "loss={:.4} perplexity={:.3}",
            scores.loss, scores.perplexity
        ),
        _ => format!("accuracy={:.4} loss={:.4}", scores.accuracy, scores.loss),
    };
    println!("result: task={task_name} {metrics} {describe} elapsed_s={elapsed:.1}");
    Ok(())
}

/// The bytes of `--separator`, with `\n`, `\t` and `\\` escapes.
fn unescape(text: &str) -> Vec<u8> {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('\\') => out.push('\\'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out.into_bytes()
}

/// The optimizer with `--weight-decay`, if given.
fn optimizer(args: &Args) -> Mamba2OptimizerConfig {
    let config = Mamba2OptimizerConfig::new();
    match args.weight_decay {
        Some(wd) => config.with_weight_decay(wd),
        None => config,
    }
}

/// `--step-threads`, else the available cores on the cpu and 1 on a GPU.
fn step_threads(args: &Args) -> usize {
    common::step_threads(args.step_threads, &args.device)
}

fn main() {
    common::tune_allocator();
    let args = Args::parse();
    let result = match args.device.as_str() {
        "cpu" => {
            run::<burn::backend::Autodiff<burn::backend::NdArray<f32>>>(&args, Default::default())
        }
        #[cfg(feature = "wgpu")]
        "wgpu" => {
            run::<burn::backend::Autodiff<burn::backend::Wgpu<f32>>>(&args, Default::default())
        }
        #[cfg(feature = "cuda")]
        "cuda" => {
            run::<burn::backend::Autodiff<burn::backend::Cuda<f32>>>(&args, Default::default())
        }
        other => Err(common::unknown_device(other)),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
