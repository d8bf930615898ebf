//! The command line, each task's defaults, and the library configs they give.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use mamba2_burn::checkpoint::{HybridSpec, HYBRID_PRESETS};
use mamba2_burn::data::text::BYTE_VOCAB;
use mamba2_burn::train::{Mamba2OptimizerConfig, MixedPrecision, ProgressMode};
use mamba2_burn::{LoraConfig, Mamba2BackboneConfig, Mamba2Config, Mamba2Error};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Task {
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
pub enum Preset {
    /// 16 key-value pairs in 128 tokens, vocabulary 256.
    Default,
    /// 64 key-value pairs in 512 tokens, vocabulary 1,024.
    Hard,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DtypeArg {
    /// Everything in `f32`.
    F32,
    /// Mixed precision: forward and backward in `bf16`, weights and optimizer state in `f32`.
    Bf16,
    /// Mixed precision in `f16` (Wgpu adapters with `f16`, lavapipe among them; Cuda).
    F16,
}

impl Args {
    /// The run's mixed precision, if any (`--dtype`, by default bf16 on cuda).
    pub fn mixed_precision(&self) -> Option<MixedPrecision> {
        let default = if self.device == "cuda" {
            DtypeArg::Bf16
        } else {
            DtypeArg::F32
        };
        match self.dtype.unwrap_or(default) {
            DtypeArg::F32 => None,
            DtypeArg::Bf16 => Some(MixedPrecision::Bf16),
            DtypeArg::F16 => Some(MixedPrecision::F16),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum HeadArg {
    /// The last token's hidden state.
    Last,
    /// Every token's hidden state (PatchTST's flatten head).
    Flatten,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LossArg {
    /// Mean squared error.
    Mse,
    /// Mean absolute error.
    Mae,
}

#[derive(Parser, Debug)]
#[command(about = "Train a Mamba-2 language model with Burn's Learner")]
pub struct Args {
    /// The task.
    #[arg(long, value_enum, default_value_t = Task::Mqar)]
    pub task: Task,
    /// Text file for --task lm.
    #[arg(long)]
    pub text: Option<PathBuf>,
    /// LM: the documents of --text each end with this (`\n`, `\t` and `\\` escapes; default
    /// a blank line, `\n\n`, for bytes; with a tokenizer, none: each file is a document); no
    /// state flows from one document into the next. An empty string: no documents, windows of
    /// plain text (bytes), each file a document (tokens).
    #[arg(long)]
    pub separator: Option<String>,
    /// LM: fine-tune the model of this checkpoint folder (Mamba-2 or a hybrid, as published,
    /// as transformers saves it, or a run's `model/`): its config and weights start the run,
    /// its `tokenizer.json` tokenizes --text, and the run's `model/` takes its layout. The
    /// validation loss is reported before the first step and after the last. The default
    /// learning rate for trained weights: 3e-4.
    #[arg(long)]
    pub init_from: Option<PathBuf>,
    /// LM, with --init-from: train low-rank adapters (LoRA) of this rank in place of the
    /// model's weights, which stay frozen; the run's `model/` gets them merged into the
    /// weights, `adapter/` in PEFT's layout. The default learning rate with adapters: 1e-3.
    #[arg(long)]
    pub lora_rank: Option<usize>,
    /// LoRA: the update's scale is alpha / rank (default 16).
    #[arg(long, requires = "lora_rank")]
    pub lora_alpha: Option<f64>,
    /// LoRA: dropout on the adapters' input (default 0).
    #[arg(long, requires = "lora_rank")]
    pub lora_dropout: Option<f64>,
    /// LoRA: the projections adapted, as `in_proj,q_proj` (default: every one the model has of
    /// `in_proj`, `q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate`, `up`, `down`; `out_proj` too
    /// when named, though PEFT refuses it on transformers' Mamba-2, Falcon-H1 and Nemotron-H).
    #[arg(long, requires = "lora_rank", value_delimiter = ',')]
    pub lora_targets: Option<Vec<String>>,
    /// LM: tokenize --text with this `tokenizer.json` (the `tokenizer` feature; default: the
    /// --init-from folder's, if it has one; else --text is read as bytes).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// LM tasks: the model: `mamba2` (the default, sized by the flags below); Mamba-3
    /// (`mamba3`: mamba_ssm's config.json of Mamba-3 layers) or a hybrid family at the task's
    /// size (`granite`, `bamba`, `nemotron-h`, `falcon-h1`), the config.json files in
    /// examples/train/hybrid; a published hybrid's shape (a preset: `granite-4.0-h-350m`,
    /// `granite-4.0-h-1b`, `bamba-9b`, `nemotron-h-4b`, `falcon-h1-0.5b`, ...: `bench --mode
    /// hybrid-params` lists them); or a hybrid's config.json. A hybrid takes the task's
    /// vocabulary, the rest from its config; `--dt-range` and `--a-init-range` set its Mamba
    /// layers' init.
    #[arg(long, default_value = "mamba2")]
    pub model: String,
    /// Width of the residual stream.
    #[arg(long)]
    pub d_model: Option<usize>,
    /// Number of blocks.
    #[arg(long)]
    pub n_layer: Option<usize>,
    /// SSM state size per head.
    #[arg(long)]
    pub d_state: Option<usize>,
    /// Head dimension.
    #[arg(long)]
    pub headdim: Option<usize>,
    /// Chunk length of the SSD.
    #[arg(long)]
    pub chunk_size: Option<usize>,
    /// Range of the initial step sizes `dt` (log-uniform), as `MIN,MAX` (default 0.00001,0.001
    /// for Mamba-2 on MQAR, 0.001,0.1 otherwise).
    #[arg(long, value_delimiter = ',')]
    pub dt_range: Option<Vec<f64>>,
    /// Range of the initial decay rates `-A` (uniform), as `LO,HI` (default 1,16).
    #[arg(long, value_delimiter = ',')]
    pub a_init_range: Option<Vec<f64>>,
    /// Sequence length.
    #[arg(long)]
    pub seq_len: Option<usize>,
    /// Sequences per batch.
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Passes over the training set.
    #[arg(long, conflicts_with = "steps")]
    pub epochs: Option<usize>,
    /// Total optimizer steps (rounded up to whole epochs).
    #[arg(long)]
    pub steps: Option<usize>,
    /// Peak learning rate.
    #[arg(long)]
    pub lr: Option<f64>,
    /// Warmup of the learning rate, as a fraction of all steps (default 0.05).
    #[arg(long)]
    pub warmup: Option<f64>,
    /// AdamW weight decay of the matrices (default 0.1).
    #[arg(long)]
    pub weight_decay: Option<f32>,
    /// Seed of the weights, the data and its order.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Artifacts directory (default artifacts/<task>).
    #[arg(long)]
    pub artifacts: Option<PathBuf>,
    /// Continue the run in --artifacts from its last checkpoint.
    #[arg(long)]
    pub resume: bool,
    /// cpu, wgpu (with the `wgpu` feature) or cuda (with the `cuda` feature).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Devices to train on with Burn's multi-device strategy: GPUs 0 to N-1 on cuda and wgpu;
    /// on cpu, N batches per step in parallel. --batch-size is then each device's batch.
    #[arg(long, default_value_t = 1)]
    pub devices: usize,
    /// With --devices: Burn's distributed data parallel strategy (an all-reduce after each
    /// backward pass) instead of its multi-device one; cuda, in a build with the `ddp` feature.
    #[arg(long)]
    pub ddp: bool,
    /// Threads each training step spreads its batch over (default: the available cores on
    /// cpu, 1 on cuda).
    #[arg(long)]
    pub step_threads: Option<usize>,
    /// The type the steps compute in: `f32`, or mixed precision in `bf16` or `f16` (the
    /// weights and the optimizer's state stay `f32`). Default: `bf16` on cuda (the GPU
    /// recipe), `f32` elsewhere.
    #[arg(long, value_enum)]
    pub dtype: Option<DtypeArg>,
    /// MQAR: the task's size: `default` (16 key-value pairs in 128 tokens, vocabulary 256) or
    /// `hard` (64 pairs in 512 tokens, vocabulary 1,024; the longest point of the Mamba-2
    /// paper's MQAR figure); --kv-pairs, --seq-len and --vocab override either.
    #[arg(long, value_enum, default_value_t = Preset::Default)]
    pub preset: Preset,
    /// MQAR: key-value pairs per sequence.
    #[arg(long)]
    pub kv_pairs: Option<usize>,
    /// MQAR and copy: vocabulary size.
    #[arg(long)]
    pub vocab: Option<usize>,
    /// Copy: data tokens to copy.
    #[arg(long, default_value_t = 16)]
    pub n_data: usize,
    /// Synthetic tasks: training sequences per epoch.
    #[arg(long)]
    pub train_size: Option<usize>,
    /// Forecast: the CSV file (a timestamp column, then numeric columns).
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Forecast: columns used as inputs and forecast (comma separated; default all numeric).
    #[arg(long, value_delimiter = ',')]
    pub columns: Vec<String>,
    /// Forecast: steps of history per window.
    #[arg(long, default_value_t = 96)]
    pub lookback: usize,
    /// Forecast: steps forecast.
    #[arg(long, default_value_t = 96)]
    pub horizon: usize,
    /// Forecast: all variables in one sequence instead of one sequence per variable.
    #[arg(long)]
    pub channel_mixing: bool,
    /// Forecast: no reversible instance normalisation.
    #[arg(long)]
    pub no_revin: bool,
    /// Forecast: time steps per token (PatchTST's patches; default 16, 1: one token per step).
    #[arg(long)]
    pub patch_len: Option<usize>,
    /// Forecast: steps between patch starts (default: half the patch length).
    #[arg(long)]
    pub patch_stride: Option<usize>,
    /// Forecast: the head reads the last token (`last`) or every token (`flatten`, the default).
    #[arg(long, value_enum)]
    pub head: Option<HeadArg>,
    /// Forecast: dropout before the head (default 0.3).
    #[arg(long)]
    pub head_dropout: Option<f64>,
    /// Forecast: stop after this many epochs without a better validation loss (default 3; 0:
    /// never).
    #[arg(long)]
    pub patience: Option<usize>,
    /// Forecast: the training loss (default mae; validation and test report both).
    #[arg(long, value_enum)]
    pub loss: Option<LossArg>,
    /// Market: DBN files (MBP-1, trades or OHLCV; .dbn or .dbn.zst).
    #[arg(long, num_args = 1..)]
    pub dbn: Vec<PathBuf>,
    /// Market: grid interval in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub interval_ms: u64,
    /// Market: instrument id (default: the one with the most grid rows).
    #[arg(long)]
    pub instrument: Option<u32>,
    /// Plain progress lines even on a terminal.
    #[arg(long)]
    pub plain: bool,
}

/// Per-task defaults of the model, the data and the schedule.
pub struct Defaults {
    pub d_model: usize,
    pub n_layer: usize,
    pub d_state: usize,
    pub headdim: usize,
    pub chunk_size: usize,
    pub seq_len: usize,
    pub batch_size: usize,
    pub epochs: usize,
    pub lr: f64,
    pub train_size: usize,
    pub vocab: usize,
    /// Range of the initial `dt` (`None`: the reference's 0.001..0.1).
    pub dt_range: Option<(f64, f64)>,
}

pub fn defaults(task: Task, preset: Preset) -> Defaults {
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

pub fn artifacts_dir(args: &Args, task_name: &str) -> PathBuf {
    args.artifacts
        .clone()
        .unwrap_or_else(|| PathBuf::from("artifacts").join(task_name))
}

pub fn progress_mode(args: &Args) -> ProgressMode {
    if args.plain {
        ProgressMode::Plain
    } else {
        ProgressMode::Auto
    }
}

/// The backbone of the flags, over the task's defaults.
pub fn backbone_config(args: &Args, d: &Defaults) -> Result<Mamba2BackboneConfig, String> {
    let mut mixer = Mamba2Config::new(args.d_model.unwrap_or(d.d_model))
        .with_d_state(args.d_state.unwrap_or(d.d_state))
        .with_headdim(args.headdim.unwrap_or(d.headdim))
        .with_chunk_size(args.chunk_size.unwrap_or(d.chunk_size));
    let (dt, a) = init_ranges(args, d.dt_range)?;
    if let Some((min, max)) = dt {
        mixer = mixer.with_dt_min(min).with_dt_max(max);
    }
    if let Some(range) = a {
        mixer = mixer.with_a_init_range(range);
    }
    Ok(Mamba2BackboneConfig::new(
        args.n_layer.unwrap_or(d.n_layer),
        mixer,
    ))
}

/// The task-sized configs of the hybrid families (`--model granite` etc.), each with the MQAR
/// epochs it was measured to reach 99% in (docs/hybrids.md, Training).
const HYBRID_FAMILIES: [(&str, &str, usize); 5] = [
    ("mamba3", include_str!("hybrid/mamba3.json"), 12),
    ("granite", include_str!("hybrid/granite.json"), 24),
    ("bamba", include_str!("hybrid/bamba.json"), 12),
    ("nemotron-h", include_str!("hybrid/nemotron-h.json"), 24),
    ("falcon-h1", include_str!("hybrid/falcon-h1.json"), 24),
];

/// MQAR's epochs for `--model`: Mamba-2's `mamba2` default, a family's own, twice Mamba-2's for
/// any other hybrid (attention learns recall after a plateau of several epochs).
pub fn mqar_epochs(model: &str, mamba2: usize) -> usize {
    if model == "mamba2" {
        return mamba2;
    }
    HYBRID_FAMILIES
        .iter()
        .find(|(n, _, _)| *n == model)
        .map_or(2 * mamba2, |(_, _, epochs)| *epochs)
}

/// The hybrid model of `--model` with a vocabulary of `vocab` tokens, or `None` for Mamba-2. The
/// Mamba-2 size flags are an error with a hybrid, whose sizes are in its config.
pub fn hybrid_spec(args: &Args, vocab: usize) -> Result<Option<HybridSpec>, String> {
    let spec = match args.model.as_str() {
        "mamba2" => return Ok(None),
        name => match HYBRID_FAMILIES.iter().find(|(n, _, _)| *n == name) {
            Some((_, json, _)) => HybridSpec::new(*json),
            None if HYBRID_PRESETS.iter().any(|(n, _, _)| *n == name) => {
                HybridSpec::preset(name).map_err(|e| e.to_string())?
            }
            None if std::path::Path::new(name).exists() => {
                HybridSpec::from_file(name).map_err(|e| e.to_string())?
            }
            None => {
                let families: Vec<&str> = HYBRID_FAMILIES.iter().map(|(n, _, _)| *n).collect();
                let presets: Vec<&str> = HYBRID_PRESETS.iter().map(|(n, _, _)| *n).collect();
                return Err(format!(
                    "--model {name:?}: not mamba2, a family ({}), a preset ({}) or a config.json",
                    families.join(", "),
                    presets.join(", ")
                ));
            }
        },
    };
    if let Some(flag) = mamba2_size_flag(args) {
        return Err(format!(
            "{flag} sizes the mamba2 model; --model {} takes its sizes from its config",
            args.model
        ));
    }
    // the task's `dt` default is Mamba-2's recipe for holding the recall in its state; a
    // hybrid recalls with attention and keeps its mixer's init unless the flags say otherwise
    let (dt, a) = init_ranges(args, None)?;
    spec.with_dt_init_range(dt)
        .with_a_init_range(a)
        .with_vocab_size(vocab)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// The first of the flags that size a fresh Mamba-2 model that is set.
fn mamba2_size_flag(args: &Args) -> Option<&'static str> {
    [
        ("--d-model", args.d_model.is_some()),
        ("--n-layer", args.n_layer.is_some()),
        ("--d-state", args.d_state.is_some()),
        ("--headdim", args.headdim.is_some()),
        ("--chunk-size", args.chunk_size.is_some()),
    ]
    .into_iter()
    .find_map(|(flag, set)| set.then_some(flag))
}

/// Fine-tuning's peak learning rate: a tenth of a fresh model's, which keeps most of the gain on
/// the new text at a third of the loss on the old (docs/training-notes.md, Fine-tuning).
pub const FINE_TUNE_LR: f64 = 3e-4;

/// The peak learning rate of a LoRA fine-tune (docs/training-notes.md, Fine-tuning).
pub const LORA_LR: f64 = 1e-3;

/// The adapters of `--lora-rank` and its companions, checked.
pub fn lora_config(args: &Args) -> Result<Option<LoraConfig>, String> {
    let Some(rank) = args.lora_rank else {
        return Ok(None);
    };
    if args.init_from.is_none() {
        return Err("--lora-rank adapts a trained model: give it with --init-from".into());
    }
    let mut lora = LoraConfig::new(rank);
    if let Some(alpha) = args.lora_alpha {
        lora = lora.with_alpha(alpha);
    }
    if let Some(dropout) = args.lora_dropout {
        lora = lora.with_dropout(dropout);
    }
    if let Some(targets) = &args.lora_targets {
        lora = lora.with_targets(targets.clone());
    }
    lora.validate().map_err(|e| match e {
        Mamba2Error::InvalidConfig { field, reason } => format!("--lora-{field}: {reason}"),
        other => other.to_string(),
    })?;
    Ok(Some(lora))
}

/// Checks the flags of a fine-tune (`--init-from`): the LM task, the folder's model.
pub fn check_fine_tune(args: &Args) -> Result<(), String> {
    if args.task != Task::Lm {
        return Err("--init-from fine-tunes on --task lm".into());
    }
    if args.model != "mamba2" {
        return Err("--init-from trains the folder's model; leave out --model".into());
    }
    let init = [
        ("--dt-range", args.dt_range.is_some()),
        ("--a-init-range", args.a_init_range.is_some()),
        ("--vocab", args.vocab.is_some()),
    ];
    let other = init.into_iter().find_map(|(flag, set)| set.then_some(flag));
    if let Some(flag) = mamba2_size_flag(args).or(other) {
        return Err(format!(
            "{flag} sizes a fresh model; --init-from trains the folder's"
        ));
    }
    Ok(())
}

/// `--dt-range` (else `default_dt`) and `--a-init-range`: the Mamba layers' init, of Mamba-2
/// and of a hybrid alike.
fn init_ranges(args: &Args, default_dt: Option<(f64, f64)>) -> Result<InitRanges, String> {
    let pair = |flag: &str, values: &Option<Vec<f64>>| match values.as_deref() {
        None => Ok(None),
        Some(&[a, b]) => Ok(Some((a, b))),
        Some(other) => Err(format!("{flag} takes two values, got {other:?}")),
    };
    Ok((
        pair("--dt-range", &args.dt_range)?.or(default_dt),
        pair("--a-init-range", &args.a_init_range)?,
    ))
}

/// The initial `dt` range and `-A` range, where set.
type InitRanges = (Option<(f64, f64)>, Option<(f64, f64)>);

/// `--epochs`, or enough epochs for `--steps` over `items` training items in batches of
/// `batch_size` (a step takes one batch on every one of `--devices`), or the task's default.
pub fn epochs_for(args: &Args, d: &Defaults, items: usize, batch_size: usize) -> usize {
    let steps_per_epoch = items.div_ceil(batch_size.max(1) * args.devices.max(1));
    match (args.epochs, args.steps) {
        (Some(e), _) => e,
        (None, Some(s)) => s.div_ceil(steps_per_epoch.max(1)).max(1),
        (None, None) => d.epochs,
    }
}

/// The text of `--separator`, with `\n`, `\t` and `\\` escapes.
pub fn unescape(text: &str) -> String {
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
    out
}

/// The optimizer with `--weight-decay`, if given.
pub fn optimizer(args: &Args) -> Mamba2OptimizerConfig {
    let config = Mamba2OptimizerConfig::new();
    match args.weight_decay {
        Some(wd) => config.with_weight_decay(wd),
        None => config,
    }
}

/// `--step-threads`, else the available cores on the cpu and 1 on a GPU.
pub fn step_threads(args: &Args) -> usize {
    crate::common::step_threads(args.step_threads, &args.device)
}
