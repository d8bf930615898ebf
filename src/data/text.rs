//! Byte-level language modelling on a text file: the bytes are the tokens (vocabulary 256),
//! cut into consecutive windows of `seq_len + 1` bytes.

use std::path::Path;

use crate::error::Mamba2Error;

use super::SequenceItem;

/// A text file as training and validation windows of byte tokens.
#[derive(Clone, Debug)]
pub struct ByteCorpus {
    /// Training windows (the first 90% of the file).
    pub train: Vec<SequenceItem>,
    /// Validation windows (the last 10%).
    pub valid: Vec<SequenceItem>,
}

/// Vocabulary of byte-level models.
pub const BYTE_VOCAB: usize = 256;

impl ByteCorpus {
    /// Reads `path` and cuts it into windows of `seq_len` inputs (and the next byte of each
    /// as targets), the last 10% of the file for validation.
    pub fn from_file(path: &Path, seq_len: usize) -> crate::Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Mamba2Error::File {
            file: path.to_path_buf(),
            reason: format!("cannot read text file: {e}"),
        })?;
        Self::from_bytes(&bytes, seq_len).map_err(|reason| Mamba2Error::File {
            file: path.to_path_buf(),
            reason,
        })
    }

    /// Cuts `bytes` into windows (see [`ByteCorpus::from_file`]).
    pub fn from_bytes(bytes: &[u8], seq_len: usize) -> Result<Self, String> {
        if seq_len == 0 {
            return Err("seq_len must be at least 1".into());
        }
        let split = bytes.len() * 9 / 10;
        let windows = |part: &[u8]| -> Vec<SequenceItem> {
            part.windows(seq_len + 1)
                .step_by(seq_len)
                .map(|w| SequenceItem {
                    input: w[..seq_len].iter().map(|&b| b as i64).collect(),
                    target: w[1..].iter().map(|&b| b as i64).collect(),
                })
                .collect()
        };
        let (train, valid) = (windows(&bytes[..split]), windows(&bytes[split..]));
        if train.is_empty() || valid.is_empty() {
            return Err(format!(
                "{} bytes is too short for windows of {} (need at least {})",
                bytes.len(),
                seq_len + 1,
                10 * (seq_len + 1)
            ));
        }
        Ok(Self { train, valid })
    }
}
