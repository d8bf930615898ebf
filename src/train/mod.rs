//! Training with Burn's `Learner`: `TrainStep` / `InferenceStep` for the language model, the
//! regressor and the forecaster, the optimizer the reference trains with, and a warmup + cosine
//! schedule.
//!
//! The model types themselves implement the steps, so that a Burn training loop takes them
//! as they are. Each implements [`SupervisedModel`] (its batch, its loss, how the batch splits
//! over threads), and one generic step, [`train_step`] / [`inference_step`], serves all three:
//!
//! - [`crate::Mamba2Lm`] on an [`LmBatch`]: next-token cross-entropy (positions whose
//!   target is `ignore_index` are not scored), output [`SequenceOutput`] for Burn's loss,
//!   accuracy and perplexity metrics;
//! - [`crate::Mamba2Regressor`] on a [`RegressionBatch`]: mean squared error of
//!   the prediction at the last time step, output [`RegressionOutput`];
//! - [`crate::Mamba2Forecaster`] on a [`ForecastBatch`]: the batch's
//!   [`ForecastLoss`] over the forecast horizon, output [`RegressionOutput`].
//!
//! [`train_lm`] and [`train_forecaster`] run a whole training with checkpoints, resume and
//! artifacts.
//!
//! On CPU backends, [`Threaded`] around a model spreads every batch over threads (row slices
//! with their own autodiff graphs, gradients summed with the whole batch's loss weights; see
//! [`parallel_backward`]), which keeps the cores busy that burn-ndarray's mostly
//! single-threaded element-wise kernels leave idle. The models themselves carry no thread
//! count.

mod forecast;
mod optim;
mod parallel;
mod progress;
mod runner;
mod schedule;
mod stopping;
mod threaded;

pub use forecast::{
    direction_accuracy, evaluate_forecaster, load_forecaster, save_forecaster, train_forecaster,
    ForecastScores, ForecastTrainingConfig,
};
pub use optim::{Mamba2Optimizer, Mamba2OptimizerConfig, MixedRecord, NonFiniteGuard};
pub use parallel::{parallel_backward, parallel_forward, parallel_map, split_rows, BatchPart};
pub use progress::PlainProgress;
pub use runner::{
    checkpoint_epochs, evaluate_lm, train_lm, LmScores, LmTrainingConfig, ProgressMode,
};
pub use schedule::WarmupCosineLr;
pub use stopping::{KeepBestAndLast, ValidLossStopping};
pub use threaded::Threaded;

use crate::activation::log_softmax;
use crate::{SsdAutodiffBackend, SsdBackend};
use burn::module::AutodiffModule;
use burn::nn::loss::{MseLoss, Reduction};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor};
use burn::train::{InferenceStep, RegressionOutput, SequenceOutput, TrainOutput, TrainStep};

use crate::documents::Documents;
use crate::forecaster::Mamba2Forecaster;
use crate::lm::Mamba2Lm;
use crate::regressor::Mamba2Regressor;

/// A batch of token sequences for next-token training.
#[derive(Clone, Debug)]
pub struct LmBatch<B: Backend> {
    /// Input token ids `[b, l]`.
    pub inputs: Tensor<B, 2, Int>,
    /// Target token ids `[b, l]` (the token that follows each input position).
    pub targets: Tensor<B, 2, Int>,
    /// Target id of positions that are not scored (`None`: all are).
    pub ignore_index: Option<usize>,
    /// The documents packed in each row (`None`: one per row).
    pub documents: Option<Documents<B>>,
}

impl<B: Backend> LmBatch<B> {
    /// Cuts the batch into at most `parts` slices of nearly equal rows, each weighted by its
    /// share of the batch's scored positions (the slices' mean losses, so weighted, add up to
    /// the batch's mean loss).
    pub fn split(&self, parts: usize) -> Vec<BatchPart<LmBatch<B>>> {
        let [b, l] = self.targets.dims();
        let rows = split_rows(b, parts);
        if rows.len() <= 1 {
            return vec![BatchPart {
                input: self.clone(),
                weight: 1.0,
            }];
        }
        // scored positions per row
        let per_row: Vec<usize> = match self.ignore_index {
            None => vec![l; b],
            Some(ignore) => {
                let targets = self.targets.to_data().convert::<i64>();
                let targets = targets.as_slice::<i64>().unwrap_or(&[]);
                targets
                    .chunks(l.max(1))
                    .map(|row| row.iter().filter(|&&t| t != ignore as i64).count())
                    .collect()
            }
        };
        let total: usize = per_row.iter().sum();
        rows.into_iter()
            .map(|(start, len)| {
                let scored: usize = per_row.iter().skip(start).take(len).sum();
                let weight = if total == 0 {
                    len as f64 / b as f64
                } else {
                    scored as f64 / total as f64
                };
                BatchPart {
                    input: LmBatch {
                        inputs: self.inputs.clone().narrow(0, start, len),
                        targets: self.targets.clone().narrow(0, start, len),
                        ignore_index: self.ignore_index,
                        documents: self.documents.as_ref().map(|d| d.narrow_rows(start, len)),
                    },
                    weight,
                }
            })
            .collect()
    }
}

impl<B: SsdBackend> Mamba2Lm<B> {
    /// Logits and the mean cross-entropy over the scored positions of `batch`.
    ///
    /// # Shapes
    /// - batch inputs and targets `[b, l]`; returns the loss `[1]` and logits `[b, l, vocab]`
    ///
    /// # Panics
    /// If the batch holds token ids outside the vocabulary (a data error that a training step
    /// cannot return).
    pub fn forward_loss(&self, batch: &LmBatch<B>) -> SequenceOutput<B> {
        let (logits, _) = self
            .forward_inner(batch.inputs.clone(), batch.documents.as_ref(), None)
            .unwrap_or_else(|e| panic!("training batch rejected: {e}"));
        let loss = masked_cross_entropy(logits.clone(), batch.targets.clone(), batch.ignore_index);
        SequenceOutput::new(loss, logits, None, batch.targets.clone())
    }
}

/// Cuts a batch whose loss is a mean over equal-sized rows (MSE) into at most `parts` slices of
/// nearly equal rows, each weighted by its share of the rows.
fn row_parts<B: Backend, const DI: usize, const DT: usize, I>(
    inputs: &Tensor<B, DI>,
    targets: &Tensor<B, DT>,
    parts: usize,
    make: impl Fn(Tensor<B, DI>, Tensor<B, DT>) -> I,
) -> Vec<BatchPart<I>> {
    let b = inputs.dims()[0];
    split_rows(b, parts)
        .into_iter()
        .map(|(start, len)| BatchPart {
            input: make(
                inputs.clone().narrow(0, start, len),
                targets.clone().narrow(0, start, len),
            ),
            weight: len as f64 / b as f64,
        })
        .collect()
}

/// A model that Burn's `Learner` trains on one kind of batch: the one training and inference
/// step of this crate ([`train_step`], [`inference_step`]) runs any of them, on one thread or
/// with the batch spread over threads ([`Threaded`]).
pub trait SupervisedModel<B: Backend> {
    /// The batch the model learns from.
    type Batch: Send;
    /// The step's output: the loss and what Burn's metrics read.
    type Output: StepOutput<B> + Send;

    /// The batch's output, with its mean loss.
    fn batch_output(&self, batch: &Self::Batch) -> Self::Output;

    /// The batch cut into at most `parts` slices for as many threads (one slice: no threads),
    /// each weighted by its share of the batch's mean loss.
    fn split_batch(batch: &Self::Batch, parts: usize) -> Vec<BatchPart<Self::Batch>>;
}

/// A step output made of slices: its loss, and the whole batch's output from its slices'.
pub trait StepOutput<B: Backend>: Sized {
    /// The mean loss `[1]`.
    fn loss(&self) -> Tensor<B, 1>;

    /// The batch's output from its slices' outputs (in slice order) and the batch's loss.
    fn merge(loss: Tensor<B, 1>, parts: Vec<Self>) -> Self;
}

impl<B: Backend> StepOutput<B> for SequenceOutput<B> {
    fn loss(&self) -> Tensor<B, 1> {
        self.loss.clone()
    }

    /// The slices' logits (detached) and targets concatenated.
    fn merge(loss: Tensor<B, 1>, parts: Vec<Self>) -> Self {
        let (logits, targets): (Vec<_>, Vec<_>) = parts
            .into_iter()
            .map(|part| (part.logits.detach(), part.targets))
            .unzip();
        SequenceOutput::new(loss, Tensor::cat(logits, 0), None, Tensor::cat(targets, 0))
    }
}

impl<B: Backend> StepOutput<B> for RegressionOutput<B> {
    fn loss(&self) -> Tensor<B, 1> {
        self.loss.clone()
    }

    /// The slices' outputs (detached) and targets concatenated.
    fn merge(loss: Tensor<B, 1>, parts: Vec<Self>) -> Self {
        let (outputs, targets): (Vec<_>, Vec<_>) = parts
            .into_iter()
            .map(|part| (part.output.detach(), part.targets))
            .unzip();
        RegressionOutput::new(loss, Tensor::cat(outputs, 0), Tensor::cat(targets, 0))
    }
}

/// The training step of every model of this crate: forward and backward of the batch, or, with
/// `threads` above 1, of its slices on that many threads with the gradients summed
/// ([`parallel_backward`]).
pub fn train_step<B, M>(model: &M, batch: M::Batch, threads: usize) -> TrainOutput<M::Output>
where
    B: AutodiffBackend,
    M: SupervisedModel<B> + AutodiffModule<B> + Send,
{
    let parts = M::split_batch(&batch, threads);
    if parts.len() <= 1 {
        let output = model.batch_output(&batch);
        return TrainOutput::new(model, output.loss().backward(), output);
    }
    let (grads, loss, outputs) = parallel_backward(model, parts, |model, part| {
        let output = model.batch_output(&part);
        (output.loss(), output)
    });
    TrainOutput {
        grads,
        item: M::Output::merge(loss, outputs),
    }
}

/// The inference (validation) step of every model of this crate: the batch's output, or, with
/// `threads` above 1, its slices' on that many threads ([`parallel_forward`]).
pub fn inference_step<B, M>(model: &M, batch: M::Batch, threads: usize) -> M::Output
where
    B: Backend,
    M: SupervisedModel<B> + Clone + Send,
{
    let parts = M::split_batch(&batch, threads);
    if parts.len() <= 1 {
        return model.batch_output(&batch);
    }
    let (loss, outputs) = parallel_forward(model, parts, |model, part| {
        let output = model.batch_output(&part);
        (output.loss(), output)
    });
    M::Output::merge(loss, outputs)
}

/// `SupervisedModel`, and the one-thread `TrainStep` and `InferenceStep`, for a model from its
/// loss function.
macro_rules! supervised {
    ($model:ident, $batch:ident, $output:ident, $loss:ident) => {
        impl<B: SsdBackend> SupervisedModel<B> for $model<B> {
            type Batch = $batch<B>;
            type Output = $output<B>;

            fn batch_output(&self, batch: &$batch<B>) -> $output<B> {
                self.$loss(batch)
            }

            fn split_batch(batch: &$batch<B>, parts: usize) -> Vec<BatchPart<$batch<B>>> {
                batch.split(parts)
            }
        }

        impl<B: SsdAutodiffBackend> TrainStep for $model<B> {
            type Input = $batch<B>;
            type Output = $output<B>;

            fn step(&self, batch: $batch<B>) -> TrainOutput<$output<B>> {
                train_step(self, batch, 1)
            }
        }

        impl<B: SsdBackend> InferenceStep for $model<B> {
            type Input = $batch<B>;
            type Output = $output<B>;

            fn step(&self, batch: $batch<B>) -> $output<B> {
                inference_step(self, batch, 1)
            }
        }
    };
}

supervised!(Mamba2Lm, LmBatch, SequenceOutput, forward_loss);
supervised!(
    Mamba2Regressor,
    RegressionBatch,
    RegressionOutput,
    forward_regression
);
supervised!(
    Mamba2Forecaster,
    ForecastBatch,
    RegressionOutput,
    forward_forecast
);

/// Mean next-token cross-entropy over the positions whose target is not `ignore_index`
/// (Burn's `CrossEntropyLoss` with pad tokens divides by all positions instead).
///
/// # Shapes
/// - logits `[b, l, vocab]`, targets `[b, l]`; returns `[1]`
pub fn masked_cross_entropy<B: Backend>(
    logits: Tensor<B, 3>,
    targets: Tensor<B, 2, Int>,
    ignore_index: Option<usize>,
) -> Tensor<B, 1> {
    let [b, l, v] = logits.dims();
    let log_probs = log_softmax(logits.reshape([b * l, v]), 1);
    let targets = targets.reshape([b * l, 1]);
    let nll = log_probs.gather(1, targets.clone()).reshape([b * l]).neg();
    match ignore_index {
        None => nll.mean(),
        Some(ignore) => {
            let keep = targets
                .reshape([b * l])
                .not_equal_elem(ignore as i64)
                .float();
            let count = keep.clone().sum().clamp_min(1.0);
            (nll * keep).sum() * count.powf_scalar(-1.0)
        }
    }
}

/// A batch for sequence regression: predict `targets` from the whole input sequence.
#[derive(Clone, Debug)]
pub struct RegressionBatch<B: Backend> {
    /// Input sequences `[b, l, n_features]`.
    pub inputs: Tensor<B, 3>,
    /// Targets `[b, n_outputs]`, compared with the output at the last time step.
    pub targets: Tensor<B, 2>,
}

impl<B: Backend> RegressionBatch<B> {
    /// Cuts the batch into at most `parts` slices of nearly equal rows, each weighted by its
    /// share of the rows (the loss is a mean over equal-sized rows).
    pub fn split(&self, parts: usize) -> Vec<BatchPart<RegressionBatch<B>>> {
        row_parts(&self.inputs, &self.targets, parts, |inputs, targets| {
            RegressionBatch { inputs, targets }
        })
    }
}

impl<B: SsdBackend> Mamba2Regressor<B> {
    /// The prediction at the last time step and its mean squared error.
    ///
    /// # Shapes
    /// - inputs `[b, l, n_features]`, targets `[b, n_outputs]`
    ///
    /// # Panics
    /// If the inputs do not have `n_features` features.
    pub fn forward_regression(&self, batch: &RegressionBatch<B>) -> RegressionOutput<B> {
        let (y, _) = self
            .forward(batch.inputs.clone(), None)
            .unwrap_or_else(|e| panic!("training batch rejected: {e}"));
        let [b, l, o] = y.dims();
        let output = y.narrow(1, l - 1, 1).reshape([b, o]);
        let loss = MseLoss::new().forward(output.clone(), batch.targets.clone(), Reduction::Mean);
        RegressionOutput::new(loss, output, batch.targets.clone())
    }
}

/// A batch of forecasting windows.
#[derive(Clone, Debug)]
pub struct ForecastBatch<B: Backend> {
    /// Lookback windows `[b, lookback, n_inputs]`.
    pub inputs: Tensor<B, 3>,
    /// The values to forecast `[b, horizon, n_targets]`.
    pub targets: Tensor<B, 3>,
    /// The loss the forecast is scored with.
    pub loss: ForecastLoss,
}

/// The loss of a forecast.
#[derive(burn::config::Config, Debug, Copy, PartialEq, Eq)]
pub enum ForecastLoss {
    /// Mean squared error: the metric forecasting benchmarks report first.
    Mse,
    /// Mean absolute error: as a training objective it is less pulled by the large errors of
    /// unpredictable spikes, which often lowers the test MSE too.
    Mae,
}

impl ForecastLoss {
    /// The mean loss of `output` against `targets`.
    ///
    /// # Shapes
    /// - output, targets: `[b, n]`; returns `[1]`
    pub fn forward<B: Backend>(&self, output: Tensor<B, 2>, targets: Tensor<B, 2>) -> Tensor<B, 1> {
        match self {
            Self::Mse => MseLoss::new().forward(output, targets, Reduction::Mean),
            Self::Mae => (output - targets).abs().mean(),
        }
    }
}

impl<B: Backend> ForecastBatch<B> {
    /// Cuts the batch into at most `parts` slices of nearly equal rows, each weighted by its
    /// share of the rows (the loss is a mean over equal-sized rows).
    pub fn split(&self, parts: usize) -> Vec<BatchPart<ForecastBatch<B>>> {
        row_parts(&self.inputs, &self.targets, parts, |inputs, targets| {
            ForecastBatch {
                inputs,
                targets,
                loss: self.loss,
            }
        })
    }
}

impl<B: SsdBackend> Mamba2Forecaster<B> {
    /// The forecast and its loss (the batch's [`ForecastLoss`]), flattened to `[b, horizon ·
    /// n_targets]` for Burn's regression metrics.
    ///
    /// # Panics
    /// If the inputs do not have `n_inputs` variables.
    pub fn forward_forecast(&self, batch: &ForecastBatch<B>) -> RegressionOutput<B> {
        let y = self
            .forward(batch.inputs.clone())
            .unwrap_or_else(|e| panic!("training batch rejected: {e}"));
        let [b, h, c] = y.dims();
        let output = y.reshape([b, h * c]);
        let targets = batch.targets.clone().reshape([b, h * c]);
        let loss = batch.loss.forward(output.clone(), targets.clone());
        RegressionOutput::new(loss, output, targets)
    }
}
