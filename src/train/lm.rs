//! The language models' training run and held-out scores, for any model a [`LmConfig`] builds:
//! [`Mamba2Lm`] from a [`Mamba2LmConfig`], [`HybridLm`] from a [`HybridSpec`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::data::dataset::Dataset;
use burn::module::{AutodiffModule, Module, ModuleDisplay};
use burn::tensor::backend::Backend;
use burn::tensor::ElementConversion;
use burn::train::metric::{AccuracyMetric, LossMetric, PerplexityMetric};
use burn::train::SequenceOutput;

use super::batch::{LmBatch, SequenceBatcher};
use super::config::{training_config_io, RunConfig};
use super::devices::TrainDevices;
use super::parallel::{parallel_map, split_rows};
use super::run::{launch, ProgressMode, Run, RunData};
use super::step::{LanguageModel, SupervisedModel};
use crate::checkpoint::{
    load_hybrid, load_lm, read_config, save_checkpoint, save_hybrid, save_hybrid_lora_adapter,
    save_lora_adapter, CheckpointFormat, HybridSpec,
};
use crate::data::SequenceItem;
use crate::error::Mamba2Error;
use crate::layers::lora::LoraConfig;
use crate::models::hybrid::HybridLm;
use crate::models::lm::{check_in_vocab, Mamba2Lm, Mamba2LmConfig};
use crate::ssd::{SsdAutodiffBackend, SsdBackend};

/// The config of the model a language-model run trains: it checks itself, builds the model,
/// and saves the trained one as a checkpoint folder. [`Mamba2LmConfig`] builds a [`Mamba2Lm`]
/// (saved by [`save_checkpoint`]), [`HybridSpec`] a [`HybridLm`] (saved by [`save_hybrid`] as
/// transformers' folder of its family).
pub trait LmConfig:
    Clone + core::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static
{
    /// The model on backend `B`.
    type Model<B: Backend>: Module<B> + ModuleDisplay;

    /// Checks the config.
    fn check(&self) -> crate::error::Result<()>;

    /// The token ids the model takes: `0..vocab`.
    fn vocab(&self) -> crate::error::Result<usize>;

    /// `model` prepared for fine-tuning with low-rank adapters: its parameters frozen, updates
    /// beside the projections `lora` targets ([`Mamba2Lm::with_lora`],
    /// [`HybridLm::with_lora`]).
    fn with_lora<B: Backend>(
        &self,
        model: Self::Model<B>,
        lora: &LoraConfig,
    ) -> crate::error::Result<Self::Model<B>>;

    /// A model with fresh weights on `device`.
    fn init_model<B: SsdBackend>(&self, device: &B::Device)
        -> crate::error::Result<Self::Model<B>>;

    /// The config of the model in the checkpoint folder `dir` (from its `config.json`).
    fn from_folder(dir: &Path) -> crate::error::Result<Self>;

    /// The model of the checkpoint folder `dir` on `device`, its weights as saved; an
    /// [`InvalidConfig`](Mamba2Error::InvalidConfig) error naming `init_from` if the folder
    /// holds another model than this config's.
    fn load_model<B: SsdBackend>(
        &self,
        dir: &Path,
        device: &B::Device,
    ) -> crate::error::Result<Self::Model<B>>;

    /// Writes the low-rank adapters of `model` (fine-tuned with `lora`) to the folder `dir` in
    /// PEFT's layout, named as the files of the checkpoint folder `like` name the modules
    /// where given, else as transformers' ([`save_lora_adapter`],
    /// [`save_hybrid_lora_adapter`]).
    fn save_adapter<B: Backend>(
        &self,
        model: &Self::Model<B>,
        lora: &LoraConfig,
        dir: &Path,
        like: Option<&Path>,
    ) -> crate::error::Result<()>;

    /// Writes `model` to the folder `dir`, in the layout of the checkpoint folder `like` where
    /// given (the folder a fine-tune started from), else in the model's own.
    fn save_model<B: SsdBackend>(
        &self,
        model: &Self::Model<B>,
        dir: &Path,
        like: Option<&Path>,
    ) -> crate::error::Result<()>;
}

impl LmConfig for Mamba2LmConfig {
    type Model<B: Backend> = Mamba2Lm<B>;

    fn check(&self) -> crate::error::Result<()> {
        self.validate()
    }

    fn vocab(&self) -> crate::error::Result<usize> {
        Ok(self.padded_vocab_size())
    }

    fn with_lora<B: Backend>(
        &self,
        model: Mamba2Lm<B>,
        lora: &LoraConfig,
    ) -> crate::error::Result<Mamba2Lm<B>> {
        model.with_lora(lora)
    }

    fn init_model<B: SsdBackend>(&self, device: &B::Device) -> crate::error::Result<Mamba2Lm<B>> {
        self.init(device)
    }

    fn from_folder(dir: &Path) -> crate::error::Result<Self> {
        read_config(dir).map(|(config, _)| config)
    }

    fn load_model<B: SsdBackend>(
        &self,
        dir: &Path,
        device: &B::Device,
    ) -> crate::error::Result<Mamba2Lm<B>> {
        check_same_model(&Self::from_folder(dir)?, self, dir)?;
        load_lm(dir, device)
    }

    fn save_model<B: SsdBackend>(
        &self,
        model: &Mamba2Lm<B>,
        dir: &Path,
        like: Option<&Path>,
    ) -> crate::error::Result<()> {
        // a fine-tuned published model goes back in the layout it was published in
        let format = match like {
            Some(folder) => read_config(folder)?.1,
            None => CheckpointFormat::Burn,
        };
        save_checkpoint(model, self, dir, format).map(drop)
    }

    fn save_adapter<B: Backend>(
        &self,
        model: &Mamba2Lm<B>,
        lora: &LoraConfig,
        dir: &Path,
        like: Option<&Path>,
    ) -> crate::error::Result<()> {
        let format = match like {
            Some(folder) => read_config(folder)?.1,
            None => CheckpointFormat::HuggingFace,
        };
        let base = like.map(|p| p.display().to_string());
        save_lora_adapter(model, lora, format, base.as_deref(), dir).map(drop)
    }
}

impl LmConfig for HybridSpec {
    type Model<B: Backend> = HybridLm<B>;

    fn check(&self) -> crate::error::Result<()> {
        self.init_config().map(drop)
    }

    fn vocab(&self) -> crate::error::Result<usize> {
        Ok(self.config()?.vocab_size)
    }

    fn with_lora<B: Backend>(
        &self,
        model: HybridLm<B>,
        lora: &LoraConfig,
    ) -> crate::error::Result<HybridLm<B>> {
        model.with_lora(lora)
    }

    fn init_model<B: SsdBackend>(&self, device: &B::Device) -> crate::error::Result<HybridLm<B>> {
        self.init_config()?.init(device)
    }

    fn from_folder(dir: &Path) -> crate::error::Result<Self> {
        HybridSpec::from_file(dir)
    }

    fn load_model<B: SsdBackend>(
        &self,
        dir: &Path,
        device: &B::Device,
    ) -> crate::error::Result<HybridLm<B>> {
        // the models compared, not the texts (key order, spacing, fields that change nothing)
        check_same_model(&Self::from_folder(dir)?.config()?, &self.config()?, dir)?;
        load_hybrid(dir, device)
    }

    fn save_model<B: SsdBackend>(
        &self,
        model: &HybridLm<B>,
        dir: &Path,
        _like: Option<&Path>,
    ) -> crate::error::Result<()> {
        // a hybrid has one layout, transformers' folder of its family
        save_hybrid(model, &self.config_json, dir).map(drop)
    }

    fn save_adapter<B: Backend>(
        &self,
        model: &HybridLm<B>,
        lora: &LoraConfig,
        dir: &Path,
        like: Option<&Path>,
    ) -> crate::error::Result<()> {
        let base = like.map(|p| p.display().to_string());
        save_hybrid_lora_adapter(model, &self.config()?, lora, base.as_deref(), dir).map(drop)
    }
}

/// An [`InvalidConfig`](Mamba2Error::InvalidConfig) error naming `init_from` unless the model of
/// the folder `dir`, `found`, is the run's, `expected` (compared as their serialized fields).
fn check_same_model<C: serde::Serialize>(
    found: &C,
    expected: &C,
    dir: &Path,
) -> crate::error::Result<()> {
    let fields = |c: &C| serde_json::to_value(c).expect("configs serialize");
    let (found, expected) = (fields(found), fields(expected));
    if found == expected {
        return Ok(());
    }
    let differ: Vec<String> = match (found.as_object(), expected.as_object()) {
        (Some(f), Some(e)) => e
            .keys()
            .chain(f.keys())
            .filter(|k| f.get(*k) != e.get(*k))
            .cloned()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect(),
        _ => Vec::new(),
    };
    Err(Mamba2Error::config(
        "init_from",
        format!(
            "{} holds another model than the run's (fields that differ: {})",
            dir.display(),
            differ.join(", ")
        ),
    ))
}

/// Configuration of a language-model training run (saved as `config.json` in its artifacts):
/// the model's config, where its weights start, the run's settings, the unscored target.
/// [`LmTrainingConfig`] trains a [`Mamba2Lm`], [`HybridTrainingConfig`] a [`HybridLm`].
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(bound = "M: LmConfig")]
pub struct LanguageModelTraining<M> {
    /// The model.
    pub model: M,
    /// The optimizer, schedule, batch size, epochs, seed and threads. Default:
    /// `RunConfig::new(3e-3)` (peak learning rate 3e-3).
    pub run: RunConfig,
    /// Target id of unscored positions (`None`: all positions are scored). Default: None.
    pub ignore_index: Option<usize>,
    /// The checkpoint folder whose weights start the run (a published model, a run's `model/`):
    /// fine-tuning. It must hold `model`'s model ([`LmConfig::load_model`]). `None`: fresh
    /// weights ([`LmConfig::init_model`]). Default: None.
    #[serde(default)]
    pub init_from: Option<PathBuf>,
    /// Low-rank adapters to train in place of the model's weights, which stay frozen (LoRA:
    /// the optimizer keeps state for the adapters alone); `model/` gets them folded into the
    /// weights. `None`: every parameter trains. Default: None.
    #[serde(default)]
    pub lora: Option<LoraConfig>,
}

/// The peak learning rate of a language-model run unless set.
const DEFAULT_LR: f64 = 3e-3;

/// The training run of a [`Mamba2Lm`].
pub type LmTrainingConfig = LanguageModelTraining<Mamba2LmConfig>;

/// The training run of a [`HybridLm`].
pub type HybridTrainingConfig = LanguageModelTraining<HybridSpec>;

impl<M: LmConfig> LanguageModelTraining<M> {
    /// A run of `model` with the default run settings.
    pub fn new(model: M) -> Self {
        Self {
            model,
            run: RunConfig::new(DEFAULT_LR),
            ignore_index: None,
            init_from: None,
            lora: None,
        }
    }

    /// A run that fine-tunes the model of the checkpoint folder `dir`: its config read from
    /// the folder, its weights the folder's ([`init_from`](Self::init_from)).
    pub fn from_checkpoint(dir: impl AsRef<Path>) -> crate::error::Result<Self> {
        let dir = dir.as_ref();
        Ok(Self::new(M::from_folder(dir)?).with_init_from(Some(dir.to_path_buf())))
    }

    /// With the run's weights starting from this checkpoint folder (`None`: fresh weights).
    pub fn with_init_from(mut self, dir: Option<PathBuf>) -> Self {
        self.init_from = dir;
        self
    }

    /// With low-rank adapters trained in place of the weights (`None`: every parameter
    /// trains).
    pub fn with_lora(mut self, lora: Option<LoraConfig>) -> Self {
        self.lora = lora;
        self
    }

    /// With these run settings.
    pub fn with_run(mut self, run: RunConfig) -> Self {
        self.run = run;
        self
    }

    /// With this target id left unscored.
    pub fn with_ignore_index(mut self, ignore_index: Option<usize>) -> Self {
        self.ignore_index = ignore_index;
        self
    }
}

training_config_io!([M: LmConfig] LanguageModelTraining<M>);

/// Trains the language model of `config.model` (a [`Mamba2Lm`] from a [`Mamba2LmConfig`], a
/// [`HybridLm`] from a [`HybridSpec`]), from fresh weights or from those of the checkpoint
/// folder `config.init_from` (fine-tuning), on `train`, validating on `valid` after every epoch,
/// and leaves in `artifacts`: `config.json` (this config, `init_from` included), `checkpoint/` (model, optimizer and
/// scheduler after each epoch, written atomically), `model/` (the final model: loadable with
/// [`load_lm`](crate::load_lm), or for a hybrid transformers' folder of its family, loadable
/// with [`load_hybrid`](crate::load_hybrid) and by transformers; a fine-tune's in the layout of
/// the folder it started from, with that folder's tokenizer and generation files),
/// `adapter/` with a LoRA run's adapters in PEFT's layout (`adapter_config.json`,
/// `adapter_model.safetensors`, for `peft.PeftModel.from_pretrained` on the base model),
/// `metrics.csv` (each metric's mean per epoch and split) and Burn's per-iteration logs.
///
/// With `resume`, the run continues from the last complete checkpoint in `artifacts` (with the
/// same data order as an uninterrupted run, so it ends with the same weights); the config must
/// be the one the run started with.
///
/// A NaN or infinite loss stops the run before the bad update is applied, with
/// [`Mamba2Error::NonFiniteLoss`] naming the step and the last good checkpoint.
///
/// `devices` is one device (`&device`) or several ([`TrainDevices::multi`], Burn's
/// multi-device strategy: `batch_size` is then each device's batch, and a step averages the
/// devices' gradients; [`TrainDevices`] says more). The model returned is on the first device.
pub fn train_lm<B, M, D, V>(
    config: &LanguageModelTraining<M>,
    train: D,
    valid: V,
    artifacts: &Path,
    resume: bool,
    progress: ProgressMode,
    devices: impl Into<TrainDevices<B>>,
) -> crate::error::Result<M::Model<B::InnerBackend>>
where
    B: SsdAutodiffBackend,
    M: LmConfig,
    M::Model<B>: SupervisedModel<B, Batch = LmBatch<B>, Output = SequenceOutput<B>>
        + AutodiffModule<B, InnerModule = M::Model<B::InnerBackend>>,
    M::Model<B::InnerBackend>: SupervisedModel<
        B::InnerBackend,
        Batch = LmBatch<B::InnerBackend>,
        Output = SequenceOutput<B::InnerBackend>,
    >,
    D: Dataset<SequenceItem> + 'static,
    V: Dataset<SequenceItem> + 'static,
{
    config.model.check()?;
    // token ids are checked here, on the host, once: the model's forward does not read them back
    let vocab = config.model.vocab()?;
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
    let run = Run {
        config: &config.run,
        artifacts,
        resume,
        progress,
    };
    if let Some(lora) = &config.lora {
        lora.validate()?;
    }
    let init = |device: &B::Device| {
        let model = match &config.init_from {
            Some(dir) => config.model.load_model::<B>(dir, device),
            None => config.model.init_model::<B>(device),
        }?;
        match &config.lora {
            Some(lora) => config.model.with_lora(model, lora),
            None => Ok(model),
        }
    };
    let model = launch(&run, config, init, data, devices.into(), |training, _| {
        training
            .metric_train_numeric(LossMetric::new())
            .metric_valid_numeric(LossMetric::new())
            .metric_train_numeric(accuracy())
            .metric_valid_numeric(accuracy())
            .metric_valid_numeric(perplexity())
    })?;
    let saved = artifacts.join("model");
    let init_from = config.init_from.as_deref();
    config.model.save_model(&model, &saved, init_from)?;
    if let Some(lora) = &config.lora {
        let adapter = artifacts.join("adapter");
        config
            .model
            .save_adapter(&model, lora, &adapter, init_from)?;
    }
    if let Some(dir) = init_from {
        copy_tokenizer_files(dir, &saved)?;
    }
    Ok(model)
}

/// The files of a checkpoint folder that describe its tokenizer and generation, as transformers
/// saves them beside the weights.
const TOKENIZER_FILES: [&str; 4] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
];

/// Copies those of [`TOKENIZER_FILES`] that `from` has into `to`: a fine-tuned folder
/// tokenizes and generates as the one it started from.
fn copy_tokenizer_files(from: &Path, to: &Path) -> crate::error::Result<()> {
    for name in TOKENIZER_FILES {
        let file = from.join(name);
        if file.is_file() {
            std::fs::copy(&file, to.join(name)).map_err(|e| Mamba2Error::file(&file, e))?;
        }
    }
    Ok(())
}

/// Checks every item of `data`: inputs in `[0, vocab)`, targets too or equal to `ignore_index`.
fn check_sequence_tokens<D: Dataset<SequenceItem>>(
    data: &D,
    name: &'static str,
    vocab: usize,
    ignore_index: Option<usize>,
) -> crate::error::Result<()> {
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
pub fn evaluate_lm<B, M, D>(
    model: &M,
    dataset: &D,
    batch_size: usize,
    ignore_index: Option<usize>,
    threads: usize,
    device: &B::Device,
) -> crate::error::Result<LmScores>
where
    B: SsdBackend,
    M: LanguageModel<B> + Clone + Send,
    D: Dataset<SequenceItem>,
{
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
    let groups: Vec<(M, Vec<Vec<SequenceItem>>)> = split_rows(batches.len(), threads)
        .into_iter()
        .map(|(_, len)| (model.clone(), batches.by_ref().take(len).collect()))
        .collect();
    let add =
        |(n1, c1, k1): (f64, i64, i64), (n2, c2, k2): (f64, i64, i64)| (n1 + n2, c1 + c2, k1 + k2);
    let zero = (0.0f64, 0i64, 0i64);
    let (nll_sum, correct, count) = parallel_map(groups, |(model, batches)| {
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
fn score_batch<B: SsdBackend, M: LanguageModel<B>>(
    model: &M,
    items: Vec<SequenceItem>,
    ignore_index: Option<usize>,
    device: &B::Device,
) -> crate::error::Result<(f64, i64, i64)> {
    use crate::layers::activation::log_softmax;
    use burn::data::dataloader::batcher::Batcher;
    let batch: LmBatch<B> = SequenceBatcher { ignore_index }.batch(items, device);
    let logits = model.logits(batch.inputs, batch.documents.as_ref())?;
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
