//! Fuzz target `pytorch_bin`: `Target::PytorchBin` (`tests/common/loaders.rs`).
#![no_main]

#[path = "../../tests/common/loaders.rs"]
mod loaders;
#[macro_use]
mod common;

loader_target!("pytorch_bin", loaders::Target::PytorchBin);
