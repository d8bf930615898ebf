//! The models over the backbone: the causal language model, the sequence regressor and the
//! forecaster; the hybrid language models; low-rank adapters on the language models.

pub(crate) mod forecaster;
pub mod hybrid;
pub(crate) mod lm;
pub(crate) mod lora;
pub(crate) mod regressor;
