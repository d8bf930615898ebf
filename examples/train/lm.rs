//! The token tasks (MQAR, selective copying, a byte-level language model): their data and run.

use std::time::Instant;

use burn::data::dataset::Dataset;
use burn::module::AutodiffModule;
use burn::train::SequenceOutput;
use mamba2_burn::data::copy::{self, CopyConfig};
use mamba2_burn::data::mqar::{self, MqarConfig};
use mamba2_burn::data::text::{ByteCorpus, BYTE_VOCAB, PARAGRAPH_SEPARATOR};
use mamba2_burn::data::{GeneratedDataset, SequenceItem};
use mamba2_burn::train::{
    evaluate_lm, train_lm, LanguageModel, LanguageModelTraining, LmBatch, LmConfig, RunConfig,
    SupervisedModel, TrainDevices,
};
use mamba2_burn::Mamba2LmConfig;
use mamba2_burn::SsdAutodiffBackend;

use crate::args::{
    artifacts_dir, backbone_config, defaults, epochs_for, hybrid_spec, mqar_epochs, optimizer,
    progress_mode, step_threads, unescape, Args, Defaults, Preset, Task,
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
    let seq_len = args.seq_len.unwrap_or(d.seq_len);
    let data = task_data(args, &d, seq_len)?;
    let batch_size = args.batch_size.unwrap_or(d.batch_size);
    let epochs = epochs_for(args, &d, data.train.len(), batch_size);
    let run = RunConfig::new(args.lr.unwrap_or(d.lr))
        .with_optimizer(optimizer(args))
        .with_batch_size(batch_size)
        .with_epochs(epochs)
        .with_seed(args.seed)
        .with_step_threads(step_threads(args))
        .with_mixed_precision(args.mixed_precision());
    match hybrid_spec(args, data.vocab)? {
        Some(spec) => train_and_score(args, spec, run, data, devices, start),
        None => {
            let model = Mamba2LmConfig::new(backbone_config(args, &d)?, data.vocab)
                .with_pad_vocab_size_multiple(8);
            train_and_score(args, model, run, data, devices, start)
        }
    }
}

/// Trains the model of `model` on `data` and prints its held-out scores.
fn train_and_score<B, M>(
    args: &Args,
    model: M,
    run: RunConfig,
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
        .with_ignore_index(data.ignore_index);
    let task_name = format!("{:?}", args.task).to_lowercase();
    let artifacts = artifacts_dir(args, &task_name);
    println!(
        "task {task_name} ({}); model {}; {} training sequences x {epochs} epochs, batch {batch_size} on {} threads x {} devices; artifacts in {}",
        data.describe,
        args.model,
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
    let model = train_lm::<B, M, _, _>(
        &config,
        train,
        valid,
        &artifacts,
        args.resume,
        progress,
        devices,
    )?;
    let scores = evaluate_lm(
        &model,
        &test,
        64,
        ignore_index,
        config.run.step_threads,
        &device,
    )?;
    let elapsed = start.elapsed().as_secs_f64();
    let metrics = match args.task {
        Task::Lm => format!(
            "loss={:.4} perplexity={:.3}",
            scores.loss, scores.perplexity
        ),
        _ => format!("accuracy={:.4} loss={:.4}", scores.accuracy, scores.loss),
    };
    println!(
        "result: task={task_name} model={} {metrics} {describe} elapsed_s={elapsed:.1}",
        args.model
    );
    Ok(())
}
