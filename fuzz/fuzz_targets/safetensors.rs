//! Fuzz target `safetensors`: `Target::Safetensors` (`tests/common/loaders.rs`).
#![no_main]

#[path = "../../tests/common/loaders.rs"]
mod loaders;
#[macro_use]
mod common;

loader_target!("safetensors", loaders::Target::Safetensors);
