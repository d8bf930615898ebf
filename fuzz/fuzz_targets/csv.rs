//! Fuzz target `csv`: `Target::Csv` (`tests/common/loaders.rs`).
#![no_main]

#[path = "../../tests/common/loaders.rs"]
mod loaders;
#[macro_use]
mod common;

loader_target!("csv", loaders::Target::Csv);
