//! Byte-level language modelling on a text file: the bytes are the tokens (vocabulary 256),
//! cut into consecutive windows of `seq_len + 1` bytes, optionally packed as documents.
//!
//! Packed (see [`ByteCorpus::packed`]): the file is a sequence of documents, each ending with
//! a separator (a blank line by default); the windows are the same, and each records where a
//! new document starts in it, so that no state flows from one document into the next (the
//! reference's `seq_idx`). Nothing is cut off or padded: a document that runs past the end of a
//! window continues in the next one.

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

/// The document separator of [`ByteCorpus::packed`] by default: a blank line.
pub const PARAGRAPH_SEPARATOR: &[u8] = b"\n\n";

impl ByteCorpus {
    /// Reads `path` and cuts it into windows of `seq_len` inputs (and the next byte of each
    /// as targets), the last 10% of the file for validation.
    pub fn from_file(path: &Path, seq_len: usize) -> crate::Result<Self> {
        Self::read(path, |bytes| Self::from_bytes(bytes, seq_len))
    }

    /// Reads `path` as documents that each end with `separator` and packs them into windows
    /// (see [`ByteCorpus::packed`]).
    pub fn packed_from_file(path: &Path, seq_len: usize, separator: &[u8]) -> crate::Result<Self> {
        Self::read(path, |bytes| Self::packed(bytes, seq_len, separator))
    }

    fn read(path: &Path, cut: impl FnOnce(&[u8]) -> Result<Self, String>) -> crate::Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Mamba2Error::File {
            file: path.to_path_buf(),
            reason: format!("cannot read text file: {e}"),
        })?;
        cut(&bytes).map_err(|reason| Mamba2Error::File {
            file: path.to_path_buf(),
            reason,
        })
    }

    /// Cuts `bytes` into windows (see [`ByteCorpus::from_file`]); each window is one document.
    pub fn from_bytes(bytes: &[u8], seq_len: usize) -> Result<Self, String> {
        Self::windows(bytes, seq_len, None)
    }

    /// Cuts `bytes` into the windows of [`ByteCorpus::from_bytes`], each recording the
    /// documents it holds: a document ends after each occurrence of `separator` (and at the
    /// end of the text), a window's first token continues the document it falls in. The
    /// validation part starts at the first document after 90% of the text.
    pub fn packed(bytes: &[u8], seq_len: usize, separator: &[u8]) -> Result<Self, String> {
        if separator.is_empty() {
            return Err("the document separator must not be empty".into());
        }
        Self::windows(bytes, seq_len, Some(separator))
    }

    fn windows(bytes: &[u8], seq_len: usize, separator: Option<&[u8]>) -> Result<Self, String> {
        if seq_len == 0 {
            return Err("seq_len must be at least 1".into());
        }
        // document starts: after every separator
        let starts: Vec<usize> = match separator {
            Some(sep) => bytes
                .windows(sep.len())
                .enumerate()
                .filter(|(_, w)| *w == sep)
                .map(|(i, _)| i + sep.len())
                .filter(|&s| s < bytes.len())
                .collect(),
            None => Vec::new(),
        };
        let mut split = bytes.len() * 9 / 10;
        if separator.is_some() {
            split = starts
                .iter()
                .copied()
                .find(|&s| s >= split)
                .unwrap_or(split);
        }
        let windows = |offset: usize, part: &[u8]| -> Vec<SequenceItem> {
            part.windows(seq_len + 1)
                .step_by(seq_len)
                .enumerate()
                .map(|(k, w)| {
                    let begin = offset + k * seq_len;
                    let mut item = SequenceItem::new(
                        w[..seq_len].iter().map(|&b| b as i64).collect(),
                        w[1..].iter().map(|&b| b as i64).collect(),
                    );
                    if separator.is_some() {
                        item.documents = document_lengths(&starts, begin, seq_len);
                    }
                    item
                })
                .collect()
        };
        let (train, valid) = (windows(0, &bytes[..split]), windows(split, &bytes[split..]));
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

/// Lengths of the documents in the window of `len` tokens from `begin`, given the sorted
/// document starts of the whole text.
fn document_lengths(starts: &[usize], begin: usize, len: usize) -> Vec<usize> {
    let first = starts.partition_point(|&s| s <= begin);
    let mut lengths = Vec::new();
    let mut at = begin;
    for &s in starts[first..].iter().take_while(|&&s| s < begin + len) {
        lengths.push(s - at);
        at = s;
    }
    lengths.push(begin + len - at);
    lengths
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_record_their_documents() {
        // documents "ab\n\n", "c\n\n", "defgh" (starts at 4 and 7)
        let mut text = b"ab\n\nc\n\ndefgh".to_vec();
        text.extend([b'x'; 90]);
        let text = &text[..];
        let corpus = ByteCorpus::packed(text, 5, b"\n\n").unwrap();
        let docs: Vec<Vec<usize>> = corpus.train.iter().map(|w| w.documents.clone()).collect();
        // windows start at 0, 5, 10, ...: [ab\n\nc] -> 4 + 1, [\n\ndef] -> 2 + 3, then one each
        assert_eq!(docs[0], [4, 1]);
        assert_eq!(docs[1], [2, 3]);
        assert!(docs[2..].iter().all(|d| d == &[5]));
        assert_eq!(corpus.train[0].input, b"ab\n\nc".map(i64::from));
        // the same tokens as the unpacked windows
        let plain = ByteCorpus::from_bytes(text, 5).unwrap();
        assert_eq!(
            plain.train.len() + plain.valid.len(),
            corpus.train.len() + corpus.valid.len()
        );
        assert!(plain.train.iter().all(|w| w.documents.is_empty()));
        assert!(ByteCorpus::packed(text, 5, b"").is_err());
    }

    #[test]
    fn document_lengths_cover_the_window() {
        assert_eq!(document_lengths(&[3, 4, 9], 0, 8), [3, 1, 4]);
        assert_eq!(document_lengths(&[3, 4, 9], 4, 5), [5]);
        assert_eq!(document_lengths(&[3, 4, 9], 8, 4), [1, 3]);
        assert_eq!(document_lengths(&[], 8, 4), [4]);
    }
}
