//! Causal grouped-query attention with a KV cache, as the hybrid models interleave it with
//! Mamba-2 layers: `n_kv_heads` key/value heads, each serving `n_heads / n_kv_heads`
//! consecutive query heads; rotary positions on all or part of each head, or none (NoPE).

use burn::config::Config;
use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::{backend::Backend, Bool, Tensor, TensorData};

use crate::error::{check_shape, Mamba2Error};
use crate::init::ParamInit;
use crate::layers::activation::softmax;
use crate::layers::documents::Documents;
use crate::layers::lora::{adapted, merge, Lora, LoraConfig};
use crate::layers::rope::{RotaryEmbedding, RotaryEmbeddingConfig};
use crate::precision::{cast_to, reshape_via_flat, upcast};

/// Configuration of an [`Attention`] layer.
#[derive(Config, Debug)]
pub struct AttentionConfig {
    /// Width of the input and output.
    pub d_model: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (a divisor of `n_heads`; `n_heads` is multi-head attention, 1 is
    /// multi-query).
    pub n_kv_heads: usize,
    /// Channels of a head (the projections are `n_heads · head_dim` wide, which may differ
    /// from `d_model`).
    pub head_dim: usize,
    /// Biases on the four projections. Default: false.
    #[config(default = false)]
    pub bias: bool,
    /// The factor of the scores `q·kᵀ`. Default: `None`, `1/√head_dim`.
    pub scale: Option<f64>,
    /// Factor of the keys right after `k_proj`, before the rotary embedding and the cache
    /// (Falcon-H1's μP `key_multiplier`). Default: 1.
    #[config(default = 1.0)]
    pub key_multiplier: f64,
    /// Rotary position embedding; `None` is no positional encoding (NoPE). Default: None.
    pub rope: Option<RotaryEmbeddingConfig>,
}

impl AttentionConfig {
    /// Checks the sizes.
    pub fn validate(&self) -> crate::error::Result<()> {
        for (field, v) in [
            ("hidden_size", self.d_model),
            ("num_attention_heads", self.n_heads),
            ("num_key_value_heads", self.n_kv_heads),
            ("head_dim", self.head_dim),
        ] {
            if v == 0 {
                return Err(Mamba2Error::config(field, "must be at least 1"));
            }
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(Mamba2Error::config(
                "num_key_value_heads",
                format!(
                    "must divide num_attention_heads = {}, got {}",
                    self.n_heads, self.n_kv_heads
                ),
            ));
        }
        for (field, v) in [
            ("attention_multiplier", self.scale.unwrap_or(1.0)),
            ("key_multiplier", self.key_multiplier),
        ] {
            if !v.is_finite() {
                return Err(Mamba2Error::config(
                    field,
                    format!("must be finite, got {v}"),
                ));
            }
        }
        if let Some(rope) = &self.rope {
            if rope.head_dim != self.head_dim {
                return Err(Mamba2Error::config(
                    "head_dim",
                    format!(
                        "the rotary embedding's head_dim {} differs from the layer's {}",
                        rope.head_dim, self.head_dim
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Builds the layer, its weights drawn as PyTorch's `nn.Linear` does (`U(±1/√d_in)`).
    pub fn init<B: Backend>(&self, device: &B::Device) -> crate::error::Result<Attention<B>> {
        self.build(&ParamInit::now(device))
    }

    pub(crate) fn build<B: Backend>(
        &self,
        init: &ParamInit<B>,
    ) -> crate::error::Result<Attention<B>> {
        self.validate()?;
        let (d, q, kv) = (
            self.d_model,
            self.n_heads * self.head_dim,
            self.n_kv_heads * self.head_dim,
        );
        Ok(Attention {
            q_proj: init.linear(d, q, self.bias, 1.0),
            k_proj: init.linear(d, kv, self.bias, 1.0),
            v_proj: init.linear(d, kv, self.bias, 1.0),
            o_proj: init.linear(q, d, self.bias, 1.0),
            q_proj_lora: None,
            k_proj_lora: None,
            v_proj_lora: None,
            o_proj_lora: None,
            rope: self.rope.as_ref().map(|r| r.init()).transpose()?,
            d_model: self.d_model,
            n_heads: self.n_heads,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
            scale: self.scale.unwrap_or(1.0 / (self.head_dim as f64).sqrt()),
            key_multiplier: self.key_multiplier,
        })
    }
}

/// The keys and values an [`Attention`] layer has seen, for decoding one token at a time.
#[derive(Clone, Debug)]
pub struct KvCache<B: Backend> {
    /// Keys after the rotary embedding, `[b, n_kv_heads, t, head_dim]`.
    pub key: Tensor<B, 4>,
    /// Values, `[b, n_kv_heads, t, head_dim]`.
    pub value: Tensor<B, 4>,
}

impl<B: Backend> KvCache<B> {
    /// Tokens seen (`t`).
    pub fn len(&self) -> usize {
        self.key.dims()[2]
    }

    /// Whether no token has been seen.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Cuts the autodiff graph.
    pub fn detach(self) -> Self {
        Self {
            key: self.key.detach(),
            value: self.value.detach(),
        }
    }
}

/// Causal softmax attention over grouped query heads:
/// `o_proj(softmax(scale · q·kᵀ + causal mask) · v)`, keys and values repeated over the query
/// heads of their group.
#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    /// `d_model → n_heads · head_dim`.
    pub q_proj: Linear<B>,
    /// `d_model → n_kv_heads · head_dim`.
    pub k_proj: Linear<B>,
    /// `d_model → n_kv_heads · head_dim`.
    pub v_proj: Linear<B>,
    /// `n_heads · head_dim → d_model`.
    pub o_proj: Linear<B>,
    /// Low-rank updates of the four projections (fine-tuning;
    /// [`with_lora`](Self::with_lora)).
    pub q_proj_lora: Option<Lora<B>>,
    /// See `q_proj_lora`.
    pub k_proj_lora: Option<Lora<B>>,
    /// See `q_proj_lora`.
    pub v_proj_lora: Option<Lora<B>>,
    /// See `q_proj_lora`.
    pub o_proj_lora: Option<Lora<B>>,
    rope: Option<RotaryEmbedding>,
    d_model: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    scale: f64,
    key_multiplier: f64,
}

impl<B: Backend> Attention<B> {
    /// Width of the input.
    pub fn d_model(&self) -> usize {
        self.d_model
    }

    /// The layer with low-rank updates on the projections that `lora` targets (`q_proj`,
    /// `k_proj`, `v_proj`, `o_proj`), in place of any it had.
    pub fn with_lora(mut self, lora: &LoraConfig) -> crate::error::Result<Self> {
        self.q_proj_lora = lora.init_for("q_proj", &self.q_proj)?;
        self.k_proj_lora = lora.init_for("k_proj", &self.k_proj)?;
        self.v_proj_lora = lora.init_for("v_proj", &self.v_proj)?;
        self.o_proj_lora = lora.init_for("o_proj", &self.o_proj)?;
        Ok(self)
    }

    /// The layer with its low-rank updates folded into the projections' weights.
    pub fn merge_lora(mut self) -> Self {
        self.q_proj = merge(self.q_proj, &mut self.q_proj_lora);
        self.k_proj = merge(self.k_proj, &mut self.k_proj_lora);
        self.v_proj = merge(self.v_proj, &mut self.v_proj_lora);
        self.o_proj = merge(self.o_proj, &mut self.o_proj_lora);
        self
    }

    /// Whether the layer holds a low-rank update.
    pub fn has_lora(&self) -> bool {
        [
            &self.q_proj_lora,
            &self.k_proj_lora,
            &self.v_proj_lora,
            &self.o_proj_lora,
        ]
        .iter()
        .any(|l| l.is_some())
    }

    /// Checks the input's width.
    fn check_input(&self, x: &Tensor<B, 3>) -> crate::error::Result<()> {
        check_shape(
            "x",
            &x.dims(),
            &[None, None, Some(self.d_model())],
            "b, l, d_model",
        )
    }

    /// Runs the layer over `l` new tokens that follow the `cache`'s (a fresh sequence when
    /// `None`): token `i` attends to every cached token and to new tokens `0..=i`, at position
    /// `cache.len() + i`. Returns the output and the cache extended by the new tokens.
    ///
    /// # Shapes
    /// - x: `[b, l, d_model]`, cache: `[b, n_kv_heads, t, head_dim]`
    /// - returns `[b, l, d_model]` and the cache with `t + l` tokens
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        cache: Option<KvCache<B>>,
    ) -> crate::error::Result<(Tensor<B, 3>, KvCache<B>)> {
        self.check_input(&x)?;
        let [b, _, _] = x.dims();
        let (kv, hd) = (self.n_kv_heads, self.head_dim);
        if let Some(c) = &cache {
            check_shape(
                "cache.key",
                &c.key.dims(),
                &[Some(b), Some(kv), None, Some(hd)],
                "b, n_kv_heads, t, head_dim",
            )?;
            check_shape(
                "cache.value",
                &c.value.dims(),
                &c.key.dims().map(Some),
                "the keys' shape",
            )?;
        }
        let past = cache.as_ref().map_or(0, KvCache::len);
        Ok(self.attend(x, cache, Positions::From(past), None))
    }

    /// Runs the layer over fresh rows of packed documents: a token attends to the tokens of its
    /// own document up to itself, at its position in that document; each document's output is
    /// the one it has alone.
    ///
    /// # Shapes
    /// - x: `[b, l, d_model]`, packed: `[b, l]`; returns `[b, l, d_model]`
    pub fn forward_documents(
        &self,
        x: Tensor<B, 3>,
        packed: &PackedTokens<B>,
    ) -> crate::error::Result<Tensor<B, 3>> {
        self.check_input(&x)?;
        let [b, l, _] = x.dims();
        packed.documents.check(b, l)?;
        // the mask for each of the g query heads of a group stacked as rows (see `attend`)
        let g = self.n_heads / self.n_kv_heads;
        let other = Tensor::cat(vec![packed.other_document.clone(); g], 2);
        let positions = Positions::Packed(&packed.positions);
        Ok(self.attend(x, None, positions, Some(other)).0)
    }

    /// Attention of the new tokens `x` at `positions` over the cached ones and themselves,
    /// causal, and where `hidden` is set (`[b, 1, g·l, past + l]`) not at all.
    fn attend(
        &self,
        x: Tensor<B, 3>,
        cache: Option<KvCache<B>>,
        positions: Positions<'_>,
        hidden: Option<Tensor<B, 4, Bool>>,
    ) -> (Tensor<B, 3>, KvCache<B>) {
        let [b, l, _] = x.dims();
        let (h, kv, hd) = (self.n_heads, self.n_kv_heads, self.head_dim);
        let past = cache.as_ref().map_or(0, KvCache::len);
        let mut q = split_heads(adapted(&self.q_proj, &self.q_proj_lora, x.clone()), h, hd);
        let mut k = split_heads(adapted(&self.k_proj, &self.k_proj_lora, x.clone()), kv, hd);
        if self.key_multiplier != 1.0 {
            k = k * self.key_multiplier;
        }
        let v = split_heads(adapted(&self.v_proj, &self.v_proj_lora, x), kv, hd);
        if let Some(rope) = &self.rope {
            // one table for q and k
            let tables = match positions {
                Positions::From(start) => rope.tables(start, l, q.dtype(), &q.device()),
                Positions::Packed(p) => rope.tables_at(p, b, q.dtype(), &q.device()),
            };
            q = rope.apply(q, &tables);
            k = rope.apply(k, &tables);
        }
        let (k, v) = match cache {
            Some(c) => (
                Tensor::cat(vec![c.key, k], 2),
                Tensor::cat(vec![c.value, v], 2),
            ),
            None => (k, v),
        };
        let t = past + l;
        // the g = h / kv query heads of a group as one block of g·l rows against its keys (q is
        // a view with its axes swapped: a flat copy first, see `reshape_via_flat`)
        let g = h / kv;
        let q = reshape_via_flat(q, [b, kv, g * l, hd]);
        let scores = upcast(q.matmul(k.clone().swap_dims(2, 3))) * self.scale;
        let mask = causal_mask::<B>(g, l, past, &scores.device());
        let floor = masked_score(scores.dtype());
        let mut scores = scores.mask_fill(mask, floor);
        if let Some(hidden) = hidden {
            scores = scores.mask_fill(hidden, floor);
        }
        let probs = cast_to(softmax(scores, 3), v.dtype());
        let out = merge_heads(probs.matmul(v.clone()).reshape([b, h, l, hd]));
        debug_assert_eq!(k.dims()[2], t);
        let out = adapted(&self.o_proj, &self.o_proj_lora, out);
        (out, KvCache { key: k, value: v })
    }
}

/// Where the new tokens are: a run from a position, or packed documents' own positions.
enum Positions<'a> {
    From(usize),
    Packed(&'a [usize]),
}

/// Packed documents as attention takes them: each token's document, and its position in that
/// document (read back once, for the rotary tables of every attention layer).
#[derive(Clone, Debug)]
pub struct PackedTokens<B: Backend> {
    documents: Documents<B>,
    positions: Vec<usize>,
    /// `true` where key `j` is of another document than query `i`, `[b, 1, l, l]`: built once
    /// for every attention layer.
    other_document: Tensor<B, 4, Bool>,
}

impl<B: Backend> PackedTokens<B> {
    /// The tokens of `documents`, their positions read back from the device.
    pub fn new(documents: &Documents<B>) -> Self {
        let [b, l] = documents.dims();
        let seq_idx: Vec<i64> = documents.seq_idx().into_data().iter::<i64>().collect();
        let mut positions = Vec::with_capacity(b * l);
        for row in seq_idx.chunks(l.max(1)) {
            let mut start = 0;
            for (t, doc) in row.iter().enumerate() {
                if t > 0 && *doc != row[t - 1] {
                    start = t;
                }
                positions.push(t - start);
            }
        }
        let seq_idx = documents.seq_idx();
        let other_document = seq_idx
            .clone()
            .reshape([b, 1, l, 1])
            .expand([b, 1, l, l])
            .not_equal(seq_idx.reshape([b, 1, 1, l]).expand([b, 1, l, l]));
        Self {
            documents: documents.clone(),
            positions,
            other_document,
        }
    }

    /// The documents.
    pub fn documents(&self) -> &Documents<B> {
        &self.documents
    }
}

/// `[b, l, n · hd]` as `n` heads: `[b, n, l, hd]`. For one token both layouts are the same
/// memory, so it is a reshape: a view with swapped axes would have a unit axis, which Burn 0.21
/// gives wrong strides on Wgpu and Cuda (see `reshape_via_flat`).
fn split_heads<B: Backend>(t: Tensor<B, 3>, n: usize, hd: usize) -> Tensor<B, 4> {
    let [b, l, _] = t.dims();
    if l == 1 {
        return t.reshape([b, n, 1, hd]);
    }
    t.reshape([b, l, n, hd]).swap_dims(1, 2)
}

/// The inverse of [`split_heads`]: `[b, n, l, hd]` to `[b, l, n · hd]`.
fn merge_heads<B: Backend>(t: Tensor<B, 4>) -> Tensor<B, 3> {
    let [b, n, l, hd] = t.dims();
    if l == 1 {
        return t.reshape([b, 1, n * hd]);
    }
    reshape_via_flat(t.swap_dims(1, 2), [b, l, n * hd])
}

/// The score given to a masked position: the most negative finite value, as transformers adds
/// it (a finite value keeps the softmax's gradient free of `∞ - ∞`).
fn masked_score(dtype: burn::tensor::DType) -> f64 {
    match dtype {
        burn::tensor::DType::F64 => f64::MIN,
        _ => f32::MIN as f64,
    }
}

/// `true` where new token `i` (of `l`, after `past` cached ones) must not see key `j`:
/// `j > past + i`, for each of `g` query heads stacked as rows.
///
/// # Shapes
/// - returns `[1, 1, g·l, past + l]`
fn causal_mask<B: Backend>(
    g: usize,
    l: usize,
    past: usize,
    device: &B::Device,
) -> Tensor<B, 4, Bool> {
    let t = past + l;
    let mut values = Vec::with_capacity(g * l * t);
    for _ in 0..g {
        for i in 0..l {
            values.extend((0..t).map(|j| j > past + i));
        }
    }
    Tensor::from_data(TensorData::new(values, [1, 1, g * l, t]), device)
}
