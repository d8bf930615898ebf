//! Datasets for training: the synthetic tasks (MQAR, selective copying), text (bytes, or the
//! tokens of a checkpoint's tokenizer), time series (CSV) and market data (DBN), as items;
//! [`crate::train`] batches them.

pub mod copy;
pub mod loader;
#[cfg(feature = "dbn")]
#[cfg_attr(docsrs, doc(cfg(feature = "dbn")))]
pub mod market;
pub mod mqar;
pub mod text;
pub mod timeseries;
#[cfg(feature = "tokenizer")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokenizer")))]
pub mod tokens;

use burn::data::dataset::Dataset;

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
