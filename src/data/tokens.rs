//! Text files as a fine-tuning corpus: tokenized with a checkpoint's tokenizer, each document
//! followed by the end-of-text token, and cut into the packed windows of [`TextCorpus`]: no
//! state flows from one document into the next (the reference's `seq_idx`), nothing is cut
//! off or padded.

use std::path::{Path, PathBuf};

use super::text::TextCorpus;
use crate::error::Mamba2Error;
use crate::tokenizer::Tokenizer;

/// The end-of-text tokens of the tokenizers in use, the first found in a tokenizer marking the
/// end of each document: GPT-NeoX's (the Mamba-2 models), Granite's and Bamba's, Nemotron-H's
/// and Falcon-H1's.
pub const END_OF_TEXT_TOKENS: [&str; 4] =
    ["<|endoftext|>", "<|end_of_text|>", "</s>", "<|im_end|>"];

/// How [`TextCorpus::tokenized`] reads its text.
#[derive(Clone, Debug)]
pub struct TokenizedText<'a> {
    /// A text file, or a folder whose files (sorted by name; not its sub-folders) are read in
    /// turn: each file is one document or more.
    pub path: &'a Path,
    /// The tokenizer (the checkpoint's `tokenizer.json`).
    pub tokenizer: &'a Tokenizer,
    /// The model's vocabulary: a tokenizer with more tokens is an error.
    pub vocab: usize,
    /// Inputs per window.
    pub seq_len: usize,
    /// Where a file's documents end besides its own end (`None`: a file is one document).
    pub separator: Option<&'a str>,
    /// The token after each document (`None`: the tokenizer's own, the first of
    /// [`END_OF_TEXT_TOKENS`] it has, or none if it has none of them).
    pub end_of_text: Option<i64>,
}

impl TextCorpus {
    /// The documents of `text.path` as token windows: each document's tokens, then the
    /// end-of-text token, back to back; cut as [`TextCorpus::packed`] cuts bytes (80% of the
    /// tokens for training, 10% each for validation and testing, each part from a document's
    /// start). An unreadable, empty or non-UTF-8 file is an error naming it; text the tokenizer
    /// cannot encode, an error naming the tokenizer's file; a tokenizer larger than the model's
    /// vocabulary, an error naming `tokenizer`.
    pub fn tokenized(text: &TokenizedText<'_>) -> crate::error::Result<Self> {
        let tokenizer = text.tokenizer;
        if tokenizer.vocab_size() > text.vocab {
            return Err(Mamba2Error::config(
                "tokenizer",
                format!(
                    "{} tokens, more than the model's vocabulary of {}",
                    tokenizer.vocab_size(),
                    text.vocab
                ),
            ));
        }
        let end = match text.end_of_text {
            Some(id) => Some(id),
            None => END_OF_TEXT_TOKENS
                .iter()
                .find_map(|t| tokenizer.token_id(t)),
        };
        if let Some(id) = end.filter(|&id| id < 0 || id as usize >= text.vocab) {
            return Err(Mamba2Error::config(
                "end_of_text",
                format!("token {id} is outside the vocabulary of {}", text.vocab),
            ));
        }
        let mut tokens = Vec::new();
        let mut starts = Vec::new();
        for file in text_files(text.path)? {
            let content = std::fs::read_to_string(&file)
                .map_err(|e| Mamba2Error::file(&file, format!("cannot read the text: {e}")))?;
            if content.trim().is_empty() {
                return Err(Mamba2Error::file(&file, "no text in it"));
            }
            let documents: Vec<&str> = match text.separator {
                Some(sep) if !sep.is_empty() => content
                    .split(sep)
                    .filter(|d| !d.trim().is_empty())
                    .collect(),
                _ => vec![content.as_str()],
            };
            for document in documents {
                if !tokens.is_empty() {
                    starts.push(tokens.len());
                }
                tokens.extend(tokenizer.encode(document)?);
                tokens.extend(end);
            }
        }
        if let Some(id) = tokens
            .iter()
            .find(|&&id| id < 0 || id as usize >= text.vocab)
        {
            return Err(Mamba2Error::config(
                "tokenizer",
                format!(
                    "it gave token {id}, outside the model's vocabulary of {}",
                    text.vocab
                ),
            ));
        }
        Self::cut(&tokens, Some(&starts), text.seq_len).map_err(|e| match e {
            Mamba2Error::InvalidInput { reason, .. } => Mamba2Error::file(text.path, reason),
            e => e,
        })
    }
}

/// The file at `path`, or the files of the folder `path` sorted by name.
fn text_files(path: &Path) -> crate::error::Result<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let entries = std::fs::read_dir(path).map_err(|e| Mamba2Error::file(path, e))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Mamba2Error::file(path, "no text file in the folder"));
    }
    Ok(files)
}
