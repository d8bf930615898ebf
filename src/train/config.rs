//! What every training run sets whatever its model ([`RunConfig`], nested as `run` in both
//! training configs).

use burn::config::Config;

use super::mixed::MixedPrecision;
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
    /// Mixed precision: the forward and backward in this half type, the weights and the
    /// optimizer's state in `f32` ([`MixedPrecision`]). The GPU recipe: `Bf16` on Cuda, `F16`
    /// on Wgpu adapters with `f16`. Default: `None` (the model's own type throughout, what a
    /// config written without the field reads as).
    pub mixed_precision: Option<MixedPrecision>,
}

/// Burn's [`Config`] (save, load) and `Display` as JSON for a training config, which derives
/// serde itself (its `new` takes the model, so Burn's `Config` derive does not fit it).
macro_rules! training_config_io {
    // a generic config: `[M: Bound] Config<M>`
    ([$($generics:tt)*] $config:ty) => {
        impl<$($generics)*> burn::config::Config for $config {}

        impl<$($generics)*> core::fmt::Display for $config {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str(&burn::config::config_to_json(self))
            }
        }
    };
    ($config:ty) => {
        training_config_io!([] $config);
    };
}
pub(crate) use training_config_io;
