//! Fuzz target `tokenizer_json`: `Target::TokenizerJson` (`tests/common/loaders.rs`).
#![no_main]

#[path = "../../tests/common/loaders.rs"]
mod loaders;
#[macro_use]
mod common;

loader_target!("tokenizer_json", loaders::Target::TokenizerJson);
