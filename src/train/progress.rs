//! Plain-text progress for runs whose output is not a terminal (CI logs, pipes): a few lines
//! per epoch with the running metrics, instead of Burn's full-screen TUI.

use std::collections::HashMap;

use burn::train::metric::{MetricDefinition, MetricId};
use burn::train::renderer::{
    EvaluationName, EvaluationProgress, MetricState, MetricsRenderer, MetricsRendererEvaluation,
    MetricsRendererTraining, ProgressType, TrainingProgress,
};

/// Prints `lines_per_epoch` progress lines per training epoch and one line per validation.
pub struct PlainProgress {
    names: HashMap<MetricId, String>,
    train: Vec<(String, String)>,
    valid: Vec<(String, String)>,
    lines_per_epoch: usize,
    last_epoch_line: Option<(usize, usize)>,
    valid_pending: bool,
    epoch: usize,
    epochs: usize,
}

impl PlainProgress {
    /// A renderer that prints about `lines_per_epoch` lines per epoch.
    pub fn new(lines_per_epoch: usize) -> Self {
        Self {
            names: HashMap::new(),
            train: Vec::new(),
            valid: Vec::new(),
            lines_per_epoch: lines_per_epoch.max(1),
            last_epoch_line: None,
            valid_pending: false,
            epoch: 0,
            epochs: 0,
        }
    }

    fn update(list: &mut Vec<(String, String)>, name: String, value: String) {
        match list.iter_mut().find(|(n, _)| *n == name) {
            Some(entry) => entry.1 = value,
            None => list.push((name, value)),
        }
    }

    fn entry(&self, state: MetricState) -> (String, String) {
        let (MetricState::Generic(entry) | MetricState::Numeric(entry, _)) = state;
        let name = self
            .names
            .get(&entry.metric_id)
            .cloned()
            .unwrap_or_else(|| "metric".into());
        (name, entry.serialized_entry.formatted)
    }

    fn line(list: &[(String, String)]) -> String {
        list.iter()
            .map(|(n, v)| format!("{n} {v}"))
            .collect::<Vec<_>>()
            .join("  ")
    }

    fn flush_valid(&mut self) {
        if self.valid_pending {
            println!(
                "epoch {}/{} valid  {}",
                self.epoch,
                self.epochs,
                Self::line(&self.valid)
            );
            self.valid_pending = false;
        }
    }
}

impl MetricsRendererTraining for PlainProgress {
    fn update_train(&mut self, state: MetricState) {
        let (n, v) = self.entry(state);
        Self::update(&mut self.train, n, v);
    }

    fn update_valid(&mut self, state: MetricState) {
        let (n, v) = self.entry(state);
        Self::update(&mut self.valid, n, v);
        self.valid_pending = true;
    }

    fn render_train(&mut self, item: TrainingProgress, _: Vec<ProgressType>) {
        self.flush_valid();
        self.epoch = item.global_progress.items_processed;
        self.epochs = item.global_progress.items_total;
        let Some(p) = item.progress else { return };
        let every = p.items_total.div_ceil(self.lines_per_epoch).max(1);
        let done = p.items_processed >= p.items_total;
        let key = (
            self.epoch,
            if done {
                usize::MAX
            } else {
                p.items_processed / every
            },
        );
        if self.last_epoch_line == Some(key) {
            return;
        }
        self.last_epoch_line = Some(key);
        println!(
            "epoch {}/{} [{}/{}] train  {}",
            self.epoch,
            self.epochs,
            p.items_processed,
            p.items_total,
            Self::line(&self.train)
        );
    }

    fn render_valid(&mut self, _: TrainingProgress, _: Vec<ProgressType>) {}

    fn on_train_end(
        &mut self,
        _summary: Option<burn::train::LearnerSummary>,
    ) -> Result<(), Box<dyn core::error::Error>> {
        self.flush_valid();
        Ok(())
    }
}

impl MetricsRendererEvaluation for PlainProgress {
    fn update_test(&mut self, _: EvaluationName, state: MetricState) {
        let (n, v) = self.entry(state);
        Self::update(&mut self.valid, n, v);
    }

    fn render_test(&mut self, _: EvaluationProgress, _: Vec<ProgressType>) {}
}

impl MetricsRenderer for PlainProgress {
    fn manual_close(&mut self) {
        self.flush_valid();
    }

    fn register_metric(&mut self, definition: MetricDefinition) {
        self.names.insert(definition.metric_id, definition.name);
    }
}
