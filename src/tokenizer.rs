//! Text to token ids and back with a Hugging Face `tokenizer.json` (GPT-NeoX's for the
//! published Mamba-2 models), through the `tokenizers` crate with its pure-Rust regex engine:
//! no C code to build and nothing fetched.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokenizers::{
    DecodeStream, DecoderWrapper, ModelWrapper, NormalizerWrapper, PostProcessorWrapper,
    PreTokenizerWrapper,
};

use crate::error::{Mamba2Error, Result};

/// A tokenizer read from a `tokenizer.json`.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The file it was read from: an error of the `tokenizers` crate while encoding or decoding
    /// comes from the file (a model whose unknown token is not in its vocabulary, a decoder
    /// that cannot decode its own tokens), so it names the file.
    file: Arc<PathBuf>,
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
    tokenizer: &'a Tokenizer,
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
        let inner = unpanicked(|| tokenizers::Tokenizer::from_file(path))
            .ok_or_else(|| {
                Mamba2Error::file(
                    path,
                    "not a readable tokenizer.json: the tokenizers crate panicked reading it",
                )
            })?
            .map_err(|e| Mamba2Error::file(path, format!("not a readable tokenizer.json: {e}")))?;
        Ok(Self {
            inner,
            file: Arc::new(path.to_path_buf()),
        })
    }

    /// The token ids of `text`, with the special tokens the tokenizer adds (as transformers'
    /// `tokenizer(text)` gives them; GPT-NeoX's adds none).
    pub fn encode(&self, text: &str) -> Result<Vec<i64>> {
        let encoding = unpanicked(|| self.inner.encode(text, true))
            .ok_or_else(|| self.error("the tokenizers crate panicked encoding a text with it"))?
            .map_err(|e| self.error(format!("cannot encode a text: {e}")))?;
        Ok(encoding.get_ids().iter().map(|&id| id as i64).collect())
    }

    /// The text of `ids`, special tokens left out.
    pub fn decode(&self, ids: &[i64]) -> Result<String> {
        let ids = self.checked(ids)?;
        unpanicked(|| self.inner.decode(&ids, true))
            .ok_or_else(|| self.error("the tokenizers crate panicked decoding token ids with it"))?
            .map_err(|e| self.error(format!("cannot decode token ids: {e}")))
    }

    /// The number of tokens, added tokens included. (A vocabulary whose ids leave gaps has ids
    /// at or above it.)
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
            tokenizer: self,
            inner: self.inner.decode_stream(true),
        }
    }

    /// An error of the `tokenizers` crate while using this tokenizer: the file's.
    fn error(&self, reason: impl ToString) -> Mamba2Error {
        Mamba2Error::file(self.file.as_path(), reason)
    }

    fn checked(&self, ids: &[i64]) -> Result<Vec<u32>> {
        ids.iter().map(|&id| self.known(id, "ids")).collect()
    }

    /// `id` as the tokenizers crate takes it, if the vocabulary has it. Asked of the vocabulary
    /// itself, not against [`Self::vocab_size`]: a vocabulary's ids may leave gaps, so an id it
    /// gives can be larger than its size (found by fuzzing `tokenizer.json`).
    fn known(&self, id: i64, name: &'static str) -> Result<u32> {
        u32::try_from(id)
            .ok()
            .filter(|&id| self.inner.id_to_token(id).is_some())
            .ok_or_else(|| Mamba2Error::InvalidInput {
                name,
                reason: format!("token id {id} is not in the tokenizer's vocabulary"),
            })
    }
}

impl TextStream<'_> {
    /// The text that token `id` completes, if any.
    pub fn push(&mut self, id: i64) -> Result<Option<String>> {
        let id = self.tokenizer.known(id, "id")?;
        unpanicked(|| self.inner.step(id))
            .ok_or_else(|| {
                self.tokenizer.error(format!(
                    "the tokenizers crate panicked decoding token id {id} with it"
                ))
            })?
            .map_err(|e| {
                self.tokenizer
                    .error(format!("cannot decode token id {id}: {e}"))
            })
    }
}

/// Calls into the `tokenizers` crate with its panics caught (`None` where it panicked): some of
/// its deserializers `expect` where a malformed `tokenizer.json` breaks them (0.22.2: the
/// decoder's `expect("Helper")`, the normalizer's `expect("Parsed values")`; the first found by
/// fuzzing `tokenizer.json`, `fuzz/regressions/tokenizer_json`), and the crate refuses bad input
/// with an error, never a panic. The panic's message still reaches the panic hook (stderr).
fn unpanicked<T>(call: impl FnOnce() -> T) -> Option<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)).ok()
}
