//! Shared by the test binaries: deterministic random draws.
//!
//! burn-ndarray draws every random tensor (weights at `init`, `Tensor::random`) from one
//! process-wide generator, and the tests of a binary run on parallel threads: a test that seeds
//! the generator and then draws could otherwise see draws of another test in between. Every test
//! that draws holds [`seeded`]'s guard for as long as it draws, so each test sees the same
//! numbers in every run, on every machine and in any test order.

#![allow(dead_code)]

pub mod golden;
pub mod safetensors;
pub mod torch;

use std::sync::{Mutex, MutexGuard};

use burn::backend::NdArray;
use burn::tensor::backend::Backend;
use mamba2_burn::data::copy::{self, CopyConfig};
use mamba2_burn::data::{GeneratedDataset, SequenceItem};
use mamba2_burn::train::{LmTrainingConfig, RunConfig};
use mamba2_burn::{Mamba2BackboneConfig, Mamba2Config, Mamba2LmConfig};

static GENERATOR: Mutex<()> = Mutex::new(());

/// Seeds burn-ndarray's generator (shared by all its float types and by `Autodiff` over it)
/// with `seed` and holds it for this test until the guard is dropped.
pub fn seeded(seed: u64) -> MutexGuard<'static, ()> {
    // a test that panicked while holding the guard leaves nothing half-done in the generator
    let guard = GENERATOR
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    NdArray::<f32>::seed(&Default::default(), seed);
    guard
}

/// Seeds the generator again, for a test that holds it (the guard of [`seeded`]).
pub fn seeded_again(seed: u64) {
    NdArray::<f32>::seed(&Default::default(), seed);
}

/// The selective-copying data of the training tests: `len` items generated from `seed`.
pub fn copy_data(
    seed: u64,
    len: usize,
) -> GeneratedDataset<impl Fn(u64, u64) -> SequenceItem + Send + Sync> {
    let task = CopyConfig {
        vocab_size: 10,
        seq_len: 32,
        n_data: 4,
    };
    GeneratedDataset::new(move |s, i| task.example(s, i), seed, len)
}

/// A small LM (2 layers, d_model 32) and its training run on [`copy_data`]: batch 16, seed 7.
pub fn copy_lm_config(epochs: usize, lr: f64) -> LmTrainingConfig {
    let mixer = Mamba2Config::new(32)
        .with_d_state(16)
        .with_headdim(16)
        .with_chunk_size(8);
    let model = Mamba2LmConfig::new(Mamba2BackboneConfig::new(2, mixer), 10)
        .with_pad_vocab_size_multiple(8);
    LmTrainingConfig::new(model)
        .with_run(
            RunConfig::new(lr)
                .with_batch_size(16)
                .with_epochs(epochs)
                .with_seed(7),
        )
        .with_ignore_index(Some(copy::NOISE as usize))
}

/// The artifacts of the run in `full` as they were when it stopped during epoch `epoch + 1`:
/// its `config.json` and the checkpoint of epoch `epoch`, the last complete one.
pub fn stopped_after(full: &std::path::Path, epoch: usize) -> tempfile::TempDir {
    let cut = tempfile::tempdir().unwrap();
    std::fs::copy(full.join("config.json"), cut.path().join("config.json")).unwrap();
    std::fs::create_dir(cut.path().join("checkpoint")).unwrap();
    for kind in ["model", "optim", "scheduler"] {
        let name = format!("{kind}-{epoch}.mpk");
        let checkpoint = |dir: &std::path::Path| dir.join("checkpoint").join(&name);
        std::fs::copy(checkpoint(full), checkpoint(cut.path())).unwrap();
    }
    cut
}
