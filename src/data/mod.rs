//! Datasets and batching for training: the synthetic tasks (MQAR, selective copying), byte-level
//! text, and the batcher that turns token sequences into [`crate::train::LmBatch`]es.

pub mod copy;
pub mod loader;
#[cfg(feature = "dbn")]
pub mod market;
pub mod mqar;
pub mod text;
pub mod timeseries;

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::tensor::{backend::Backend, Int, Tensor, TensorData};

use crate::documents::Documents;
use crate::train::LmBatch;

/// One training sequence: `input[t]` is followed by `target[t]`; positions whose target is the
/// task's ignore token are not scored.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SequenceItem {
    /// Input token ids, `[seq_len]`.
    pub input: Vec<i64>,
    /// Target token ids, `[seq_len]`.
    pub target: Vec<i64>,
    /// Lengths of the documents packed back to back in `input` (their sum is `seq_len`): no
    /// state flows from one to the next. Empty: the whole sequence is one document.
    #[serde(default)]
    pub documents: Vec<usize>,
}

impl SequenceItem {
    /// A sequence of one document.
    pub fn new(input: Vec<i64>, target: Vec<i64>) -> Self {
        Self {
            input,
            target,
            documents: Vec::new(),
        }
    }
}

/// A dataset of generated examples: item `i` is `generate(seed, i)`, computed on demand, so any
/// size costs no memory and the same seed always gives the same data.
pub struct GeneratedDataset<F> {
    generate: F,
    seed: u64,
    len: usize,
}

impl<F: Fn(u64, u64) -> SequenceItem + Send + Sync> GeneratedDataset<F> {
    /// `len` items of `generate(seed, index)`.
    pub fn new(generate: F, seed: u64, len: usize) -> Self {
        Self {
            generate,
            seed,
            len,
        }
    }
}

impl<F: Fn(u64, u64) -> SequenceItem + Send + Sync> Dataset<SequenceItem> for GeneratedDataset<F> {
    fn get(&self, index: usize) -> Option<SequenceItem> {
        (index < self.len).then(|| (self.generate)(self.seed, index as u64))
    }

    fn len(&self) -> usize {
        self.len
    }
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
