//! Training with Burn's `Learner`: `TrainStep` / `InferenceStep` for the language model, the
//! regressor and the forecaster, the optimizer the reference trains with, and a warmup + cosine
//! schedule.
//!
//! The model types themselves implement the steps, so that a Burn training loop takes them
//! as they are. Each implements [`SupervisedModel`] (its batch, its loss, how the batch splits
//! over threads), and one generic step, [`train_step`] / [`inference_step`], serves all three:
//!
//! - [`crate::Mamba2Lm`] and [`HybridLm`](crate::hybrid::HybridLm) on an [`LmBatch`]: next-token cross-entropy (positions whose
//!   target is `ignore_index` are not scored), output [`SequenceOutput`](burn::train::SequenceOutput) for Burn's loss,
//!   accuracy and perplexity metrics;
//! - [`crate::Mamba2Regressor`] on a [`RegressionBatch`]: mean squared error of
//!   the prediction at the last time step, output [`RegressionOutput`](burn::train::RegressionOutput);
//! - [`crate::Mamba2Forecaster`] on a [`ForecastBatch`]: the batch's
//!   [`ForecastLoss`] over the forecast horizon, output [`RegressionOutput`](burn::train::RegressionOutput).
//!
//! [`train_lm`] and [`train_forecaster`] run a whole training with checkpoints, resume and
//! artifacts.
//!
//! On CPU backends, [`Threaded`] around a model spreads every batch over threads (row slices
//! with their own autodiff graphs, gradients summed with the whole batch's loss weights; see
//! [`parallel_backward`]), which keeps the cores busy that burn-ndarray's mostly
//! single-threaded element-wise kernels leave idle. The models themselves carry no thread
//! count.

mod batch;
#[cfg(feature = "blas")]
mod blas;
mod config;
mod devices;
mod forecast;
mod lm;
mod mixed;
mod optim;
mod parallel;
mod progress;
mod run;
mod schedule;
mod step;
mod stopping;
mod threaded;

pub use batch::{
    ForecastBatch, ForecastLoss, LmBatch, RegressionBatch, SequenceBatcher, WindowBatcher,
};
#[cfg(feature = "blas")]
#[cfg_attr(docsrs, doc(cfg(feature = "blas")))]
pub use blas::{blas_threads, set_blas_threads};
pub use config::RunConfig;
pub use devices::TrainDevices;
pub use forecast::{
    direction_accuracy, evaluate_forecaster, load_forecaster, save_forecaster, train_forecaster,
    ForecastScores, ForecastTrainingConfig,
};
pub use lm::{
    evaluate_lm, train_lm, HybridTrainingConfig, LanguageModelTraining, LmConfig, LmScores,
    LmTrainingConfig,
};
pub use mixed::MixedPrecision;
pub use optim::{Mamba2Optimizer, Mamba2OptimizerConfig, Mamba2OptimizerRecord, NonFiniteGuard};
pub use parallel::{parallel_backward, parallel_forward, parallel_map, split_rows, BatchPart};
pub use progress::PlainProgress;
pub use run::{checkpoint_epochs, ProgressMode};
pub use schedule::WarmupCosineLr;
pub use step::{
    inference_step, masked_cross_entropy, train_step, LanguageModel, StepOutput, SupervisedModel,
};
pub use stopping::{KeepBestAndLast, ValidLossStopping};
pub use threaded::Threaded;
