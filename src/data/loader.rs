//! A data loader whose shuffle depends only on the seed and the epoch number, so that a run
//! resumed at epoch `e` sees exactly the batches an uninterrupted run would have seen.
//!
//! (Burn's `DataLoaderBuilder::shuffle` draws each epoch's order from one running generator,
//! which a resumed run cannot reproduce.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataloader::{DataLoader, DataLoaderIterator, Progress};
use burn::data::dataset::Dataset;
use burn::tensor::backend::Backend;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

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
        }
    }

    /// Makes the next `iter` produce epoch `epoch` (counted from 0).
    pub fn start_at_epoch(self, epoch: usize) -> Self {
        self.epoch.store(epoch, Ordering::SeqCst);
        self
    }

    fn order(&self, epoch: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (self.range.0..self.range.1).collect();
        if let Some(seed) = self.seed {
            let mixed = seed
                ^ (epoch as u64)
                    .wrapping_add(1)
                    .wrapping_mul(0x9E37_79B9_7F4A_7C15);
            order.shuffle(&mut StdRng::seed_from_u64(mixed));
        }
        order
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
        }
    }
}

struct EpochIter<'a, B: Backend, I, O> {
    loader: &'a EpochLoader<B, I, O>,
    order: Vec<usize>,
    position: usize,
}

impl<B: Backend, I, O> Iterator for EpochIter<'_, B, I, O> {
    type Item = O;

    fn next(&mut self) -> Option<O> {
        if self.position >= self.order.len() {
            return None;
        }
        let end = (self.position + self.loader.batch_size).min(self.order.len());
        let items: Vec<I> = self.order[self.position..end]
            .iter()
            .filter_map(|&i| self.loader.dataset.get(i))
            .collect();
        self.position = end;
        Some(self.loader.batcher.batch(items, &self.loader.device))
    }
}

impl<B: Backend, I, O> DataLoaderIterator<O> for EpochIter<'_, B, I, O> {
    fn progress(&self) -> Progress {
        Progress {
            items_processed: self.position,
            items_total: self.order.len(),
        }
    }
}

impl<B: Backend, I: Send + Sync + 'static, O: 'static> DataLoader<B, O> for EpochLoader<B, I, O>
where
    B::Device: Send + Sync,
{
    fn iter<'a>(&'a self) -> Box<dyn DataLoaderIterator<O> + 'a> {
        let epoch = self.epoch.fetch_add(1, Ordering::SeqCst);
        Box::new(EpochIter {
            loader: self,
            order: self.order(epoch),
            position: 0,
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
