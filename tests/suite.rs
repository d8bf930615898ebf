//! The test suite in one binary: each file a module, so that the models' code for each backend
//! (NdArray, Autodiff, Wgpu with and without fusion, the Learner) is compiled once, not once per
//! file. The cold-start guard (`cold_start.rs`), which configures CubeCL for a whole process,
//! runs its steps in a child process of this binary. Binaries of their own: the loaders'
//! mutation tests (`fuzz.rs`, `market.rs`), which measure the largest allocation of the whole
//! process, and the `f64` gradient checks (`gradcheck_f64.rs`), which set the NdArray device's
//! float type before any tensor exists.
//!
//! `cargo test --release --features dbn,wgpu --test suite [NAME]` runs it, or the tests whose
//! path contains NAME (`reference`, `paths::ndarray`, ...).

mod common;

mod backend;
mod checkpoints;
#[cfg(feature = "wgpu")]
mod cold_start;
mod errors;
mod export;
mod fine_tune;
#[cfg(feature = "timeseries")]
mod forecaster;
mod generate;
mod hybrid;
mod hybrid_files;
mod hybrid_training;
mod kill;
mod lora;
mod mamba3;
mod mamba3_layer;
mod mamba3_lm;
mod mixed;
mod moe;
mod paths;
mod reference;
mod ssd_cost;
mod ssd_random;
#[cfg(feature = "timeseries")]
mod timeseries;
mod training;
