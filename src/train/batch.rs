//! The batches of each task, how they split over threads, and the batchers that build them
//! from the datasets' items.

use burn::data::dataloader::batcher::Batcher;
use burn::nn::loss::{MseLoss, Reduction};
use burn::tensor::{backend::Backend, Int, Tensor, TensorData};

use super::parallel::{split_rows, BatchPart};
use crate::data::timeseries::WindowItem;
use crate::data::SequenceItem;
use crate::layers::documents::Documents;

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

/// Stacks [`SequenceItem`]s of equal length into an [`LmBatch`], with their [`Documents`] when
/// any item packs more than one.
///
/// Batching sequences of different lengths, an item whose input and target lengths differ, or
/// document lengths that do not add up to the sequence, panics with a message saying so
/// (Burn's `Batcher` cannot return an error); the datasets of this crate always produce
/// consistent items.
#[derive(Clone, Debug)]
pub struct SequenceBatcher {
    /// Target id of unscored positions (`None`: every position is scored).
    pub ignore_index: Option<usize>,
}

impl<B: Backend> Batcher<B, SequenceItem, LmBatch<B>> for SequenceBatcher {
    fn batch(&self, items: Vec<SequenceItem>, device: &B::Device) -> LmBatch<B> {
        let b = items.len();
        let l = items.first().map_or(0, |i| i.input.len());
        let mut inputs = Vec::with_capacity(b * l);
        let mut targets = Vec::with_capacity(b * l);
        let packed = items.iter().any(|item| item.documents.len() > 1);
        let mut documents = Vec::with_capacity(if packed { b } else { 0 });
        for item in items {
            assert!(
                item.input.len() == l && item.target.len() == l,
                "all sequences of a batch must have one length: got input {} and target {}, expected {l}",
                item.input.len(),
                item.target.len()
            );
            inputs.extend(item.input);
            targets.extend(item.target);
            if packed {
                documents.push(match item.documents.is_empty() {
                    true => vec![l],
                    false => item.documents,
                });
            }
        }
        let documents = packed.then(|| {
            Documents::from_lengths(&documents, device)
                .unwrap_or_else(|e| panic!("inconsistent documents in a batch: {e}"))
        });
        LmBatch {
            inputs: Tensor::<B, 2, Int>::from_data(TensorData::new(inputs, [b, l]), device),
            targets: Tensor::<B, 2, Int>::from_data(TensorData::new(targets, [b, l]), device),
            ignore_index: self.ignore_index,
            documents,
        }
    }
}

/// Stacks [`WindowItem`]s into a [`ForecastBatch`](ForecastBatch).
#[derive(Clone, Debug)]
pub struct WindowBatcher {
    /// Steps per input window.
    pub lookback: usize,
    /// Steps per target window.
    pub horizon: usize,
    /// The loss the batches are scored with.
    pub loss: ForecastLoss,
}

impl WindowBatcher {
    /// Batches of `lookback` input and `horizon` target steps, scored with the MSE.
    pub fn new(lookback: usize, horizon: usize) -> Self {
        Self {
            lookback,
            horizon,
            loss: ForecastLoss::Mse,
        }
    }

    /// The same batches scored with `loss`.
    pub fn with_loss(self, loss: ForecastLoss) -> Self {
        Self { loss, ..self }
    }
}

impl<B: Backend> Batcher<B, WindowItem, ForecastBatch<B>> for WindowBatcher {
    fn batch(&self, items: Vec<WindowItem>, device: &B::Device) -> ForecastBatch<B> {
        let b = items.len();
        let n_in = items
            .first()
            .map_or(0, |i| i.input.len() / self.lookback.max(1));
        let n_out = items
            .first()
            .map_or(0, |i| i.target.len() / self.horizon.max(1));
        let (mut inputs, mut targets) = (Vec::with_capacity(b * self.lookback * n_in), Vec::new());
        for item in items {
            inputs.extend(item.input);
            targets.extend(item.target);
        }
        ForecastBatch {
            inputs: Tensor::from_data(TensorData::new(inputs, [b, self.lookback, n_in]), device),
            targets: Tensor::from_data(TensorData::new(targets, [b, self.horizon, n_out]), device),
            loss: self.loss,
        }
    }
}
