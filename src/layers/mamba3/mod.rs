//! Mamba-3's layer (SISO): its configuration, and the module with its forward and step.

mod config;
mod layer;

pub use config::Mamba3Config;
pub use layer::Mamba3;
