//! A data loader whose shuffle depends only on the seed and the epoch number, so that a run
//! resumed at epoch `e` sees exactly the batches an uninterrupted run would have seen.
//!
//! (Burn's `DataLoaderBuilder::shuffle` draws each epoch's order from one running generator,
//! which a resumed run cannot reproduce.)
//!
//! With [`EpochLoader::with_buckets`], items of different lengths are batched apart (length
//! bucketing): each batch holds items of one length only, and the batches of all lengths are
//! shuffled together, so that a dataset of mixed sequence lengths trains without padding.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataloader::{DataLoader, DataLoaderIterator, Progress};
use burn::data::dataset::Dataset;
use burn::tensor::backend::Backend;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

/// The bucket of an item (its sequence length, say): items of different buckets never share a
/// batch.
pub type BucketKey<I> = Arc<dyn Fn(&I) -> usize + Send + Sync>;

/// Batches of a dataset in an order drawn from `(seed, epoch)`; `shuffle = false` keeps the
/// dataset order. Each call to `iter` is one epoch.
pub struct EpochLoader<B: Backend, I, O> {
    dataset: Arc<dyn Dataset<I>>,
    batcher: Arc<dyn Batcher<B, I, O>>,
    batch_size: usize,
    seed: Option<u64>,
    epoch: Arc<AtomicUsize>,
    range: (usize, usize),
    device: B::Device,
    /// The bucket of every dataset item, computed once by `with_buckets`.
    buckets: Option<Arc<Vec<usize>>>,
}

impl<B: Backend, I, O> EpochLoader<B, I, O> {
    /// A loader over `dataset`, shuffled per epoch from `seed` (in order when `None`).
    pub fn new(
        dataset: Arc<dyn Dataset<I>>,
        batcher: Arc<dyn Batcher<B, I, O>>,
        batch_size: usize,
        seed: Option<u64>,
        device: B::Device,
    ) -> Self {
        let len = dataset.len();
        Self {
            dataset,
            batcher,
            batch_size: batch_size.max(1),
            seed,
            epoch: Arc::new(AtomicUsize::new(0)),
            range: (0, len),
            device,
            buckets: None,
        }
    }

    /// Batches items by `key` (for sequences, their length): the epoch's shuffled order is
    /// split into one list per key, each list is cut into batches, and the batches are
    /// shuffled (from the seed and the epoch, like the items). When every item has the same
    /// key the batches are exactly those of the plain loader.
    /// Each item's key is computed once here, not in every epoch.
    pub fn with_buckets(mut self, key: BucketKey<I>) -> Self {
        let keys = (0..self.dataset.len())
            .map(|i| self.dataset.get(i).map_or(0, |item| key(&item)))
            .collect();
        self.buckets = Some(Arc::new(keys));
        self
    }

    /// Makes the next `iter` produce epoch `epoch` (counted from 0).
    pub fn start_at_epoch(self, epoch: usize) -> Self {
        self.epoch.store(epoch, Ordering::SeqCst);
        self
    }

    /// Batches in each epoch (with buckets: the sum over buckets of their batch counts, the
    /// same in every epoch).
    pub fn batches_per_epoch(&self) -> usize {
        self.batches(0).len()
    }

    /// The most batches per epoch of any of `shares` loaders cut from this one as Burn's
    /// multi-device strategies cut it (`split_dataloader`: contiguous ranges of
    /// `len / shares` items, the last one taking the rest); one share is
    /// [`batches_per_epoch`](Self::batches_per_epoch). A multi-device step takes a batch of
    /// every share that has one left, so this is the steps of an epoch.
    pub fn batches_per_epoch_in_shares(&self, shares: usize) -> usize {
        if shares <= 1 {
            return self.batches_per_epoch();
        }
        let (start, end) = self.range;
        let step = (end - start) / shares;
        (0..shares)
            .map(|i| {
                let a = start + i * step;
                let b = if i + 1 == shares { end } else { a + step };
                self.with((a, b), self.device.clone(), self.epoch.clone())
                    .batches_per_epoch()
            })
            .max()
            .unwrap_or(0)
    }

    /// The generator of an epoch's shuffles (`None` without a seed).
    fn rng(&self, epoch: usize) -> Option<StdRng> {
        self.seed.map(|seed| {
            StdRng::seed_from_u64(
                seed ^ (epoch as u64)
                    .wrapping_add(1)
                    .wrapping_mul(0x9E37_79B9_7F4A_7C15),
            )
        })
    }

    /// The batches of an epoch, as dataset indices.
    fn batches(&self, epoch: usize) -> Vec<Vec<usize>> {
        let mut rng = self.rng(epoch);
        let mut order: Vec<usize> = (self.range.0..self.range.1).collect();
        if let Some(rng) = rng.as_mut() {
            order.shuffle(rng);
        }
        let cut = |indices: &[usize]| -> Vec<Vec<usize>> {
            indices
                .chunks(self.batch_size)
                .map(<[usize]>::to_vec)
                .collect()
        };
        let Some(keys) = &self.buckets else {
            return cut(&order);
        };
        let mut buckets: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
        for i in order {
            buckets.entry(keys[i]).or_default().push(i);
        }
        let mut batches: Vec<Vec<usize>> = buckets.values().flat_map(|b| cut(b)).collect();
        if buckets.len() > 1 {
            if let Some(rng) = rng.as_mut() {
                batches.shuffle(rng);
            }
        }
        batches
    }

    fn with(&self, range: (usize, usize), device: B::Device, epoch: Arc<AtomicUsize>) -> Self {
        Self {
            dataset: self.dataset.clone(),
            batcher: self.batcher.clone(),
            batch_size: self.batch_size,
            seed: self.seed,
            epoch,
            range,
            device,
            buckets: self.buckets.clone(),
        }
    }
}

struct EpochIter<'a, B: Backend, I, O> {
    loader: &'a EpochLoader<B, I, O>,
    batches: Vec<Vec<usize>>,
    next: usize,
    processed: usize,
    total: usize,
}

impl<B: Backend, I, O> Iterator for EpochIter<'_, B, I, O> {
    type Item = O;

    fn next(&mut self) -> Option<O> {
        let batch = self.batches.get(self.next)?;
        let items: Vec<I> = batch
            .iter()
            .filter_map(|&i| self.loader.dataset.get(i))
            .collect();
        self.next += 1;
        self.processed += batch.len();
        Some(self.loader.batcher.batch(items, &self.loader.device))
    }
}

impl<B: Backend, I, O> DataLoaderIterator<O> for EpochIter<'_, B, I, O> {
    fn progress(&self) -> Progress {
        Progress {
            items_processed: self.processed,
            items_total: self.total,
        }
    }
}

impl<B: Backend, I: Send + Sync + 'static, O: 'static> DataLoader<B, O> for EpochLoader<B, I, O>
where
    B::Device: Send + Sync,
{
    fn iter<'a>(&'a self) -> Box<dyn DataLoaderIterator<O> + 'a> {
        let epoch = self.epoch.fetch_add(1, Ordering::SeqCst);
        let batches = self.batches(epoch);
        let total = batches.iter().map(Vec::len).sum();
        Box::new(EpochIter {
            loader: self,
            batches,
            next: 0,
            processed: 0,
            total,
        })
    }

    fn num_items(&self) -> usize {
        self.range.1 - self.range.0
    }

    fn to_device(&self, device: &B::Device) -> Arc<dyn DataLoader<B, O>> {
        // the same epoch counter: moving the loader does not restart its epochs
        Arc::new(self.with(self.range, device.clone(), self.epoch.clone()))
    }

    fn slice(&self, start: usize, end: usize) -> Arc<dyn DataLoader<B, O>> {
        let (a, b) = self.range;
        let range = ((a + start).min(b), (a + end).min(b));
        let epoch = Arc::new(AtomicUsize::new(self.epoch.load(Ordering::SeqCst)));
        Arc::new(self.with(range, self.device.clone(), epoch))
    }
}
