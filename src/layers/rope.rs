//! Rotary position embedding (RoPE) in the rotate-half form of Llama and the Hugging Face
//! hybrids, over the first `rotary_dim` channels of each head (all of them, or a part).

use burn::config::Config;
use burn::module::Module;
use burn::tensor::{backend::Backend, Tensor, TensorData};

use crate::error::Mamba2Error;
use crate::precision::cast_to;

/// Configuration of a [`RotaryEmbedding`].
#[derive(Config, Debug)]
pub struct RotaryEmbeddingConfig {
    /// Channels of a head.
    pub head_dim: usize,
    /// Channels rotated, the first of each head (an even number, at most `head_dim`); the rest
    /// pass through. Default: `head_dim`.
    pub rotary_dim: Option<usize>,
    /// Base of the frequencies (`rope_theta`). Default: 10000.
    #[config(default = 10000.0)]
    pub theta: f64,
}

impl RotaryEmbeddingConfig {
    /// Checks the sizes and builds the embedding (it has no parameters).
    pub fn init(&self) -> crate::error::Result<RotaryEmbedding> {
        let rotary_dim = self.rotary_dim.unwrap_or(self.head_dim);
        if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) || rotary_dim > self.head_dim {
            return Err(Mamba2Error::config(
                "rotary_dim",
                format!(
                    "must be even, at least 2 and at most head_dim = {}, got {rotary_dim}",
                    self.head_dim
                ),
            ));
        }
        if !(self.theta > 1.0 && self.theta.is_finite()) {
            return Err(Mamba2Error::config(
                "rope_theta",
                format!("must be a finite number above 1, got {}", self.theta),
            ));
        }
        Ok(RotaryEmbedding {
            head_dim: self.head_dim,
            rotary_dim,
            theta: self.theta,
        })
    }
}

/// Rotates pairs of channels `(i, i + r/2)` of the first `r = rotary_dim` channels of each head
/// by the angle `position · θ^(-2i/r)`.
///
/// The angles are computed in `f32` on the host exactly as transformers does (`inv_freq` in
/// `f32`, then `position · inv_freq` in `f32`), whatever the model's float type: checkpoints
/// trained with huge bases (`θ = 10¹¹`) depend on those roundings.
#[derive(Module, Clone, Debug)]
pub struct RotaryEmbedding {
    head_dim: usize,
    rotary_dim: usize,
    theta: f64,
}

impl RotaryEmbedding {
    /// Channels rotated in each head.
    pub fn rotary_dim(&self) -> usize {
        self.rotary_dim
    }

    /// `cos` and `sin` of the angles of positions `start..start + len`, in `dtype` on `device`,
    /// for [`apply`](Self::apply) to every head of q and k alike.
    ///
    /// # Shapes
    /// - returns two `[1, 1, len, rotary_dim]` (the `rotary_dim / 2` frequencies twice, as
    ///   rotate-half pairs them)
    pub fn tables<B: Backend>(
        &self,
        start: usize,
        len: usize,
        dtype: burn::tensor::DType,
        device: &B::Device,
    ) -> RopeTables<B> {
        let positions: Vec<usize> = (start..start + len).collect();
        self.tables_at(&positions, 1, dtype, device)
    }

    /// The tables of `rows` rows of positions each (`positions` row after row: packed
    /// documents, each row's positions restarting at every document).
    ///
    /// # Shapes
    /// - positions: `rows · len`; returns two `[rows, 1, len, rotary_dim]`
    pub fn tables_at<B: Backend>(
        &self,
        positions: &[usize],
        rows: usize,
        dtype: burn::tensor::DType,
        device: &B::Device,
    ) -> RopeTables<B> {
        let r = self.rotary_dim;
        let len = positions.len() / rows.max(1);
        debug_assert_eq!(len * rows, positions.len());
        let inv_freq: Vec<f32> = (0..r / 2)
            .map(|i| 1.0 / (self.theta as f32).powf((2 * i) as f32 / r as f32))
            .collect();
        let n = positions.len();
        let (mut cos, mut sin) = (Vec::with_capacity(n * r), Vec::with_capacity(n * r));
        for &p in positions {
            for _ in 0..2 {
                for f in &inv_freq {
                    let angle = p as f32 * f;
                    cos.push(angle.cos());
                    sin.push(angle.sin());
                }
            }
        }
        let table = |v: Vec<f32>| {
            cast_to(
                Tensor::<B, 2>::from_data(TensorData::new(v, [n, r]), device),
                dtype,
            )
            .reshape([rows, 1, len, r])
        };
        RopeTables {
            cos: table(cos),
            sin: table(sin),
        }
    }

    /// Rotates `x` by the angles of `tables`.
    ///
    /// # Shapes
    /// - x: `[b, heads, l, head_dim]` with `l` the tables' length (and `b` their rows, or one
    ///   row for all); returns the same
    pub fn apply<B: Backend>(&self, x: Tensor<B, 4>, tables: &RopeTables<B>) -> Tensor<B, 4> {
        let [_, _, _, d] = x.dims();
        debug_assert_eq!(d, self.head_dim);
        let (r, half) = (self.rotary_dim, self.rotary_dim / 2);
        let rotated = x.clone().narrow(3, 0, r);
        // rotate_half: [x1, x2] -> [-x2, x1]
        let x1 = rotated.clone().narrow(3, 0, half);
        let x2 = rotated.clone().narrow(3, half, half);
        let turned = Tensor::cat(vec![x2.neg(), x1], 3);
        let out = rotated * tables.cos.clone() + turned * tables.sin.clone();
        if r == d {
            return out;
        }
        Tensor::cat(vec![out, x.narrow(3, r, d - r)], 3)
    }

    /// Applies the rotation for positions `start..start + l`.
    ///
    /// # Shapes
    /// - x: `[b, heads, l, head_dim]`; returns the same
    pub fn forward<B: Backend>(&self, x: Tensor<B, 4>, start: usize) -> Tensor<B, 4> {
        let tables = self.tables(start, x.dims()[2], x.dtype(), &x.device());
        self.apply(x, &tables)
    }
}

/// The `cos` and `sin` of a [`RotaryEmbedding`]'s angles at a run of positions.
#[derive(Clone, Debug)]
pub struct RopeTables<B: Backend> {
    cos: Tensor<B, 4>,
    sin: Tensor<B, 4>,
}
