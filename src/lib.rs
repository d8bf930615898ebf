//! Mamba-2 (the state-space duality model of Dao & Gu, 2024) as Burn modules, generic over the
//! backend: the same code trains on CUDA or Wgpu and runs on the CPU (`NdArray`), and Burn's
//! autodiff computes every gradient.
//!
//! - [`Mamba2`] is the mixer (the SSD layer), [`Mamba2Block`] a pre-norm residual block,
//!   [`Mamba2Backbone`] a stack; [`Mamba2Lm`], [`Mamba2Regressor`] and [`Mamba2Forecaster`] are
//!   models over it. Every `forward` takes an optional state and returns the state after its
//!   last token, and `step` continues it one token at a time; [`Documents`] packs several
//!   sequences into one row.
//! - [`ssd`] holds the math: the chunked scan, the sequential recurrence and the single step.
//! - [`load_lm`] reads Hugging Face and state-spaces checkpoint folders ([`checkpoint`] has the
//!   rest); [`train`] has the `TrainStep` / `InferenceStep` impls, the optimizer and complete
//!   training runs with Burn's `Learner`; [`StreamingForecaster`] and [`recurrent`] run the
//!   recurrent step on the CPU for one stream at a time.
//! - `cubecl_setup` (with a GPU feature): CubeCL's persistent kernel and autotune caches, which
//!   the first model built turns on, so that a GPU process after the first starts warm.
//!
//! ```
//! use burn::backend::NdArray;
//! use burn::tensor::{Int, Tensor};
//! use mamba2_burn::{Mamba2BackboneConfig, Mamba2Config, Mamba2LmConfig};
//!
//! # fn main() -> Result<(), mamba2_burn::Mamba2Error> {
//! let device = Default::default();
//! let mixer = Mamba2Config::new(64).with_d_state(16).with_headdim(32).with_chunk_size(32);
//! let lm = Mamba2LmConfig::new(Mamba2BackboneConfig::new(2, mixer), 256).init::<NdArray>(&device)?;
//! let ids = Tensor::<NdArray, 2, Int>::from_data([[1, 2, 3, 4, 5]], &device);
//! let (logits, state) = lm.forward(ids, None)?; // logits [1, 5, 256]
//! let next = Tensor::<NdArray, 1, Int>::from_data([6], &device);
//! let (next_logits, _state) = lm.step(next, state)?; // [1, 256], constant time per token
//! assert_eq!((logits.dims(), next_logits.dims()), ([1, 5, 256], [1, 256]));
//! # Ok(())
//! # }
//! ```
//!
//! The README covers training, checkpoints, time series, backends, measurements and tests.
#![cfg_attr(docsrs, feature(doc_cfg))]

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

pub mod checkpoint;
#[cfg(feature = "cubecl")]
#[cfg_attr(docsrs, doc(cfg(feature = "cubecl")))]
pub mod cubecl_setup;
#[cfg(feature = "train")]
#[cfg_attr(docsrs, doc(cfg(feature = "train")))]
pub mod data;
mod error;
pub mod generate;
mod init;
mod layers;
mod models;
mod precision;
pub mod recurrent;
pub mod sampling;
pub mod ssd;
#[cfg(feature = "tokenizer")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokenizer")))]
pub mod tokenizer;
#[cfg(feature = "train")]
#[cfg_attr(docsrs, doc(cfg(feature = "train")))]
pub mod train;

pub use layers::activation;
pub use models::hybrid;

// The models, their layers, configs, states and errors; the plumbing stays in its module
// (`checkpoint`, `generate`, `ssd`, `train`, ...).
pub use checkpoint::{
    load_backbone, load_hybrid, load_lm, save_checkpoint, save_lm, CheckpointFormat,
};
pub use error::{Mamba2Error, Result};
pub use generate::{GenerateConfig, Generation};
pub use layers::attention::{Attention, AttentionConfig, KvCache, PackedTokens};
pub use layers::backbone::{Mamba2Backbone, Mamba2BackboneConfig, Mamba2BackboneRecord};
pub use layers::block::{Mamba2Block, Mamba2BlockConfig, Mamba2BlockRecord};
pub use layers::documents::Documents;
pub use layers::lora::{
    Lora, LoraConfig, LoraLinear, LoraLinearRecord, LoraRecord, DEFAULT_LORA_TARGETS, LORA_TARGETS,
};
pub use layers::mamba3::{Mamba3, Mamba3Config};
pub use layers::mixer::{DtLimit, Mamba2, Mamba2Config};
pub use layers::mlp::{Mlp, MlpActivation, MlpConfig};
pub use layers::moe::{Moe, MoeConfig, RouterKind};
pub use layers::norm::{RmsNorm, RmsNormConfig, RmsNormGated, RmsNormGatedConfig};
pub use layers::rope::{RopeTables, RotaryEmbedding, RotaryEmbeddingConfig};
pub use layers::state::{BackboneState, Mamba2State};
pub use models::forecaster::{
    ForecastHead, Mamba2Forecaster, Mamba2ForecasterConfig, Mamba2ForecasterRecord, RevIn,
};
pub use models::lm::{Mamba2Lm, Mamba2LmConfig, Mamba2LmRecord};
pub use models::regressor::{Mamba2Regressor, Mamba2RegressorConfig, Mamba2RegressorRecord};
pub use recurrent::StreamingForecaster;
pub use ssd::{FusedKernels, ProjectionBackend, ScanProducts, SsdAutodiffBackend, SsdBackend};
