//! The training and inference step of every model: the loss of each model on its batch, and one
//! generic step over them ([`train_step`], [`inference_step`]).

use burn::module::{AutodiffModule, Module};
use burn::nn::loss::{MseLoss, Reduction};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor};
use burn::train::{InferenceStep, RegressionOutput, SequenceOutput, TrainOutput, TrainStep};

use super::batch::{ForecastBatch, LmBatch, RegressionBatch};
use super::mixed::{compute_model, MixedPrecision};
use super::parallel::{parallel_backward, parallel_forward, BatchPart};
use crate::layers::activation::log_softmax;
use crate::layers::documents::Documents;
use crate::models::forecaster::Mamba2Forecaster;
use crate::models::hybrid::HybridLm;
use crate::models::lm::Mamba2Lm;
use crate::models::regressor::Mamba2Regressor;
use crate::precision::upcast;
use crate::ssd::{SsdAutodiffBackend, SsdBackend};

/// The next-token logits of a language model, which [`train_lm`](super::train_lm)'s loss and
/// [`evaluate_lm`](super::evaluate_lm) score.
pub trait LanguageModel<B: SsdBackend> {
    /// Logits for every position of fresh sequences (packed documents where `documents` is
    /// given: no state crosses a document boundary).
    ///
    /// # Shapes
    /// - ids, documents: `[b, l]`; returns `[b, l, vocab]`
    fn logits(
        &self,
        ids: Tensor<B, 2, Int>,
        documents: Option<&Documents<B>>,
    ) -> crate::error::Result<Tensor<B, 3>>;
}

impl<B: SsdBackend> LanguageModel<B> for Mamba2Lm<B> {
    fn logits(
        &self,
        ids: Tensor<B, 2, Int>,
        documents: Option<&Documents<B>>,
    ) -> crate::error::Result<Tensor<B, 3>> {
        Ok(self.forward_documents(ids, documents, None)?.0)
    }
}

impl<B: SsdBackend> LanguageModel<B> for HybridLm<B> {
    fn logits(
        &self,
        ids: Tensor<B, 2, Int>,
        documents: Option<&Documents<B>>,
    ) -> crate::error::Result<Tensor<B, 3>> {
        self.forward_documents(ids, documents)
    }
}

impl<B: Backend> Mamba2Lm<B> {
    /// Logits and the mean cross-entropy over the scored positions of `batch`.
    ///
    /// # Shapes
    /// - batch inputs and targets `[b, l]`; returns the loss `[1]` and logits `[b, l, vocab]`
    ///
    /// # Panics
    /// If the batch holds token ids outside the vocabulary (a data error that a training step
    /// cannot return).
    pub fn forward_loss(&self, batch: &LmBatch<B>) -> SequenceOutput<B>
    where
        B: SsdBackend,
    {
        lm_loss(self, batch)
    }
}

impl<B: Backend> HybridLm<B> {
    /// Logits and the mean cross-entropy over the scored positions of `batch`, as
    /// [`Mamba2Lm::forward_loss`].
    ///
    /// # Panics
    /// If the batch holds token ids outside the vocabulary.
    pub fn forward_loss(&self, batch: &LmBatch<B>) -> SequenceOutput<B>
    where
        B: SsdBackend,
    {
        lm_loss(self, batch)
    }
}

/// A language model's logits on `batch` and their mean cross-entropy, in `f32` whatever the
/// model computes in (the loss and Burn's metrics).
fn lm_loss<B: SsdBackend>(model: &impl LanguageModel<B>, batch: &LmBatch<B>) -> SequenceOutput<B> {
    let logits = model
        .logits(batch.inputs.clone(), batch.documents.as_ref())
        .unwrap_or_else(|e| panic!("training batch rejected: {e}"));
    let logits = upcast(logits);
    let loss = masked_cross_entropy(logits.clone(), batch.targets.clone(), batch.ignore_index);
    SequenceOutput::new(loss, logits, None, batch.targets.clone())
}

impl<B: Backend> Mamba2Regressor<B> {
    /// The prediction at the last time step and its mean squared error.
    ///
    /// # Shapes
    /// - inputs `[b, l, n_features]`, targets `[b, n_outputs]`
    ///
    /// # Panics
    /// If the inputs do not have `n_features` features.
    pub fn forward_regression(&self, batch: &RegressionBatch<B>) -> RegressionOutput<B>
    where
        B: SsdBackend,
    {
        let (y, _) = self
            .forward(batch.inputs.clone(), None)
            .unwrap_or_else(|e| panic!("training batch rejected: {e}"));
        let [b, l, o] = y.dims();
        let output = y.narrow(1, l - 1, 1).reshape([b, o]);
        let loss = MseLoss::new().forward(output.clone(), batch.targets.clone(), Reduction::Mean);
        RegressionOutput::new(loss, output, batch.targets.clone())
    }
}

impl<B: Backend> Mamba2Forecaster<B> {
    /// The forecast and its loss (the batch's [`ForecastLoss`](super::ForecastLoss)), flattened
    /// to `[b, horizon · n_targets]` for Burn's regression metrics.
    ///
    /// # Panics
    /// If the inputs do not have `n_inputs` variables.
    pub fn forward_forecast(&self, batch: &ForecastBatch<B>) -> RegressionOutput<B>
    where
        B: SsdBackend,
    {
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

/// A model that Burn's `Learner` trains on one kind of batch: the one training and inference
/// step of this crate ([`train_step`], [`inference_step`]) runs any of them, on one thread or
/// with the batch spread over threads ([`Threaded`](super::Threaded)).
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
    scaled_train_step(model, batch, threads, 1.0, None)
}

/// [`train_step`] with the gradient multiplied by `grad_scale` (the loss it reports is the
/// batch's own): a device's share of the mean over the devices of a multi-device step; with
/// `mixed`, the forward and backward on the parameters cast to that half type, the gradients
/// on the model's own ([`MixedPrecision`]).
pub(crate) fn scaled_train_step<B, M>(
    model: &M,
    batch: M::Batch,
    threads: usize,
    grad_scale: f64,
    mixed: Option<MixedPrecision>,
) -> TrainOutput<M::Output>
where
    B: AutodiffBackend,
    M: SupervisedModel<B> + AutodiffModule<B> + Send,
{
    let unscaled = grad_scale == 1.0;
    let scaled = |loss: Tensor<B, 1>| {
        if unscaled {
            loss
        } else {
            loss.mul_scalar(grad_scale)
        }
    };
    let mut parts = M::split_batch(&batch, threads);
    if parts.len() <= 1 {
        let output = compute_model(model, mixed).batch_output(&batch);
        return TrainOutput::new(model, scaled(output.loss()).backward(), output);
    }
    for part in &mut parts {
        part.weight *= grad_scale;
    }
    let (grads, loss, outputs) = parallel_backward(model, parts, |model, part| {
        let output = compute_model(model, mixed).batch_output(&part);
        (output.loss(), output)
    });
    // the parts' weights carried the scale: the batch's loss is reported without it
    let loss = if unscaled {
        loss
    } else {
        loss.div_scalar(grad_scale)
    };
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
    M: SupervisedModel<B> + Module<B> + Send,
{
    mixed_inference_step(model, batch, threads, None)
}

/// [`inference_step`] on the parameters cast to `mixed`'s half type, if any.
pub(crate) fn mixed_inference_step<B, M>(
    model: &M,
    batch: M::Batch,
    threads: usize,
    mixed: Option<MixedPrecision>,
) -> M::Output
where
    B: Backend,
    M: SupervisedModel<B> + Module<B> + Send,
{
    let model = &*compute_model(model, mixed);
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
supervised!(HybridLm, LmBatch, SequenceOutput, forward_loss);
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
