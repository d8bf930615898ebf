//! Selective copying, the synthetic task of the Mamba paper (Gu & Dao, 2023): data tokens are
//! scattered at random positions among noise tokens; after them come as many marker tokens,
//! and at each marker the model must emit the data tokens in their order of appearance.
//!
//! Tokens: `0` noise (and the ignored target), `1` the marker, data tokens in `[2, vocab)`.

use rand::rngs::StdRng;
use rand::seq::index::sample;
use rand::{Rng, SeedableRng};

use super::SequenceItem;
use crate::error::Mamba2Error;

/// The noise token, also the target of unscored positions.
pub const NOISE: i64 = 0;
/// The marker token that asks for the next data token.
pub const MARKER: i64 = 1;

/// Shape of a selective-copying task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CopyConfig {
    /// Vocabulary size (data tokens in `[2, vocab)`).
    pub vocab_size: usize,
    /// Length of each sequence: the scattered region, then `n_data` markers.
    pub seq_len: usize,
    /// Data tokens to copy.
    pub n_data: usize,
}

impl CopyConfig {
    /// Checks the sizes.
    pub fn validate(&self) -> crate::error::Result<()> {
        if self.vocab_size < 3 {
            return Err(Mamba2Error::config(
                "vocab_size",
                format!("must be at least 3, got {}", self.vocab_size),
            ));
        }
        if self.n_data == 0 || 2 * self.n_data > self.seq_len {
            return Err(Mamba2Error::config(
                "n_data",
                format!(
                    "need 1 <= n_data <= seq_len / 2, got n_data {} and seq_len {}",
                    self.n_data, self.seq_len
                ),
            ));
        }
        Ok(())
    }

    /// Generates example `index` of the stream seeded by `seed`.
    pub fn example(&self, seed: u64, index: u64) -> SequenceItem {
        let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(0xD1B5_4A32_D192_ED03) ^ index);
        let region = self.seq_len - self.n_data;
        let mut positions = sample(&mut rng, region, self.n_data).into_vec();
        positions.sort_unstable();
        let data: Vec<i64> = (0..self.n_data)
            .map(|_| rng.random_range(2..self.vocab_size as i64))
            .collect();
        let mut input = vec![NOISE; self.seq_len];
        for (&p, &d) in positions.iter().zip(&data) {
            input[p] = d;
        }
        let mut target = vec![NOISE; self.seq_len];
        for i in 0..self.n_data {
            input[region + i] = MARKER;
            target[region + i] = data[i];
        }
        SequenceItem::new(input, target)
    }
}
