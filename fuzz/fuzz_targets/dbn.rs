//! Fuzz target `dbn`: `Target::Dbn` (`tests/common/loaders.rs`).
#![no_main]

#[path = "../../tests/common/loaders.rs"]
mod loaders;
#[macro_use]
mod common;

loader_target!("dbn", loaders::Target::Dbn);
