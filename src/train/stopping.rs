//! Early stopping and checkpoint retention on the validation loss, decided from complete epochs
//! only.
//!
//! Burn's `Learner` hands each batch's metrics to a processing thread (through a channel of one
//! item) that forwards them to the metric store, and asks the store for the epoch's validation
//! loss as soon as the validation loop ends: the last batches of that epoch may not have reached
//! the store yet, so Burn's `MetricEarlyStoppingStrategy` and `MetricCheckpointingStrategy` can
//! see a partial mean, or none, and decide differently from run to run. By the end of epoch `e`
//! the whole of epoch `e - 1` has gone through (a whole training epoch has been processed
//! after it, in order), so the strategies here decide on the epochs before the current one: the
//! same decisions in every run, one epoch later than a rule that could read the current epoch.

use std::collections::BTreeSet;
use std::path::Path;

use burn::train::checkpoint::{CheckpointingAction, CheckpointingStrategy};
use burn::train::metric::store::{Aggregate, EventStoreClient, Split};
use burn::train::EarlyStoppingStrategy;

/// The name of Burn's `LossMetric`.
const LOSS: &str = "Loss";

/// The lowest validation loss among the epochs read so far.
#[derive(Clone, Debug, Default)]
struct BestEpoch {
    best: Option<(usize, f64)>,
}

impl BestEpoch {
    /// Reads `epoch`'s mean validation loss from the store (when it has a finite one): when it
    /// is a new best, the best it replaces.
    fn read(&mut self, epoch: usize, store: &EventStoreClient) -> Option<usize> {
        let value = store
            .find_metric(LOSS, epoch, Aggregate::Mean, &Split::Valid)
            .filter(|v| v.is_finite())?;
        match self.best {
            Some((_, best)) if best <= value => None,
            previous => {
                self.best = Some((epoch, value));
                previous.map(|(e, _)| e)
            }
        }
    }

    fn epoch(&self) -> Option<usize> {
        self.best.map(|(e, _)| e)
    }
}

/// Stops training when the validation loss has not improved for `patience` complete epochs:
/// at the end of epoch `e`, when the best of epochs `1..e` is `patience` or more epochs before
/// `e - 1` (see the module documentation for why the current epoch is not read).
#[derive(Clone, Debug)]
pub struct ValidLossStopping {
    patience: usize,
    best: BestEpoch,
}

impl ValidLossStopping {
    /// Stops after `patience` (at least 1) epochs without a lower validation loss.
    pub fn new(patience: usize) -> Self {
        Self {
            patience: patience.max(1),
            best: BestEpoch::default(),
        }
    }
}

impl EarlyStoppingStrategy for ValidLossStopping {
    fn should_stop(&mut self, epoch: usize, store: &EventStoreClient) -> bool {
        let Some(complete) = epoch.checked_sub(1).filter(|&e| e > 0) else {
            return false;
        };
        self.best.read(complete, store);
        self.best
            .epoch()
            .is_some_and(|best| complete - best >= self.patience)
    }
}

/// Keeps the checkpoints of the last two epochs and of the epoch with the lowest validation
/// loss (read from complete epochs, see the module documentation), deleting the others.
#[derive(Clone, Debug, Default)]
pub struct KeepBestAndLast {
    best: BestEpoch,
    deleted: BTreeSet<usize>,
}

impl KeepBestAndLast {
    /// A strategy that has seen no epoch yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A strategy for a run resumed after `epochs` epochs in `artifacts`, knowing their
    /// validation losses from the run's logs.
    pub fn resumed(artifacts: &Path, epochs: usize) -> Self {
        let best = super::run::best_valid_loss(artifacts, epochs);
        Self {
            best: BestEpoch { best },
            deleted: BTreeSet::new(),
        }
    }

    fn delete(&mut self, epoch: usize, actions: &mut Vec<CheckpointingAction>) {
        if epoch > 0 && Some(epoch) != self.best.epoch() && self.deleted.insert(epoch) {
            actions.push(CheckpointingAction::Delete(epoch));
        }
    }
}

impl CheckpointingStrategy for KeepBestAndLast {
    fn checkpointing(
        &mut self,
        epoch: usize,
        store: &EventStoreClient,
    ) -> Vec<CheckpointingAction> {
        let mut actions = vec![CheckpointingAction::Save];
        if let Some(complete) = epoch.checked_sub(1).filter(|&e| e > 0) {
            // a dethroned best outside the last two goes, and so does the epoch leaving them
            if let Some(previous) = self.best.read(complete, store) {
                if previous + 2 <= epoch {
                    self.delete(previous, &mut actions);
                }
            }
            if let Some(leaving) = epoch.checked_sub(2) {
                self.delete(leaving, &mut actions);
            }
        }
        actions
    }
}
