//! Fuzz target `shard_index`: `Target::ShardIndex` (`tests/common/loaders.rs`).
#![no_main]

#[path = "../../tests/common/loaders.rs"]
mod loaders;
#[macro_use]
mod common;

loader_target!("shard_index", loaders::Target::ShardIndex);
