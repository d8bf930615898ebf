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

/// A text as training, validation and test windows of tokens: its bytes
/// ([`from_file`](Self::from_file), [`packed`](Self::packed)), or its tokens under a
/// checkpoint's tokenizer (`tokenized`, with the `tokenizer` feature).
#[derive(Clone, Debug)]
pub struct TextCorpus {
    /// Training windows (the first 80% of the file).
    pub train: Vec<SequenceItem>,
    /// Validation windows (the next 10%).
    pub valid: Vec<SequenceItem>,
    /// Held-out test windows (the last 10%), never seen by training or model selection.
    pub test: Vec<SequenceItem>,
}

/// The byte-level corpus: a [`TextCorpus`] of bytes (the name it had before token corpora).
pub type ByteCorpus = TextCorpus;

/// Vocabulary of byte-level models.
pub const BYTE_VOCAB: usize = 256;

/// The document separator of [`ByteCorpus::packed`] by default: a blank line.
pub const PARAGRAPH_SEPARATOR: &[u8] = b"\n\n";

impl TextCorpus {
    /// Reads `path` and cuts it into windows of `seq_len` inputs (and the next byte of each
    /// as targets): the first 80% of the file for training, the next 10% for validation, the
    /// last 10% for testing.
    pub fn from_file(path: &Path, seq_len: usize) -> crate::error::Result<Self> {
        Self::read(path, |bytes| Self::from_bytes(bytes, seq_len))
    }

    /// Reads `path` as documents that each end with `separator` and packs them into windows
    /// (see [`ByteCorpus::packed`]).
    pub fn packed_from_file(
        path: &Path,
        seq_len: usize,
        separator: &[u8],
    ) -> crate::error::Result<Self> {
        Self::read(path, |bytes| Self::packed(bytes, seq_len, separator))
    }

    fn read(
        path: &Path,
        cut: impl FnOnce(&[u8]) -> crate::error::Result<Self>,
    ) -> crate::error::Result<Self> {
        let bytes = std::fs::read(path)
            .map_err(|e| Mamba2Error::file(path, format!("cannot read text file: {e}")))?;
        cut(&bytes).map_err(|e| match e {
            // a text too short is the file's fault
            Mamba2Error::InvalidInput { reason, .. } => Mamba2Error::file(path, reason),
            e => e,
        })
    }

    /// Cuts `bytes` into windows (see [`ByteCorpus::from_file`]); each window is one document.
    pub fn from_bytes(bytes: &[u8], seq_len: usize) -> crate::error::Result<Self> {
        Self::windows(bytes, seq_len, None)
    }

    /// Cuts `bytes` into the windows of [`ByteCorpus::from_bytes`], each recording the
    /// documents it holds: a document ends after each occurrence of `separator` (and at the
    /// end of the text), a window's first token continues the document it falls in. The
    /// validation and test parts each start at the first document after 80% and 90% of the
    /// text.
    pub fn packed(bytes: &[u8], seq_len: usize, separator: &[u8]) -> crate::error::Result<Self> {
        if separator.is_empty() {
            return Err(Mamba2Error::config("separator", "must not be empty"));
        }
        Self::windows(bytes, seq_len, Some(separator))
    }

    fn windows(
        bytes: &[u8],
        seq_len: usize,
        separator: Option<&[u8]>,
    ) -> crate::error::Result<Self> {
        // document starts: after every separator
        let starts: Option<Vec<usize>> = separator.map(|sep| {
            bytes
                .windows(sep.len())
                .enumerate()
                .filter(|(_, w)| *w == sep)
                .map(|(i, _)| i + sep.len())
                .filter(|&s| s < bytes.len())
                .collect()
        });
        Self::cut(bytes, starts.as_deref(), seq_len).map_err(|e| match e {
            Mamba2Error::InvalidInput { reason, .. } => Mamba2Error::InvalidInput {
                name: "bytes",
                reason: reason.replace("tokens", "bytes"),
            },
            e => e,
        })
    }

    /// Cuts `tokens` (bytes or token ids, read as ids a window at a time) into windows of
    /// `seq_len` inputs (and the next token of each as targets), the first 80% for training,
    /// the next 10% for validation, the last 10% for testing. With document `starts` (sorted
    /// positions where a document begins), each window records the documents it holds and each
    /// part starts at the first document from its share of the tokens on.
    pub(super) fn cut<T: Copy + Into<i64>>(
        tokens: &[T],
        starts: Option<&[usize]>,
        seq_len: usize,
    ) -> crate::error::Result<Self> {
        if seq_len == 0 {
            return Err(Mamba2Error::config("seq_len", "must be at least 1"));
        }
        // a part starts at the first document start from its share of the text on
        let split = |tenths: usize| {
            let at = tokens.len() * tenths / 10;
            match starts {
                Some(starts) => starts.iter().copied().find(|&s| s >= at).unwrap_or(at),
                None => at,
            }
        };
        let (valid_from, test_from) = (split(8), split(9));
        let ids = |w: &[T]| w.iter().map(|&t| t.into()).collect();
        let windows = |offset: usize, part: &[T]| -> Vec<SequenceItem> {
            part.windows(seq_len + 1)
                .step_by(seq_len)
                .enumerate()
                .map(|(k, w)| {
                    let begin = offset + k * seq_len;
                    let mut item = SequenceItem::new(ids(&w[..seq_len]), ids(&w[1..]));
                    if let Some(starts) = starts {
                        item.documents = document_lengths(starts, begin, seq_len);
                    }
                    item
                })
                .collect()
        };
        let train = windows(0, &tokens[..valid_from]);
        let valid = windows(valid_from, &tokens[valid_from..test_from]);
        let test = windows(test_from, &tokens[test_from..]);
        if train.is_empty() || valid.is_empty() || test.is_empty() {
            return Err(Mamba2Error::InvalidInput {
                name: "tokens",
                reason: format!(
                    "{} tokens is too short for windows of {} in each part (need at least {})",
                    tokens.len(),
                    seq_len + 1,
                    10 * (seq_len + 1)
                ),
            });
        }
        Ok(Self { train, valid, test })
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
        let total = |c: &ByteCorpus| c.train.len() + c.valid.len() + c.test.len();
        assert_eq!(total(&plain), total(&corpus));
        assert!(!corpus.test.is_empty());
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
