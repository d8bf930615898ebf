//! What every training run sets whatever its model ([`RunConfig`], nested as `run` in both
//! training configs), and how a `config.json` of the earlier flat layout (those fields at the top
//! level) is read into it.

use burn::config::Config;
use serde_json::{Map, Value};

use super::optim::Mamba2OptimizerConfig;

/// The settings of a training run that do not depend on the model: the optimizer, the
/// learning-rate schedule (warmup, then cosine decay to `min_lr_ratio · lr` over every step),
/// the batch size, the epochs, the seed and the threads of a step. Nested as `run` in
/// [`LmTrainingConfig`](super::LmTrainingConfig) and
/// [`ForecastTrainingConfig`](super::ForecastTrainingConfig), whose `new` set the peak learning
/// rate of their task (3e-3 and 1e-3).
#[derive(Config, Debug)]
pub struct RunConfig {
    /// Peak learning rate (no default: each task's config sets its own).
    pub lr: f64,
    /// The optimizer. Default: [`Mamba2OptimizerConfig::new`].
    #[config(default = "Mamba2OptimizerConfig::new()")]
    pub optimizer: Mamba2OptimizerConfig,
    /// Final learning rate, as a fraction of the peak. Default: 0.1.
    #[config(default = 0.1)]
    pub min_lr_ratio: f64,
    /// Warmup length, as a fraction of all steps. Default: 0.05.
    #[config(default = 0.05)]
    pub warmup_fraction: f64,
    /// Items (sequences, windows) per batch. Default: 32.
    #[config(default = 32)]
    pub batch_size: usize,
    /// Passes over the training set. Default: 10.
    #[config(default = 10)]
    pub epochs: usize,
    /// Seed of the weights and the data order. Default: 42.
    #[config(default = 42)]
    pub seed: u64,
    /// Threads each training step spreads its batch over (same gradient as one thread; see
    /// [`Threaded`](super::Threaded)). Worth the cores of a CPU backend; 1 on a GPU.
    /// Default: 1.
    #[config(default = 1)]
    pub step_threads: usize,
}

/// The fields of [`RunConfig`], as they stood at the top level of a training `config.json`
/// before they were nested under `run`.
const RUN_FIELDS: [&str; 8] = [
    "lr",
    "optimizer",
    "min_lr_ratio",
    "warmup_fraction",
    "batch_size",
    "epochs",
    "seed",
    "step_threads",
];

/// Reads a training config's JSON object of either layout into the nested one: with no `run`
/// object, the [`RunConfig`] fields at the top level move into one; a `run` object beside
/// top-level run fields is an error, as it is ambiguous which one holds. (As with every config
/// of Burn's `Config` derive, each field must be present: a missing one is an error when the
/// result is read, with its name.)
pub(crate) fn nest_run_fields(value: &mut Value) -> Result<(), String> {
    let Value::Object(fields) = value else {
        return Err("a training config is a JSON object".to_string());
    };
    let flat: Vec<&str> = RUN_FIELDS
        .into_iter()
        .filter(|name| fields.contains_key(*name))
        .collect();
    if fields.contains_key("run") {
        if let Some(name) = flat.first() {
            return Err(format!(
                "`{name}` is both at the top level and in `run`: it belongs in `run` only"
            ));
        }
        return Ok(());
    }
    let mut run = Map::new();
    for name in flat {
        if let Some(v) = fields.remove(name) {
            run.insert(name.to_string(), v);
        }
    }
    fields.insert("run".to_string(), Value::Object(run));
    Ok(())
}

/// Builders of the run's fields on a training config, from before the run was nested: kept
/// deprecated for one release, each sets the field of `run`.
macro_rules! deprecated_run_builders {
    ($config:ty) => {
        #[allow(missing_docs)]
        impl $config {
            #[deprecated(note = "set it on the nested run: `.with_run(config.run.with_lr(..))`")]
            pub fn with_lr(mut self, lr: f64) -> Self {
                self.run.lr = lr;
                self
            }
            #[deprecated(note = "set it on the nested run: `config.run.with_optimizer(..)`")]
            pub fn with_optimizer(
                mut self,
                optimizer: $crate::train::optim::Mamba2OptimizerConfig,
            ) -> Self {
                self.run.optimizer = optimizer;
                self
            }
            #[deprecated(note = "set it on the nested run: `config.run.with_min_lr_ratio(..)`")]
            pub fn with_min_lr_ratio(mut self, min_lr_ratio: f64) -> Self {
                self.run.min_lr_ratio = min_lr_ratio;
                self
            }
            #[deprecated(note = "set it on the nested run: `config.run.with_warmup_fraction(..)`")]
            pub fn with_warmup_fraction(mut self, warmup_fraction: f64) -> Self {
                self.run.warmup_fraction = warmup_fraction;
                self
            }
            #[deprecated(note = "set it on the nested run: `config.run.with_batch_size(..)`")]
            pub fn with_batch_size(mut self, batch_size: usize) -> Self {
                self.run.batch_size = batch_size;
                self
            }
            #[deprecated(note = "set it on the nested run: `config.run.with_epochs(..)`")]
            pub fn with_epochs(mut self, epochs: usize) -> Self {
                self.run.epochs = epochs;
                self
            }
            #[deprecated(note = "set it on the nested run: `config.run.with_seed(..)`")]
            pub fn with_seed(mut self, seed: u64) -> Self {
                self.run.seed = seed;
                self
            }
            #[deprecated(note = "set it on the nested run: `config.run.with_step_threads(..)`")]
            pub fn with_step_threads(mut self, step_threads: usize) -> Self {
                self.run.step_threads = step_threads;
                self
            }
        }
    };
}
pub(crate) use deprecated_run_builders;

/// `Display` as JSON, Burn's [`Config`] (save, load) and serde for a training config whose
/// struct derives serde with `#[serde(remote = "Self")]`: the derived code serves as is for
/// writing, and for reading after a config of the flat layout (the run's fields beside the
/// model) has been nested ([`nest_run_fields`]).
macro_rules! training_config_io {
    ($config:ty) => {
        impl burn::config::Config for $config {}

        impl core::fmt::Display for $config {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str(&burn::config::config_to_json(self))
            }
        }

        impl serde::Serialize for $config {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                <$config>::serialize(self, serializer)
            }
        }

        impl<'de> serde::Deserialize<'de> for $config {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                use serde::de::Error;
                let mut value = serde_json::Value::deserialize(deserializer)?;
                $crate::train::config::nest_run_fields(&mut value).map_err(D::Error::custom)?;
                <$config>::deserialize(value).map_err(D::Error::custom)
            }
        }
    };
}
pub(crate) use training_config_io;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_run_fields_move_under_run() {
        let run = RunConfig::new(0.5).with_epochs(3);
        let mut flat = serde_json::to_value(&run).unwrap();
        flat["model"] = serde_json::json!({"d_model": 4});
        nest_run_fields(&mut flat).unwrap();
        assert_eq!(flat["model"], serde_json::json!({"d_model": 4}));
        assert_eq!(flat.as_object().unwrap().len(), 2, "{flat}");
        let read: RunConfig = serde_json::from_value(flat["run"].clone()).unwrap();
        assert_eq!(read.to_string(), run.to_string());
    }

    #[test]
    fn run_fields_in_both_places_are_an_error() {
        let mut v: Value = serde_json::json!({"run": {"lr": 0.5}, "seed": 1});
        let e = nest_run_fields(&mut v).unwrap_err();
        assert!(e.contains("`seed`"), "{e}");
        let mut nested: Value = serde_json::json!({"run": {"lr": 0.5}});
        nest_run_fields(&mut nested).unwrap();
        assert_eq!(nested, serde_json::json!({"run": {"lr": 0.5}}));
    }
}
