//! The models over the backbone: the causal language model, the sequence regressor and the
//! forecaster.

pub(crate) mod forecaster;
pub mod hybrid;
pub(crate) mod lm;
pub(crate) mod regressor;
