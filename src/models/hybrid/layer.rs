//! One layer of a hybrid model and its cache: a token mixer (a Mamba-2 or Mamba-3 layer, or
//! attention)
//! and a feed-forward part (an MLP, a mixture of experts, or both summed), each behind an
//! RMSNorm on a scaled residual branch; or, in the families whose layers are one operation each
//! (Nemotron-H), the mixer, the MLP or the mixture of experts alone.

use burn::config::Config;
use burn::module::Module;
use burn::tensor::{backend::Backend, Tensor};

use crate::layers::attention::{Attention, KvCache, PackedTokens};
use crate::layers::mamba3::Mamba3;
use crate::layers::mixer::Mamba2;
use crate::layers::mlp::Mlp;
use crate::layers::moe::Moe;
use crate::layers::norm::RmsNorm;
use crate::layers::state::Mamba2State;
use crate::precision::{cast_to, reshape_via_flat};
use crate::ssd::{SsdBackend, TrapezoidalState};

/// What a layer computes first: its token mixer (or two side by side), or (in Nemotron-H) an
/// MLP or a mixture of experts alone.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// A [`Mamba2`] layer (transformers' `linear_attention`, `mamba`).
    Mamba,
    /// Causal grouped-query [`Attention`] (`full_attention`, `attention`).
    Attention,
    /// An [`Mlp`] on its own, without a mixer (Nemotron-H's `mlp`).
    Mlp,
    /// A [`Mamba2`] layer and [`Attention`] side by side on the same input, their outputs
    /// summed (Falcon-H1's `hybrid`).
    Parallel,
    /// A mixture of experts ([`Moe`], with its shared expert) on its own (Nemotron-H's `moe`).
    Moe,
    /// A [`Mamba3`] layer (`mamba_ssm`'s `ssm_cfg.layer = "Mamba3"`).
    Mamba3,
}

/// What one layer carries from one piece of a sequence to the next: the Mamba-2 layer's conv
/// and SSM state, the Mamba-3 layer's state, or the attention's keys and values (each `None`
/// where the layer has no such part, or before the first token).
#[derive(Clone, Debug)]
pub struct LayerCache<B: Backend> {
    /// The Mamba-2 layer's state.
    pub mamba: Option<Mamba2State<B>>,
    /// The Mamba-3 layer's state.
    pub mamba3: Option<TrapezoidalState<B>>,
    /// The attention's keys and values.
    pub kv: Option<KvCache<B>>,
}

impl<B: Backend> LayerCache<B> {
    /// The cache of a layer that has seen nothing.
    pub fn empty() -> Self {
        Self {
            mamba: None,
            mamba3: None,
            kv: None,
        }
    }

    /// Cuts the autodiff graph.
    pub fn detach(self) -> Self {
        Self {
            mamba: self.mamba.map(Mamba2State::detach),
            mamba3: self.mamba3.map(TrapezoidalState::detach),
            kv: self.kv.map(KvCache::detach),
        }
    }
}

/// A pre-norm layer: `h ← h + r · mixer(input_norm(h))`, then, where the layer has both,
/// `h ← h + r · ffn(ffn_norm(h))`, with `r` the residual multiplier and `ffn` the MLP, the
/// mixture of experts, or the sum of both (Granite's `shared_mlp` beside its experts). The mixer
/// is `mamba` (or `mamba3`), `attention`, or both side by side (`o_m · mamba(i_m · u) + o_a · attention(i_a ·
/// u)`, with the branches' in and out multipliers); with neither, the layer is its feed-forward
/// part alone: `h ← h + r · ffn(input_norm(h))`.
#[derive(Module, Debug)]
pub struct HybridLayer<B: Backend> {
    /// The norm before the mixer (or before the MLP of an MLP layer).
    pub input_norm: RmsNorm<B>,
    /// The Mamba-2 mixer, in a Mamba layer.
    pub mamba: Option<Mamba2<B>>,
    /// The Mamba-3 mixer, in a Mamba-3 layer.
    pub mamba3: Option<Mamba3<B>>,
    /// The attention, in an attention layer.
    pub attention: Option<Attention<B>>,
    /// The norm before the MLP that follows the mixer (`None` in an MLP layer, and in the
    /// families whose mixer layers have no MLP).
    pub ffn_norm: Option<RmsNorm<B>>,
    /// The MLP: after the mixer, or the whole of an MLP layer.
    pub mlp: Option<Mlp<B>>,
    /// The mixture of experts: beside the MLP after the mixer, or the whole of a MoE layer.
    pub moe: Option<Moe<B>>,
    pub(crate) residual_multiplier: f64,
    /// The Mamba branch's input and output factors.
    pub(crate) mamba_multipliers: (f64, f64),
    /// The attention branch's input and output factors.
    pub(crate) attention_multipliers: (f64, f64),
}

impl<B: Backend> HybridLayer<B> {
    /// What the layer computes first.
    pub fn kind(&self) -> LayerKind {
        if self.mamba3.is_some() {
            return LayerKind::Mamba3;
        }
        match (&self.mamba, &self.attention) {
            (Some(_), Some(_)) => LayerKind::Parallel,
            (Some(_), None) => LayerKind::Mamba,
            (None, Some(_)) => LayerKind::Attention,
            (None, None) if self.mlp.is_none() => LayerKind::Moe,
            (None, None) => LayerKind::Mlp,
        }
    }

    /// `h + r · branch`, in the residual stream's type.
    fn add<const D: usize>(&self, h: Tensor<B, D>, branch: Tensor<B, D>) -> Tensor<B, D> {
        let dtype = h.dtype();
        h + cast_to(branch, dtype) * self.residual_multiplier
    }

    /// The feed-forward part: the MLP, the mixture of experts (on the tokens flattened), or
    /// their sum.
    ///
    /// # Shapes
    /// - u: `[..., d_model]`; returns the same shape
    fn ffn<const D: usize>(&self, u: Tensor<B, D>) -> Tensor<B, D> {
        let mlp = self.mlp.as_ref().map(|mlp| mlp.forward(u.clone()));
        let moe = self.moe.as_ref().map(|moe| {
            let dims = u.dims();
            let d = dims[D - 1];
            let tokens = u.shape().num_elements() / d;
            moe.forward(u.reshape([tokens, d])).reshape(dims)
        });
        match (mlp, moe) {
            (Some(a), Some(b)) => a + b,
            (Some(y), None) | (None, Some(y)) => y,
            (None, None) => unreachable!("a layer's feed-forward part has an MLP or experts"),
        }
    }

    /// The feed-forward half of a mixer layer (none where the layer has no `ffn_norm`).
    fn feed_forward<const D: usize>(&self, h: Tensor<B, D>) -> Tensor<B, D> {
        match &self.ffn_norm {
            Some(norm) => {
                let out = self.ffn(norm.forward(h.clone()));
                self.add(h, out)
            }
            None => h,
        }
    }

    /// Whether the layer has a token mixer (a Mamba layer or attention).
    fn has_mixer(&self) -> bool {
        self.mamba.is_some() || self.mamba3.is_some() || self.attention.is_some()
    }

    /// A layer without a mixer: `h + r · ffn(input_norm(h))`.
    fn ffn_alone<const D: usize>(&self, h: Tensor<B, D>) -> Tensor<B, D> {
        let out = self.ffn(self.input_norm.forward(h.clone()));
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
        self.mix(h, Context::Cache(cache))
    }

    /// Runs the layer over fresh rows of packed documents (`packed`): no state and no
    /// attention crosses a document boundary.
    ///
    /// # Shapes
    /// - h: `[b, l, d_model]`, packed: `[b, l]`; returns `[b, l, d_model]`
    pub fn forward_documents(
        &self,
        h: Tensor<B, 3>,
        packed: &PackedTokens<B>,
    ) -> crate::error::Result<Tensor<B, 3>>
    where
        B: SsdBackend,
    {
        Ok(self.mix(h, Context::Packed(packed))?.0)
    }

    /// The layer over `h`, from a cache or on packed documents.
    fn mix(
        &self,
        h: Tensor<B, 3>,
        context: Context<'_, B>,
    ) -> crate::error::Result<(Tensor<B, 3>, LayerCache<B>)>
    where
        B: SsdBackend,
    {
        if !self.has_mixer() {
            return Ok((self.ffn_alone(h), LayerCache::empty()));
        }
        let (cache, packed) = match context {
            Context::Cache(cache) => (cache, None),
            Context::Packed(packed) => (LayerCache::empty(), Some(packed)),
        };
        let u = self.input_norm.forward(h.clone());
        let mut next = LayerCache::empty();
        let mut out = None;
        if let Some(mamba) = &self.mamba {
            let (mi, mo) = self.mamba_multipliers;
            let documents = packed.map(PackedTokens::documents);
            let (y, state) =
                mamba.forward_documents(scaled(u.clone(), mi), documents, cache.mamba)?;
            out = Some(scaled(y, mo));
            next.mamba = Some(state);
        }
        if let Some(mamba3) = &self.mamba3 {
            if packed.is_some() {
                return Err(crate::error::Mamba2Error::InvalidInput {
                    name: "documents",
                    reason: "packed documents are not supported by Mamba-3 layers yet".into(),
                });
            }
            let (mi, mo) = self.mamba_multipliers;
            let (y, state) = mamba3.forward(scaled(u.clone(), mi), cache.mamba3)?;
            out = Some(scaled(y, mo));
            next.mamba3 = Some(state);
        }
        if let Some(attention) = &self.attention {
            let (ai, ao) = self.attention_multipliers;
            let y = match packed {
                Some(packed) => attention.forward_documents(scaled(u, ai), packed)?,
                None => {
                    let (y, kv) = attention.forward(scaled(u, ai), cache.kv)?;
                    next.kv = Some(kv);
                    y
                }
            };
            let y = scaled(y, ao);
            out = Some(match out {
                Some(m) => m + y,
                None => y,
            });
        }
        let out = out.expect("a layer with a mixer");
        let h = self.add(h, out);
        Ok((self.feed_forward(h), next))
    }

    /// One token through the layer: the Mamba-2 layer's recurrent step, attention over the
    /// cache and the token, both side by side, or the MLP.
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
        if !self.has_mixer() {
            return Ok((self.ffn_alone(h), LayerCache::empty()));
        }
        let u = self.input_norm.forward(h.clone());
        let mut next = LayerCache::empty();
        let mut out = None;
        if let Some(mamba) = &self.mamba {
            let state = match cache.mamba {
                Some(state) => state,
                None => mamba.zero_state(b, &h.device()),
            };
            let (mi, mo) = self.mamba_multipliers;
            let (y, state) = mamba.step(scaled(u.clone(), mi), state)?;
            out = Some(scaled(y, mo));
            next.mamba = Some(state);
        }
        if let Some(mamba3) = &self.mamba3 {
            let state = match cache.mamba3 {
                Some(state) => state,
                None => mamba3.zero_state(b, &h.device()),
            };
            let (mi, mo) = self.mamba_multipliers;
            let (y, state) = mamba3.step(scaled(u.clone(), mi), state)?;
            out = Some(scaled(y, mo));
            next.mamba3 = Some(state);
        }
        if let Some(attention) = &self.attention {
            let (ai, ao) = self.attention_multipliers;
            let x = reshape_via_flat(scaled(u, ai), [b, 1, d]);
            let (y, kv) = attention.forward(x, cache.kv)?;
            let y = scaled(reshape_via_flat(y, [b, d]), ao);
            out = Some(match out {
                Some(m) => m + y,
                None => y,
            });
            next.kv = Some(kv);
        }
        let out = out.expect("a layer with a mixer");
        let h = self.add(h, out);
        Ok((self.feed_forward(h), next))
    }
}

/// `t · factor`, skipped where the factor is 1.
fn scaled<B: Backend, const D: usize>(t: Tensor<B, D>, factor: f64) -> Tensor<B, D> {
    if factor == 1.0 {
        t
    } else {
        t * factor
    }
}

/// What a layer's forward continues: a cache, or fresh rows of packed documents.
enum Context<'a, B: Backend> {
    Cache(LayerCache<B>),
    Packed(&'a PackedTokens<B>),
}
