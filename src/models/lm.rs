//! The causal language model: embedding, backbone, LM head.

use crate::ssd::backend::SsdBackend;
use burn::config::Config;
use burn::module::Module;
use burn::nn::{Embedding, Linear};
use burn::tensor::{backend::Backend, Distribution, Int, Tensor, TensorData};

use crate::error::Mamba2Error;
use crate::layers::backbone::{Mamba2Backbone, Mamba2BackboneConfig};
use crate::layers::documents::Documents;
use crate::layers::state::BackboneState;

/// Configuration of a [`Mamba2Lm`].
#[derive(Config, Debug)]
pub struct Mamba2LmConfig {
    /// The backbone.
    pub backbone: Mamba2BackboneConfig,
    /// Tokenizer vocabulary size (before padding).
    pub vocab_size: usize,
    /// The embedding and head have `vocab_size` rounded up to a multiple of this. Default: 16
    /// (the published Mamba-2 models).
    #[config(default = 16)]
    pub pad_vocab_size_multiple: usize,
    /// Share the embedding matrix with the LM head. Default: true.
    #[config(default = true)]
    pub tie_embeddings: bool,
    /// Standard deviation of the embedding's normal init. Default: 0.02.
    #[config(default = 0.02)]
    pub initializer_range: f64,
}

impl Mamba2LmConfig {
    /// `vocab_size` rounded up to a multiple of `pad_vocab_size_multiple`.
    pub fn padded_vocab_size(&self) -> usize {
        self.vocab_size
            .div_ceil(self.pad_vocab_size_multiple.max(1))
            * self.pad_vocab_size_multiple.max(1)
    }

    /// Checks the config (and its backbone's).
    pub fn validate(&self) -> crate::error::Result<()> {
        if self.vocab_size == 0 {
            return Err(Mamba2Error::config("vocab_size", "must be at least 1"));
        }
        if self.pad_vocab_size_multiple == 0 {
            return Err(Mamba2Error::config(
                "pad_vocab_size_multiple",
                "must be at least 1",
            ));
        }
        if self
            .vocab_size
            .checked_next_multiple_of(self.pad_vocab_size_multiple)
            .and_then(|v| v.checked_mul(self.backbone.mixer.d_model))
            .is_none()
        {
            return Err(Mamba2Error::config(
                "vocab_size",
                format!(
                    "{} (padded to a multiple of {}) times d_model overflows",
                    self.vocab_size, self.pad_vocab_size_multiple
                ),
            ));
        }
        self.backbone.validate()
    }

    /// Builds the model: embedding `N(0, initializer_range)`, backbone as
    /// [`Mamba2BackboneConfig::init`], untied head `U(±1/√d_model)`.
    pub fn init<B: Backend>(&self, device: &B::Device) -> crate::error::Result<Mamba2Lm<B>> {
        self.validate()?;
        let (v, d) = (self.padded_vocab_size(), self.backbone.mixer.d_model);
        let embedding = Embedding {
            weight: crate::init::param(Tensor::random(
                [v, d],
                Distribution::Normal(0.0, self.initializer_range),
                device,
            )),
        };
        let lm_head = (!self.tie_embeddings).then(|| crate::init::linear(d, v, false, device));
        Ok(Mamba2Lm {
            embedding,
            backbone: self.backbone.init(device)?,
            lm_head,
            vocab_size: v,
        })
    }
}

/// Mamba-2 causal language model.
///
/// Logits cover the padded vocabulary; with tied embeddings the head is the embedding matrix.
#[derive(Module, Debug)]
pub struct Mamba2Lm<B: Backend> {
    /// Token embedding `[vocab, d_model]`.
    pub embedding: Embedding<B>,
    /// Blocks and final norm.
    pub backbone: Mamba2Backbone<B>,
    /// Separate head (`None` when tied to the embedding).
    pub lm_head: Option<Linear<B>>,
    vocab_size: usize,
}

impl<B: Backend> Mamba2Lm<B> {
    /// The (padded) vocabulary size: the width of the logits.
    pub fn vocab_size(&self) -> usize
    where
        B: SsdBackend,
    {
        self.vocab_size
    }

    /// The all-zero state of a fresh batch of `batch` sequences.
    pub fn zero_state(&self, batch: usize, device: &B::Device) -> BackboneState<B>
    where
        B: SsdBackend,
    {
        self.backbone.zero_state(batch, device)
    }

    /// Checks token ids on the host: every id in `[0, vocab_size)`.
    ///
    /// [`forward`](Self::forward) and [`step`](Self::step) do not check their ids (that would
    /// read the tensor back from the device on every call, a blocking copy per decode step on a
    /// GPU); an id out of range there is a backend's own failure. Check ids while they are
    /// still on the host, with this or [`input_ids`](Self::input_ids), once per prompt or data
    /// set.
    pub fn check_token_ids(&self, ids: &[i64]) -> crate::error::Result<()>
    where
        B: SsdBackend,
    {
        check_in_vocab(ids, self.vocab_size, None, "input_ids")
    }

    /// The checked input of [`forward`](Self::forward) from host token ids: `rows` of equal
    /// length, each id in `[0, vocab_size)` ([`check_token_ids`](Self::check_token_ids)).
    ///
    /// # Shapes
    /// - returns `[rows.len(), row length]`
    pub fn input_ids(
        &self,
        rows: &[Vec<i64>],
        device: &B::Device,
    ) -> crate::error::Result<Tensor<B, 2, Int>>
    where
        B: SsdBackend,
    {
        let l = rows.first().map_or(0, Vec::len);
        if let Some(row) = rows.iter().find(|r| r.len() != l) {
            return Err(Mamba2Error::Shape {
                name: "input_ids",
                expected: format!("rows of one length ({l})"),
                actual: vec![rows.len(), row.len()],
            });
        }
        let flat: Vec<i64> = rows.concat();
        self.check_token_ids(&flat)?;
        Ok(Tensor::from_data(
            TensorData::new(flat, [rows.len(), l]),
            device,
        ))
    }

    /// Hidden states to logits.
    ///
    /// # Shapes
    /// - h: `[b, l, d_model]`; returns `[b, l, vocab]`
    pub fn head(&self, h: Tensor<B, 3>) -> Tensor<B, 3>
    where
        B: SsdBackend,
    {
        match &self.lm_head {
            Some(head) => head.forward(h),
            None => h.matmul(self.embedding.weight.val().transpose().unsqueeze::<3>()),
        }
    }

    /// Next-token logits for every position, continuing from `state` (a fresh sequence when
    /// `None`). The ids are not read back to check them: build them with
    /// [`input_ids`](Self::input_ids) (or check with [`check_token_ids`](Self::check_token_ids)).
    ///
    /// # Shapes
    /// - ids: `[b, l]`; returns logits `[b, l, vocab]` and the new state
    pub fn forward(
        &self,
        ids: Tensor<B, 2, Int>,
        state: Option<BackboneState<B>>,
    ) -> crate::error::Result<(Tensor<B, 3>, BackboneState<B>)>
    where
        B: SsdBackend,
    {
        self.forward_documents(ids, None, state)
    }

    /// [`forward`](Self::forward) over packed rows: each row holds the `documents` back to back,
    /// and every document gets the logits it would get alone (see
    /// [`Mamba2::forward_documents`](crate::Mamba2::forward_documents)); `None` is
    /// [`forward`](Self::forward).
    ///
    /// # Shapes
    /// - ids: `[b, l]`, documents: `[b, l]`; returns logits `[b, l, vocab]` and the state of
    ///   each row's last document
    pub fn forward_documents(
        &self,
        ids: Tensor<B, 2, Int>,
        documents: Option<&Documents<B>>,
        state: Option<BackboneState<B>>,
    ) -> crate::error::Result<(Tensor<B, 3>, BackboneState<B>)>
    where
        B: SsdBackend,
    {
        let x = self.embedding.forward(ids);
        let (h, state) = self.backbone.forward_documents(x, documents, state)?;
        Ok((self.head(h), state))
    }

    /// Logits after one new token per sequence (ids unchecked, as in [`forward`](Self::forward):
    /// a sampled id is always inside the vocabulary).
    ///
    /// # Shapes
    /// - ids: `[b]`; returns logits `[b, vocab]` and the new state
    pub fn step(
        &self,
        ids: Tensor<B, 1, Int>,
        state: BackboneState<B>,
    ) -> crate::error::Result<(Tensor<B, 2>, BackboneState<B>)>
    where
        B: SsdBackend,
    {
        let b = ids.dims()[0];
        let x = self
            .embedding
            .forward(ids.reshape([b, 1]))
            .reshape([b, self.backbone.d_model()]);
        let (h, state) = self.backbone.step(x, state)?;
        let logits = self.head(h.unsqueeze_dim::<3>(1));
        Ok((logits.reshape([b, self.vocab_size]), state))
    }
}

/// Checks that every id of `ids` is in `[0, vocab)` or equals `allowed` (an ignore index), with
/// an [`InvalidInput`](Mamba2Error::InvalidInput) error named `name` for the first that is not.
pub(crate) fn check_in_vocab(
    ids: &[i64],
    vocab: usize,
    allowed: Option<i64>,
    name: &'static str,
) -> crate::error::Result<()> {
    match ids
        .iter()
        .find(|&&id| !(0..vocab as i64).contains(&id) && Some(id) != allowed)
    {
        Some(bad) => Err(Mamba2Error::InvalidInput {
            name,
            reason: format!("token id {bad} is outside the vocabulary [0, {vocab})"),
        }),
        None => Ok(()),
    }
}
