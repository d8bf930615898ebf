//! Text to token ids and back with a Hugging Face `tokenizer.json` (GPT-NeoX's for the
//! published Mamba-2 models), through the `tokenizers` crate with its pure-Rust regex engine:
//! no C code to build and nothing fetched.

use std::path::Path;

use tokenizers::{
    DecodeStream, DecoderWrapper, ModelWrapper, NormalizerWrapper, PostProcessorWrapper,
    PreTokenizerWrapper,
};

use crate::error::{Mamba2Error, Result};

/// A tokenizer read from a `tokenizer.json`.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .finish()
    }
}

/// The text of generated tokens as they come: see [`Tokenizer::stream`].
pub struct TextStream<'a> {
    inner: DecodeStream<
        'a,
        ModelWrapper,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    >,
}

impl Tokenizer {
    /// Reads `tokenizer.json` at `path`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        if !path.is_file() {
            return Err(Mamba2Error::file(path, "no such file"));
        }
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| Mamba2Error::file(path, format!("not a readable tokenizer.json: {e}")))?;
        Ok(Self { inner })
    }

    /// The token ids of `text`, with the special tokens the tokenizer adds (as transformers'
    /// `tokenizer(text)` gives them; GPT-NeoX's adds none).
    pub fn encode(&self, text: &str) -> Result<Vec<i64>> {
        let encoding = self
            .inner
            .encode(text, true)
            .map_err(|e| Mamba2Error::InvalidInput {
                name: "text",
                reason: format!("cannot be tokenized: {e}"),
            })?;
        Ok(encoding.get_ids().iter().map(|&id| id as i64).collect())
    }

    /// The text of `ids`, special tokens left out.
    pub fn decode(&self, ids: &[i64]) -> Result<String> {
        let ids = self.checked(ids)?;
        self.inner
            .decode(&ids, true)
            .map_err(|e| Mamba2Error::InvalidInput {
                name: "ids",
                reason: format!("cannot be decoded: {e}"),
            })
    }

    /// The number of tokens, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of a token (`"<|endoftext|>"`, for example).
    pub fn token_id(&self, token: &str) -> Option<i64> {
        self.inner.token_to_id(token).map(i64::from)
    }

    /// Decodes tokens one at a time, special tokens left out: each [`TextStream::push`] gives
    /// the text the new token completes (`None` while it is part of a character or word that
    /// is not complete yet), so that the pieces joined are the decoded text.
    pub fn stream(&self) -> TextStream<'_> {
        TextStream {
            inner: self.inner.decode_stream(true),
        }
    }

    fn checked(&self, ids: &[i64]) -> Result<Vec<u32>> {
        ids.iter()
            .map(|&id| {
                u32::try_from(id)
                    .ok()
                    .filter(|&id| (id as usize) < self.vocab_size())
                    .ok_or_else(|| Mamba2Error::InvalidInput {
                        name: "ids",
                        reason: format!(
                            "token id {id} is outside the tokenizer's vocabulary [0, {})",
                            self.vocab_size()
                        ),
                    })
            })
            .collect()
    }
}

impl TextStream<'_> {
    /// The text that token `id` completes, if any.
    pub fn push(&mut self, id: i64) -> Result<Option<String>> {
        let id = u32::try_from(id).map_err(|_| Mamba2Error::InvalidInput {
            name: "id",
            reason: format!("token id {id} is negative or too large"),
        })?;
        self.inner.step(id).map_err(|e| Mamba2Error::InvalidInput {
            name: "id",
            reason: format!("token id {id} cannot be decoded: {e}"),
        })
    }
}
