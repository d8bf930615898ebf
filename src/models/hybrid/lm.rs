//! The hybrid causal language model: embedding, layers, final norm, LM head, and its cache.

use burn::module::Module;
use burn::nn::{Embedding, Linear};
use burn::tensor::{backend::Backend, Int, Tensor};

use super::layer::{HybridLayer, LayerCache};
use crate::error::{check_shape, Mamba2Error};
use crate::layers::attention::PackedTokens;
use crate::layers::documents::Documents;
use crate::layers::norm::RmsNorm;
use crate::models::lm::{check_in_vocab, checked_ids, tied_logits};
use crate::precision::upcast;
use crate::ssd::SsdBackend;

/// What a [`HybridLm`] carries from one piece of a sequence to the next: one [`LayerCache`] per
/// layer, in order.
#[derive(Clone, Debug)]
pub struct HybridCache<B: Backend> {
    /// Per-layer caches.
    pub layers: Vec<LayerCache<B>>,
}

impl<B: Backend> HybridCache<B> {
    /// Cuts the autodiff graph of every layer's cache.
    pub fn detach(self) -> Self {
        Self {
            layers: self.layers.into_iter().map(LayerCache::detach).collect(),
        }
    }
}

/// A hybrid causal language model (Granite 4.0-H, Bamba, Nemotron-H, Falcon-H1): Mamba-2 and
/// attention layers (alone or side by side) and MLPs over one residual stream.
///
/// Built by [`HybridConfig::init`](super::HybridConfig::init) or loaded from a transformers
/// folder by [`load_hybrid`](crate::checkpoint::load_hybrid).
#[derive(Module, Debug)]
pub struct HybridLm<B: Backend> {
    /// Token embedding `[vocab, d_model]`.
    pub embedding: Embedding<B>,
    /// The layers, in order.
    pub layers: Vec<HybridLayer<B>>,
    /// The final norm.
    pub norm: RmsNorm<B>,
    /// Separate head (`None` when tied to the embedding).
    pub lm_head: Option<Linear<B>>,
    pub(crate) vocab_size: usize,
    pub(crate) d_model: usize,
    pub(crate) embedding_multiplier: f64,
    pub(crate) logits_scaling: f64,
    pub(crate) logits_multiplier: f64,
}

impl<B: Backend> HybridLm<B> {
    /// The width of the logits.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Width of the residual stream.
    pub fn d_model(&self) -> usize {
        self.d_model
    }

    /// Checks token ids on the host: every id in `[0, vocab_size)`. As for
    /// [`Mamba2Lm::check_token_ids`](crate::Mamba2Lm::check_token_ids), the forward and the
    /// step do not read their ids back to check them.
    pub fn check_token_ids(&self, ids: &[i64]) -> crate::error::Result<()> {
        check_in_vocab(ids, self.vocab_size, None, "input_ids")
    }

    /// The checked input of [`forward`](Self::forward) from host token ids: `rows` of equal
    /// length, each id in `[0, vocab_size)`.
    ///
    /// # Shapes
    /// - returns `[rows.len(), row length]`
    pub fn input_ids(
        &self,
        rows: &[Vec<i64>],
        device: &B::Device,
    ) -> crate::error::Result<Tensor<B, 2, Int>> {
        checked_ids(rows, self.vocab_size, device)
    }

    /// The cache of a fresh batch (every layer empty).
    pub fn empty_cache(&self) -> HybridCache<B> {
        HybridCache {
            layers: self.layers.iter().map(|_| LayerCache::empty()).collect(),
        }
    }

    fn check_cache(&self, cache: &HybridCache<B>) -> crate::error::Result<()> {
        if cache.layers.len() != self.layers.len() {
            return Err(Mamba2Error::Shape {
                name: "cache.layers",
                expected: format!("{} layer caches", self.layers.len()),
                actual: vec![cache.layers.len()],
            });
        }
        Ok(())
    }

    /// The scaled embeddings of `ids`, in the residual stream's type (`f32` or wider).
    fn embed<const D: usize>(&self, ids: Tensor<B, D, Int>) -> Tensor<B, 3>
    where
        B: SsdBackend,
    {
        let dims = ids.dims();
        let (b, l) = if D == 1 {
            (dims[0], 1)
        } else {
            (dims[0], dims[1])
        };
        upcast(self.embedding.forward(ids.reshape([b, l]))) * self.embedding_multiplier
    }

    /// Hidden states `[.., d_model]` (after the final norm) to logits `[.., vocab]`, at any
    /// rank, so that the step's need no reshape (see `HybridLayer::step`).
    fn head<const D: usize>(&self, h: Tensor<B, D>) -> Tensor<B, D> {
        let logits = match &self.lm_head {
            Some(head) => head.forward(h),
            None => tied_logits(h, self.embedding.weight.val()),
        };
        // Granite divides, Falcon-H1 multiplies: each as its family does, for the same rounding
        let logits = if self.logits_scaling == 1.0 {
            logits
        } else {
            logits / self.logits_scaling
        };
        if self.logits_multiplier == 1.0 {
            logits
        } else {
            logits * self.logits_multiplier
        }
    }

    /// The residual stream after each layer (before the final norm), continuing from `cache`
    /// (a fresh sequence when `None`), and the new cache.
    ///
    /// # Shapes
    /// - ids: `[b, l]`; returns one `[b, l, d_model]` per layer
    pub fn forward_layers(
        &self,
        ids: Tensor<B, 2, Int>,
        cache: Option<HybridCache<B>>,
    ) -> crate::error::Result<(Vec<Tensor<B, 3>>, HybridCache<B>)>
    where
        B: SsdBackend,
    {
        check_shape("ids", &ids.dims(), &[None, None], "b, l")?;
        let cache = cache.unwrap_or_else(|| self.empty_cache());
        self.check_cache(&cache)?;
        let mut h = self.embed(ids);
        let mut outputs = Vec::with_capacity(self.layers.len());
        let mut caches = Vec::with_capacity(self.layers.len());
        for (layer, c) in self.layers.iter().zip(cache.layers) {
            let (out, c) = layer.forward(h, c)?;
            outputs.push(out.clone());
            caches.push(c);
            h = out;
        }
        Ok((outputs, HybridCache { layers: caches }))
    }

    /// Next-token logits for every position, continuing from `cache` (a fresh sequence when
    /// `None`): the Mamba-2 layers run the chunked SSD from their state, attention attends to
    /// the cached keys. The ids are not read back to check them: build them with
    /// [`input_ids`](Self::input_ids).
    ///
    /// # Shapes
    /// - ids: `[b, l]`; returns logits `[b, l, vocab]` and the new cache
    pub fn forward(
        &self,
        ids: Tensor<B, 2, Int>,
        cache: Option<HybridCache<B>>,
    ) -> crate::error::Result<(Tensor<B, 3>, HybridCache<B>)>
    where
        B: SsdBackend,
    {
        let (mut outputs, cache) = self.forward_layers(ids, cache)?;
        let last = outputs.pop().expect("at least one layer");
        Ok((self.head(self.norm.forward(last)), cache))
    }

    /// Next-token logits of fresh rows of packed documents (`documents`; `None`: one sequence
    /// a row): neither the Mamba layers' state nor attention crosses a document boundary, and
    /// rotary positions restart at each document, so every document gets the logits it has
    /// alone. (No cache comes out: a row's documents end at different places.)
    ///
    /// # Shapes
    /// - ids, documents: `[b, l]`; returns logits `[b, l, vocab]`
    pub fn forward_documents(
        &self,
        ids: Tensor<B, 2, Int>,
        documents: Option<&Documents<B>>,
    ) -> crate::error::Result<Tensor<B, 3>>
    where
        B: SsdBackend,
    {
        let Some(documents) = documents else {
            return Ok(self.forward(ids, None)?.0);
        };
        check_shape("ids", &ids.dims(), &[None, None], "b, l")?;
        let [b, l] = ids.dims();
        documents.check(b, l)?;
        let packed = PackedTokens::new(documents);
        let mut h = self.embed(ids);
        for layer in &self.layers {
            h = layer.forward_documents(h, &packed)?;
        }
        Ok(self.head(self.norm.forward(h)))
    }

    /// The hidden states after the final norm, for a fresh sequence.
    ///
    /// # Shapes
    /// - ids: `[b, l]`; returns `[b, l, d_model]`
    pub fn hidden_states(&self, ids: Tensor<B, 2, Int>) -> crate::error::Result<Tensor<B, 3>>
    where
        B: SsdBackend,
    {
        let (mut outputs, _) = self.forward_layers(ids, None)?;
        Ok(self
            .norm
            .forward(outputs.pop().expect("at least one layer")))
    }

    /// Logits after one new token per sequence: the Mamba-2 layers' recurrent step (constant
    /// time), attention over the cache.
    ///
    /// # Shapes
    /// - ids: `[b]`; returns logits `[b, vocab]` and the new cache
    pub fn step(
        &self,
        ids: Tensor<B, 1, Int>,
        cache: HybridCache<B>,
    ) -> crate::error::Result<(Tensor<B, 2>, HybridCache<B>)>
    where
        B: SsdBackend,
    {
        self.check_cache(&cache)?;
        // the rows of the embedding, `[b, d_model]` without a reshape (see `HybridLayer::step`)
        let mut h = upcast(self.embedding.weight.val().select(0, ids)) * self.embedding_multiplier;
        let mut caches = Vec::with_capacity(self.layers.len());
        for (layer, c) in self.layers.iter().zip(cache.layers) {
            let (out, c) = layer.step(h, c)?;
            caches.push(c);
            h = out;
        }
        let logits = self.head(self.norm.forward(h));
        Ok((logits, HybridCache { layers: caches }))
    }
}
