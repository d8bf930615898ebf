//! The Mamba-2 mixer: in_proj, causal depthwise conv, SSD, gated RMSNorm, out_proj.
//!
//! Files: `dt_limit` (the clamp of `dt`), `layer` (the module, its sizes and states), `config`
//! (its configuration and initialisation), `conv` (the causal convolution) and `forward` (the
//! forward over a sequence and the recurrent step).

mod config;
mod conv;
mod dt_limit;
mod forward;
mod layer;

pub use config::Mamba2Config;
pub use dt_limit::DtLimit;
pub use layer::Mamba2;
