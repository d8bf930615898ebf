//! Hybrid language models: Mamba-2 layers interleaved with attention, each followed by an
//! MLP, as IBM's Granite 4.0-H has them. One model for the families, built from the same
//! layers as [`Mamba2Lm`](crate::Mamba2Lm) (the mixer and its fused SSD, the RMSNorm) and
//! the hybrids' own (attention with a KV cache, the MLP); a family is a config and a map of
//! checkpoint names ([`checkpoint::load_hybrid`](crate::checkpoint::load_hybrid)).
//!
//! Files: `config` (the layer pattern, the layers' configs and the multipliers), `layer` (one
//! layer and its cache), `lm` (the model and its cache).

mod config;
mod layer;
mod lm;

pub use config::{HybridConfig, HybridFamily};
pub use layer::{HybridLayer, LayerCache, LayerKind};
pub use lm::{HybridCache, HybridLm};
