//! The token tasks (MQAR, selective copying, a byte-level language model): their data and run.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use burn::data::dataset::Dataset;
use burn::module::AutodiffModule;
use burn::train::SequenceOutput;
use mamba2_burn::checkpoint::{is_hybrid_folder, HybridSpec};
use mamba2_burn::data::copy::{self, CopyConfig};
use mamba2_burn::data::mqar::{self, MqarConfig};
use mamba2_burn::data::text::{TextCorpus, BYTE_VOCAB, PARAGRAPH_SEPARATOR};
use mamba2_burn::data::{GeneratedDataset, SequenceItem};
use mamba2_burn::train::{
    evaluate_lm, train_lm, LanguageModel, LanguageModelTraining, LmBatch, LmConfig, RunConfig,
    SupervisedModel, TrainDevices,
};
use mamba2_burn::SsdAutodiffBackend;
use mamba2_burn::{LoraConfig, Mamba2LmConfig};

use crate::args::{
    artifacts_dir, backbone_config, check_fine_tune, defaults, epochs_for, hybrid_spec,
    lora_config, mqar_epochs, optimizer, progress_mode, step_threads, unescape, Args, Defaults,
    Preset, Task, FINE_TUNE_LR, LORA_LR,
};

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
        Task::Forecast | Task::Market => unreachable!("windowed tasks run in forecast::run"),
        Task::Lm => text_data(args, seq_len),
    }
}

/// The vocabulary of the model in the checkpoint folder `dir`.
fn folder_vocab(dir: &Path) -> Result<usize, String> {
    let text = |e: mamba2_burn::Mamba2Error| e.to_string();
    match is_hybrid_folder(dir).map_err(text)? {
        true => HybridSpec::from_folder(dir).and_then(|m| m.vocab()),
        false => Mamba2LmConfig::from_folder(dir).and_then(|m| m.vocab()),
    }
    .map_err(text)
}

/// --text as windows of tokens (with --tokenizer or the --init-from folder's) or of bytes.
fn text_data(args: &Args, seq_len: usize) -> Result<TaskData, String> {
    let path = args.text.as_ref().ok_or("--task lm needs --text FILE")?;
    let vocab = args.init_from.as_deref().map(folder_vocab).transpose()?;
    let tokenizer = args.tokenizer.clone().or_else(|| {
        let file = args.init_from.as_ref()?.join("tokenizer.json");
        file.is_file().then_some(file)
    });
    let (corpus, vocab, describe) = match tokenizer {
        Some(file) => {
            let (corpus, vocab) = tokenized(args, path, &file, vocab, seq_len)?;
            (
                corpus,
                vocab,
                format!("seq_len={seq_len} tokenizer={}", file.display()),
            )
        }
        None => {
            let vocab = vocab.unwrap_or(BYTE_VOCAB);
            if vocab < BYTE_VOCAB {
                return Err(format!(
                    "the model's vocabulary of {vocab} cannot take bytes: give --tokenizer"
                ));
            }
            let corpus = match args.separator.as_deref() {
                Some("") => TextCorpus::from_file(path, seq_len),
                separator => {
                    let separator = separator
                        .map(|s| unescape(s).into_bytes())
                        .unwrap_or_else(|| PARAGRAPH_SEPARATOR.to_vec());
                    TextCorpus::packed_from_file(path, seq_len, &separator)
                }
            }
            .map_err(|e| e.to_string())?;
            (corpus, vocab, format!("seq_len={seq_len} bytes"))
        }
    };
    use burn::data::dataset::InMemDataset;
    Ok(TaskData {
        train: Box::new(InMemDataset::new(corpus.train)),
        valid: Box::new(InMemDataset::new(corpus.valid)),
        test: Box::new(InMemDataset::new(corpus.test)),
        vocab,
        ignore_index: None,
        describe,
    })
}

/// The documents of `path` (each file one, or split at --separator) tokenized with the
/// `tokenizer.json` `file`, for a model of `vocab` tokens (default: the tokenizer's).
#[cfg(feature = "tokenizer")]
fn tokenized(
    args: &Args,
    path: &Path,
    file: &Path,
    vocab: Option<usize>,
    seq_len: usize,
) -> Result<(TextCorpus, usize), String> {
    use mamba2_burn::data::tokens::TokenizedText;
    use mamba2_burn::tokenizer::Tokenizer;
    let tokenizer = Tokenizer::from_file(file).map_err(|e| e.to_string())?;
    let vocab = vocab.unwrap_or(tokenizer.vocab_size());
    let separator = args.separator.as_deref().map(unescape);
    let text = TokenizedText {
        path,
        tokenizer: &tokenizer,
        vocab,
        seq_len,
        separator: separator.as_deref().filter(|s| !s.is_empty()),
        end_of_text: None,
    };
    let corpus = TextCorpus::tokenized(&text).map_err(|e| e.to_string())?;
    Ok((corpus, vocab))
}

#[cfg(not(feature = "tokenizer"))]
fn tokenized(
    _: &Args,
    _: &Path,
    file: &Path,
    _: Option<usize>,
    _: usize,
) -> Result<(TextCorpus, usize), String> {
    Err(format!(
        "tokenizing --text with {} needs the `tokenizer` feature",
        file.display()
    ))
}

/// Trains on a token task and prints its held-out scores.
pub fn run<B: SsdAutodiffBackend>(
    args: &Args,
    devices: TrainDevices<B>,
) -> Result<(), Box<dyn std::error::Error>> {
    let start = Instant::now();
    let mut d = defaults(args.task, args.preset);
    if args.task == Task::Mqar {
        // attention learns recall after a plateau of several epochs, which Mamba-2's 12 do not
        // always outlast (docs/hybrids.md, Training)
        d.epochs = mqar_epochs(&args.model, d.epochs);
    }
    let lora = lora_config(args)?;
    if args.init_from.is_some() {
        check_fine_tune(args)?;
        d.lr = if lora.is_some() {
            LORA_LR
        } else {
            FINE_TUNE_LR
        };
    }
    let seq_len = args.seq_len.unwrap_or(d.seq_len);
    let data = task_data(args, &d, seq_len)?;
    let batch_size = args.batch_size.unwrap_or(d.batch_size);
    let epochs = epochs_for(args, &d, data.train.len(), batch_size);
    let mut run = RunConfig::new(args.lr.unwrap_or(d.lr))
        .with_optimizer(optimizer(args))
        .with_batch_size(batch_size)
        .with_epochs(epochs)
        .with_seed(args.seed)
        .with_step_threads(step_threads(args))
        .with_mixed_precision(args.mixed_precision());
    if let Some(warmup) = args.warmup {
        run = run.with_warmup_fraction(warmup);
    }
    let text = |e: mamba2_burn::Mamba2Error| e.to_string();
    if let Some(dir) = &args.init_from {
        let run = (run, Some(dir.as_path()), lora);
        return match is_hybrid_folder(dir).map_err(text)? {
            true => {
                let model = HybridSpec::from_folder(dir).map_err(text)?;
                train_and_score(args, model, run, data, devices, start)
            }
            false => {
                let model = Mamba2LmConfig::from_folder(dir).map_err(text)?;
                train_and_score(args, model, run, data, devices, start)
            }
        };
    }
    match hybrid_spec(args, data.vocab)? {
        Some(spec) => train_and_score(args, spec, (run, None, None), data, devices, start),
        None => {
            let model = Mamba2LmConfig::new(backbone_config(args, &d)?, data.vocab)
                .with_pad_vocab_size_multiple(8);
            train_and_score(args, model, (run, None, None), data, devices, start)
        }
    }
}

/// Trains the model of `model` on `data` (from the weights of the folder `run.1`, if any, with
/// the low-rank adapters `run.2`, if any) and prints its held-out scores.
fn train_and_score<B, M>(
    args: &Args,
    model: M,
    (run, init_from, lora): (RunConfig, Option<&Path>, Option<LoraConfig>),
    data: TaskData,
    devices: TrainDevices<B>,
    start: Instant,
) -> Result<(), Box<dyn std::error::Error>>
where
    B: SsdAutodiffBackend,
    M: LmConfig,
    M::Model<B>: SupervisedModel<B, Batch = LmBatch<B>, Output = SequenceOutput<B>>
        + AutodiffModule<B, InnerModule = M::Model<B::InnerBackend>>,
    M::Model<B::InnerBackend>: SupervisedModel<
            B::InnerBackend,
            Batch = LmBatch<B::InnerBackend>,
            Output = SequenceOutput<B::InnerBackend>,
        > + LanguageModel<B::InnerBackend>,
{
    // the trained model comes back on the first device, where it is scored
    let device = devices.main().clone();
    let batch_size = run.batch_size;
    let epochs = run.epochs;
    let config = LanguageModelTraining::new(model)
        .with_run(run)
        .with_ignore_index(data.ignore_index)
        .with_init_from(init_from.map(Path::to_path_buf))
        .with_lora(lora);
    let task_name = format!("{:?}", args.task).to_lowercase();
    let artifacts = artifacts_dir(args, &task_name);
    let model_name = match init_from {
        Some(dir) => dir.display().to_string(),
        None => args.model.clone(),
    };
    println!(
        "task {task_name} ({}); model {model_name}; {} training sequences x {epochs} epochs, batch {batch_size} on {} threads x {} devices; artifacts in {}",
        data.describe,
        data.train.len(),
        config.run.step_threads,
        args.devices,
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
    let valid: Arc<dyn Dataset<SequenceItem>> = Arc::from(valid);
    let threads = config.run.step_threads;
    let score = |model: &M::Model<B::InnerBackend>, data: &Arc<dyn Dataset<SequenceItem>>| {
        evaluate_lm(model, data, 64, ignore_index, threads, &device)
    };
    // a fine-tune's starting point, scored as its result will be
    let before = match init_from {
        Some(dir) => {
            let start = config.model.load_model::<B::InnerBackend>(dir, &device)?;
            let scores = score(&start, &valid)?;
            println!(
                "before fine-tuning: validation loss={:.4} perplexity={:.3}",
                scores.loss, scores.perplexity
            );
            Some(scores)
        }
        None => None,
    };
    let model = train_lm::<B, M, _, _>(
        &config,
        train,
        valid.clone(),
        &artifacts,
        args.resume,
        progress,
        devices,
    )?;
    let test: Arc<dyn Dataset<SequenceItem>> = Arc::from(test);
    let scores = score(&model, &test)?;
    let elapsed = start.elapsed().as_secs_f64();
    let mut metrics = match args.task {
        Task::Lm => format!(
            "loss={:.4} perplexity={:.3}",
            scores.loss, scores.perplexity
        ),
        _ => format!("accuracy={:.4} loss={:.4}", scores.accuracy, scores.loss),
    };
    if let Some(before) = before {
        let after = score(&model, &valid)?;
        println!(
            "after fine-tuning: validation loss={:.4} perplexity={:.3}",
            after.loss, after.perplexity
        );
        metrics += &format!(
            " valid_loss_before={:.4} valid_loss_after={:.4}",
            before.loss, after.loss
        );
    }
    println!(
        "result: task={task_name} model={model_name} {metrics} {describe} elapsed_s={elapsed:.1}"
    );
    Ok(())
}
