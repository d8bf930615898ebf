//! Multi-query associative recall (MQAR), the synthetic task of Zoology (Arora et al., 2023)
//! used in the Mamba-2 paper: a sequence opens with key-value pairs; later, among filler
//! tokens, the keys come back in random order, each followed by its value. The model must
//! predict each value at its key's second occurrence.
//!
//! Tokens: `0` is the filler (and the ignored target), keys are drawn from `[1, vocab/2)` and
//! values from `[vocab/2, vocab)`, so keys and values come from disjoint halves of the
//! vocabulary. Within a sequence keys are distinct.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::SequenceItem;
use crate::error::Mamba2Error;

/// The filler token, also used as the target of positions that are not scored.
pub const FILLER: i64 = 0;

/// Shape of an MQAR task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MqarConfig {
    /// Vocabulary size (keys in `[1, vocab/2)`, values in `[vocab/2, vocab)`).
    pub vocab_size: usize,
    /// Length of each sequence (inputs and targets have `seq_len` tokens).
    pub seq_len: usize,
    /// Key-value pairs per sequence.
    pub kv_pairs: usize,
}

impl MqarConfig {
    /// Checks that the pairs and their queries fit in the sequence and the vocabulary.
    pub fn validate(&self) -> crate::error::Result<()> {
        if self.kv_pairs == 0 {
            return Err(Mamba2Error::config("kv_pairs", "must be at least 1"));
        }
        if self.vocab_size / 2 <= self.kv_pairs {
            return Err(Mamba2Error::config(
                "vocab_size",
                format!(
                    "{} leaves {} keys, need more than kv_pairs = {}",
                    self.vocab_size,
                    (self.vocab_size / 2).saturating_sub(1),
                    self.kv_pairs
                ),
            ));
        }
        // context 2k, then k (key, value) query pairs in the rest of the sequence + 1
        if 4 * self.kv_pairs > self.seq_len + 1 {
            return Err(Mamba2Error::config(
                "seq_len",
                format!(
                    "{} is too short for {} pairs: need at least {}",
                    self.seq_len,
                    self.kv_pairs,
                    4 * self.kv_pairs - 1
                ),
            ));
        }
        Ok(())
    }

    /// Generates example `index` of the stream seeded by `seed` (the same pair always gives
    /// the same example).
    pub fn example(&self, seed: u64, index: u64) -> SequenceItem {
        let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index);
        let k = self.kv_pairs;
        let half = self.vocab_size / 2;
        let mut keys: Vec<i64> = (1..half as i64).collect();
        keys.shuffle(&mut rng);
        keys.truncate(k);
        let values: Vec<i64> = (0..k)
            .map(|_| rng.random_range(half as i64..self.vocab_size as i64))
            .collect();

        // the full sequence has seq_len + 1 tokens: inputs are [..-1], targets [1..]
        let total = self.seq_len + 1;
        let mut tokens = vec![FILLER; total];
        for i in 0..k {
            tokens[2 * i] = keys[i];
            tokens[2 * i + 1] = values[i];
        }
        // queries: k (key, value) pairs at distinct random even offsets of the query region
        let region = total - 2 * k;
        let slots = region / 2;
        let mut offsets: Vec<usize> = (0..slots).collect();
        offsets.shuffle(&mut rng);
        let mut order: Vec<usize> = (0..k).collect();
        order.shuffle(&mut rng);
        let mut scored = vec![false; total];
        for (slot, &pair) in offsets.iter().take(k).zip(&order) {
            let pos = 2 * k + 2 * slot;
            tokens[pos] = keys[pair];
            tokens[pos + 1] = values[pair];
            scored[pos + 1] = true;
        }
        let input = tokens[..self.seq_len].to_vec();
        let target = (1..total)
            .map(|t| if scored[t] { tokens[t] } else { FILLER })
            .collect();
        SequenceItem::new(input, target)
    }
}
