//! The layers of the models, each depending only on those listed before it: the activations,
//! the RMS norms, packed documents, the recurrent states, low-rank adapters (fine-tuning),
//! Mamba-3's layer, the mixer (one SSD layer), the residual block and the backbone (a stack of
//! blocks); for the hybrid models, the rotary embedding, attention with its KV cache, the MLPs
//! and the mixture of experts.

pub mod activation;
pub(crate) mod attention;
pub(crate) mod backbone;
pub(crate) mod block;
pub(crate) mod documents;
pub(crate) mod lora;
pub(crate) mod mamba3;
pub(crate) mod mixer;
pub(crate) mod mlp;
pub(crate) mod moe;
pub(crate) mod norm;
pub(crate) mod rope;
pub(crate) mod state;
