//! Learning-rate schedule: linear warmup, then cosine decay to a floor.

use burn::optim::lr_scheduler::LrScheduler;
use burn::optim::LearningRate;
use burn::tensor::backend::Backend;

/// Linear warmup from `peak / warmup` to `peak` over `warmup` steps, then a cosine decay to
/// `min_lr` at step `total`, and `min_lr` after that.
///
/// Its record is the step count, so a resumed run continues the schedule where it stopped.
#[derive(Clone, Debug)]
pub struct WarmupCosineLr {
    peak: f64,
    min_lr: f64,
    warmup: usize,
    total: usize,
    step: usize,
}

impl WarmupCosineLr {
    /// `peak` after `warmup` steps, `min_lr` at `total`.
    pub fn new(peak: f64, min_lr: f64, warmup: usize, total: usize) -> Self {
        Self {
            peak,
            min_lr,
            warmup,
            total: total.max(1),
            step: 0,
        }
    }

    /// `peak` after `warmup_fraction · total` steps, decaying to `min_ratio · peak` at `total`.
    pub fn from_fractions(peak: f64, min_ratio: f64, warmup_fraction: f64, total: usize) -> Self {
        let warmup = (warmup_fraction * total as f64).round() as usize;
        Self::new(peak, peak * min_ratio, warmup, total)
    }

    /// The learning rate of step `step` (counted from 1).
    pub fn at(&self, step: usize) -> f64 {
        if step <= self.warmup {
            return self.peak * step as f64 / self.warmup.max(1) as f64;
        }
        let span = self.total.saturating_sub(self.warmup).max(1) as f64;
        let progress = ((step - self.warmup) as f64 / span).min(1.0);
        self.min_lr
            + 0.5 * (self.peak - self.min_lr) * (1.0 + (std::f64::consts::PI * progress).cos())
    }
}

impl LrScheduler for WarmupCosineLr {
    type Record<B: Backend> = usize;

    fn step(&mut self) -> LearningRate {
        self.step += 1;
        self.at(self.step)
    }

    fn to_record<B: Backend>(&self) -> Self::Record<B> {
        self.step
    }

    fn load_record<B: Backend>(mut self, record: Self::Record<B>) -> Self {
        self.step = record;
        self
    }
}
