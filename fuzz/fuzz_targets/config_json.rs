//! Fuzz target `config_json`: `Target::ConfigJson` (`tests/common/loaders.rs`).
#![no_main]

#[path = "../../tests/common/loaders.rs"]
mod loaders;
#[macro_use]
mod common;

loader_target!("config_json", loaders::Target::ConfigJson);
