//! One layer of a hybrid model and its cache: a token mixer (the Mamba-2 layer or attention)
//! and an MLP, each behind an RMSNorm on a scaled residual branch.

use burn::config::Config;
use burn::module::Module;
use burn::tensor::{backend::Backend, Tensor};

use crate::layers::attention::{Attention, KvCache};
use crate::layers::mixer::Mamba2;
use crate::layers::mlp::Mlp;
use crate::layers::norm::RmsNorm;
use crate::layers::state::Mamba2State;
use crate::precision::{cast_to, reshape_via_flat};
use crate::ssd::SsdBackend;

/// The token mixer of a layer.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// A [`Mamba2`] layer (transformers' `linear_attention`, `mamba`).
    Mamba,
    /// Causal grouped-query [`Attention`] (`full_attention`, `attention`).
    Attention,
}

/// What one layer carries from one piece of a sequence to the next: the Mamba-2 layer's conv
/// and SSM state, or the attention's keys and values.
#[derive(Clone, Debug)]
pub struct LayerCache<B: Backend> {
    /// The Mamba-2 layer's state (`None` for an attention layer, or before the first token).
    pub mamba: Option<Mamba2State<B>>,
    /// The attention's keys and values (`None` for a Mamba-2 layer, or before the first token).
    pub kv: Option<KvCache<B>>,
}

impl<B: Backend> LayerCache<B> {
    /// The cache of a layer that has seen nothing.
    pub fn empty() -> Self {
        Self {
            mamba: None,
            kv: None,
        }
    }

    /// Cuts the autodiff graph.
    pub fn detach(self) -> Self {
        Self {
            mamba: self.mamba.map(Mamba2State::detach),
            kv: self.kv.map(KvCache::detach),
        }
    }
}

/// A pre-norm layer: `h ← h + r · mixer(input_norm(h))`, then `h ← h + r · mlp(ffn_norm(h))`,
/// with `r` the residual multiplier. Exactly one of `mamba` and `attention` is present.
#[derive(Module, Debug)]
pub struct HybridLayer<B: Backend> {
    /// The norm before the mixer.
    pub input_norm: RmsNorm<B>,
    /// The Mamba-2 mixer, in a Mamba layer.
    pub mamba: Option<Mamba2<B>>,
    /// The attention, in an attention layer.
    pub attention: Option<Attention<B>>,
    /// The norm before the MLP.
    pub ffn_norm: RmsNorm<B>,
    /// The MLP.
    pub mlp: Mlp<B>,
    pub(crate) residual_multiplier: f64,
}

impl<B: Backend> HybridLayer<B> {
    /// The kind of the layer's mixer.
    pub fn kind(&self) -> LayerKind {
        if self.mamba.is_some() {
            LayerKind::Mamba
        } else {
            LayerKind::Attention
        }
    }

    /// `h + r · branch`, in the residual stream's type.
    fn add<const D: usize>(&self, h: Tensor<B, D>, branch: Tensor<B, D>) -> Tensor<B, D> {
        let dtype = h.dtype();
        h + cast_to(branch, dtype) * self.residual_multiplier
    }

    /// The MLP's half of the layer.
    fn feed_forward<const D: usize>(&self, h: Tensor<B, D>) -> Tensor<B, D> {
        let u = self.ffn_norm.forward(h.clone());
        let out = self.mlp.forward(u);
        self.add(h, out)
    }

    /// Runs the layer over `l` tokens that follow its `cache`.
    ///
    /// # Shapes
    /// - h: `[b, l, d_model]`; returns `[b, l, d_model]` and the new cache
    pub fn forward(
        &self,
        h: Tensor<B, 3>,
        cache: LayerCache<B>,
    ) -> crate::error::Result<(Tensor<B, 3>, LayerCache<B>)>
    where
        B: SsdBackend,
    {
        let u = self.input_norm.forward(h.clone());
        let (out, cache) = match (&self.mamba, &self.attention) {
            (Some(mamba), _) => {
                let (y, state) = mamba.forward(u, cache.mamba)?;
                (
                    y,
                    LayerCache {
                        mamba: Some(state),
                        kv: None,
                    },
                )
            }
            (None, Some(attention)) => {
                let (y, kv) = attention.forward(u, cache.kv)?;
                (
                    y,
                    LayerCache {
                        mamba: None,
                        kv: Some(kv),
                    },
                )
            }
            (None, None) => unreachable!("a layer has a mixer"),
        };
        let h = self.add(h, out);
        Ok((self.feed_forward(h), cache))
    }

    /// One token through the layer: the Mamba-2 layer's recurrent step, or attention over the
    /// cache and the token.
    ///
    /// # Shapes
    /// - h: `[b, d_model]`; returns `[b, d_model]` and the new cache
    pub fn step(
        &self,
        h: Tensor<B, 2>,
        cache: LayerCache<B>,
    ) -> crate::error::Result<(Tensor<B, 2>, LayerCache<B>)>
    where
        B: SsdBackend,
    {
        // no view reshape between unit-axis shapes (`[b, d]` to `[b, 1, d]` and back): with them
        // the step of `granite_dense` gave every row the logits of row 0 on Wgpu with fusion
        // (see `precision::reshape_via_flat`); a flat copy for attention, none for the Mamba step
        let [b, d] = h.dims();
        let Some(mamba) = &self.mamba else {
            let (h, cache) = self.forward(reshape_via_flat(h, [b, 1, d]), cache)?;
            return Ok((reshape_via_flat(h, [b, d]), cache));
        };
        let state = match cache.mamba {
            Some(state) => state,
            None => mamba.zero_state(b, &h.device()),
        };
        let u = self.input_norm.forward(h.clone());
        let (y, state) = mamba.step(u, state)?;
        let h = self.feed_forward(self.add(h, y));
        Ok((
            h,
            LayerCache {
                mamba: Some(state),
                kv: None,
            },
        ))
    }
}
