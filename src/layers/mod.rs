//! The layers of the models, each depending only on those listed before it: the activations,
//! the RMS norms, packed documents, the recurrent states, the mixer (one SSD layer), the residual
//! block and the backbone (a stack of blocks).

pub mod activation;
pub(crate) mod backbone;
pub(crate) mod block;
pub(crate) mod documents;
pub(crate) mod mixer;
pub(crate) mod norm;
pub(crate) mod state;
