//! Shared by the test binaries: deterministic random draws.
//!
//! burn-ndarray draws every random tensor (weights at `init`, `Tensor::random`) from one
//! process-wide generator, and the tests of a binary run on parallel threads: a test that seeds
//! the generator and then draws could otherwise see draws of another test in between. Every test
//! that draws holds [`seeded`]'s guard for as long as it draws, so each test sees the same
//! numbers in every run, on every machine and in any test order.

#![allow(dead_code)]

use std::sync::{Mutex, MutexGuard};

use burn::backend::NdArray;
use burn::tensor::backend::Backend;

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
