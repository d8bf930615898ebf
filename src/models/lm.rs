//! The causal language model: embedding, backbone, LM head.

use crate::ssd::SsdBackend;
use burn::config::Config;
use burn::module::Module;
use burn::nn::{Embedding, Linear};
use burn::tensor::{backend::Backend, Distribution, Int, Tensor, TensorData};

use crate::error::Mamba2Error;
use crate::init::ParamInit;
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

/// The published language models (state-spaces `mamba2-*`, trained on the Pile with the
/// GPT-NeoX tokenizer): `(name, d_model, n_layer)`. Every other field is `Mamba2Config`'s
/// default, which is `mamba_ssm`'s (`d_state` 128, `headdim` 64, `expand` 2, one group,
/// chunks of 256); vocabulary 50,277 padded to a multiple of 16, tied embeddings.
const PUBLISHED: [(&str, usize, usize); 5] = [
    ("mamba2-130m", 768, 24),
    ("mamba2-370m", 1024, 48),
    ("mamba2-780m", 1536, 48),
    ("mamba2-1.3b", 2048, 48),
    ("mamba2-2.7b", 2560, 64),
];

/// The vocabulary of the published models (GPT-NeoX's tokenizer).
const PUBLISHED_VOCAB: usize = 50_277;

impl Mamba2LmConfig {
    /// The shape of a published model by its name (`mamba2-130m`, `mamba2-370m`,
    /// `mamba2-780m`, `mamba2-1.3b`, `mamba2-2.7b`; the `state-spaces/` prefix may be given),
    /// as its `config.json` describes it; `None` for another name.
    pub fn published(name: &str) -> Option<Self> {
        let name = name.strip_prefix("state-spaces/").unwrap_or(name);
        PUBLISHED
            .iter()
            .find(|(n, ..)| *n == name)
            .map(|&(_, d_model, n_layer)| {
                let mixer = crate::layers::mixer::Mamba2Config::new(d_model);
                Self::new(Mamba2BackboneConfig::new(n_layer, mixer), PUBLISHED_VOCAB)
            })
    }

    /// The names [`published`](Self::published) knows, smallest first.
    pub fn published_names() -> impl Iterator<Item = &'static str> {
        PUBLISHED.iter().map(|(n, ..)| *n)
    }

    /// `state-spaces/mamba2-130m`: `d_model` 768, 24 layers, 129M parameters.
    pub fn mamba2_130m() -> Self {
        Self::published("mamba2-130m").expect("a published name")
    }

    /// `state-spaces/mamba2-370m`: `d_model` 1024, 48 layers, 368M parameters.
    pub fn mamba2_370m() -> Self {
        Self::published("mamba2-370m").expect("a published name")
    }

    /// `state-spaces/mamba2-780m`: `d_model` 1536, 48 layers, 780M parameters.
    pub fn mamba2_780m() -> Self {
        Self::published("mamba2-780m").expect("a published name")
    }

    /// `state-spaces/mamba2-1.3b`: `d_model` 2048, 48 layers, 1.34B parameters.
    pub fn mamba2_1_3b() -> Self {
        Self::published("mamba2-1.3b").expect("a published name")
    }

    /// `state-spaces/mamba2-2.7b`: `d_model` 2560, 64 layers, 2.70B parameters.
    pub fn mamba2_2_7b() -> Self {
        Self::published("mamba2-2.7b").expect("a published name")
    }

    /// The number of parameters [`init`](Self::init) creates (the embedding once when tied),
    /// computed from the config without building the model.
    pub fn num_params(&self) -> usize {
        self.param_count() as usize
    }

    /// [`num_params`](Self::num_params) in `f64`, which cannot overflow for sizes from a
    /// corrupt file (the checkpoint loaders compare it with a file's size first).
    pub(crate) fn param_count(&self) -> f64 {
        let multiple = self.pad_vocab_size_multiple.max(1) as f64;
        let vocab = (self.vocab_size as f64 / multiple).ceil() * multiple;
        let embedding = vocab * self.backbone.mixer.d_model as f64;
        let head = if self.tie_embeddings { 0.0 } else { embedding };
        self.backbone.param_count() + embedding + head
    }

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
        self.build(&ParamInit::now(device))
    }

    /// [`init`](Self::init) with parameters made by `init`.
    pub(crate) fn build<B: Backend>(
        &self,
        init: &ParamInit<B>,
    ) -> crate::error::Result<Mamba2Lm<B>> {
        self.validate()?;
        let (v, d) = (self.padded_vocab_size(), self.backbone.mixer.d_model);
        let embedding = Embedding {
            weight: init.random(
                [v, d],
                Distribution::Normal(0.0, self.initializer_range),
                1.0,
            ),
        };
        let lm_head = (!self.tie_embeddings).then(|| init.linear(d, v, false, 1.0));
        Ok(Mamba2Lm {
            embedding,
            backbone: self.backbone.build(init)?,
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
        checked_ids(rows, self.vocab_size, device)
    }

    /// Hidden states to logits.
    ///
    /// # Shapes
    /// - h: `[b, l, d_model]`; returns `[b, l, vocab]`
    pub fn head(&self, h: Tensor<B, 3>) -> Tensor<B, 3>
    where
        B: SsdBackend,
    {
        let Some(head) = &self.lm_head else {
            return tied_logits(h, self.embedding.weight.val());
        };
        head.forward(h)
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

/// The logits of a head tied to the embedding matrix `embedding` (`[vocab, d_model]`): `h · Eᵀ`.
/// With fewer rows than the embedding's width (a decode step, a short prompt) it computes
/// `E · hᵀ` and transposes it back: `h · Eᵀ` would have stock burn-ndarray copy the transposed
/// `[vocab, d_model]` matrix at every call (154 MB at Mamba-2 130m, 308 MB at Granite 4.0-H
/// 350m), where this copies `rows` rows of logits. Both are plain products for autodiff.
///
/// # Shapes
/// - h: `[..., d_model]`; returns `[..., vocab]`
pub(crate) fn tied_logits<B: Backend, const D: usize>(
    h: Tensor<B, D>,
    embedding: Tensor<B, 2>,
) -> Tensor<B, D> {
    let mut dims = h.dims();
    let [v, d] = embedding.dims();
    let rows = h.shape().num_elements() / d.max(1);
    let h = h.reshape([rows, d]);
    let logits = if rows < d {
        embedding.matmul(h.transpose()).transpose()
    } else {
        h.matmul(embedding.transpose())
    };
    dims[D - 1] = v;
    logits.reshape(dims)
}

/// Checks that every id of `ids` is in `[0, vocab)` or equals `allowed` (an ignore index), with
/// an [`InvalidInput`](Mamba2Error::InvalidInput) error named `name` for the first that is not.
/// `rows` of host token ids as the `[rows, l]` input of a model with `vocab` tokens: rows of
/// one length, every id in `[0, vocab)`.
pub(crate) fn checked_ids<B: Backend>(
    rows: &[Vec<i64>],
    vocab: usize,
    device: &B::Device,
) -> crate::error::Result<Tensor<B, 2, Int>> {
    let l = rows.first().map_or(0, Vec::len);
    if let Some(row) = rows.iter().find(|r| r.len() != l) {
        return Err(Mamba2Error::Shape {
            name: "input_ids",
            expected: format!("rows of one length ({l})"),
            actual: vec![rows.len(), row.len()],
        });
    }
    let flat: Vec<i64> = rows.concat();
    check_in_vocab(&flat, vocab, None, "input_ids")?;
    Ok(Tensor::from_data(
        TensorData::new(flat, [rows.len(), l]),
        device,
    ))
}

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
