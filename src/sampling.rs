//! Choosing the next token from logits: greedy, or sampling with temperature, top-k and top-p
//! (nucleus), from a seeded generator.

use burn::tensor::{backend::Backend, Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::Mamba2Error;

/// How the next token is chosen.
// one sampler per generation: boxing its generator would only add an allocation
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Sampler {
    /// The most likely token.
    Greedy,
    /// A draw from `softmax(logits / temperature)`, restricted to the `top_k` most likely
    /// tokens and then to the smallest set whose probability reaches `top_p`.
    Sample {
        /// Divides the logits (> 0).
        temperature: f64,
        /// Keep only this many of the most likely tokens.
        top_k: Option<usize>,
        /// Keep the most likely tokens up to this cumulative probability, in (0, 1].
        top_p: Option<f64>,
        /// The random generator.
        rng: StdRng,
    },
}

impl Sampler {
    /// Greedy when `temperature` is 0, sampling otherwise.
    pub fn new(
        temperature: f64,
        top_k: Option<usize>,
        top_p: Option<f64>,
        seed: u64,
    ) -> crate::error::Result<Self> {
        let invalid = |field, reason: String| Err(Mamba2Error::config(field, reason));
        if !(temperature >= 0.0) || !temperature.is_finite() {
            return invalid("temperature", format!("must be >= 0, got {temperature}"));
        }
        if top_k == Some(0) {
            return invalid("top_k", "must be at least 1".into());
        }
        if let Some(p) = top_p {
            if !(p > 0.0 && p <= 1.0) {
                return invalid("top_p", format!("must be in (0, 1], got {p}"));
            }
        }
        Ok(if temperature == 0.0 {
            Sampler::Greedy
        } else {
            Sampler::Sample {
                temperature,
                top_k,
                top_p,
                rng: StdRng::seed_from_u64(seed),
            }
        })
    }

    /// One token per row of `logits`.
    ///
    /// # Shapes
    /// - logits: `[b, vocab]`; returns `[b]`
    pub fn sample<B: Backend>(&mut self, logits: Tensor<B, 2>) -> Tensor<B, 1, Int> {
        let [b, v] = logits.dims();
        if let Sampler::Greedy = self {
            return logits.argmax(1).reshape([b]);
        }
        let device = logits.device();
        let values: Vec<f64> = logits
            .into_data()
            .convert::<f64>()
            .to_vec()
            .expect("float logits");
        let tokens: Vec<i64> = values
            .chunks(v)
            .map(|row| self.choose(row) as i64)
            .collect();
        Tensor::from_data(TensorData::new(tokens, [b]), &device)
    }

    /// The token chosen from one row of host logits: the first of the largest for
    /// [`Greedy`](Sampler::Greedy) (NaN is never chosen unless every logit is NaN), a draw as
    /// in [`sample`](Self::sample) otherwise.
    ///
    /// # Shapes
    /// - logits: `[vocab]`
    pub fn pick(&mut self, logits: &[f32]) -> usize {
        match self {
            Sampler::Greedy => first_largest(logits),
            Sampler::Sample { .. } => {
                let row: Vec<f64> = logits.iter().map(|&v| v as f64).collect();
                self.choose(&row)
            }
        }
    }

    /// [`pick`](Self::pick) on a row of `f64` logits.
    fn choose(&mut self, row: &[f64]) -> usize {
        match self {
            Sampler::Greedy => first_largest(row),
            Sampler::Sample {
                temperature,
                top_k,
                top_p,
                rng,
            } => draw(row, *temperature, *top_k, *top_p, rng),
        }
    }
}

/// The index of the first of the largest values; NaN only when every value is NaN.
fn first_largest<T: PartialOrd + Copy>(row: &[T]) -> usize {
    let nan = |v: T| v.partial_cmp(&v).is_none();
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] || nan(row[best]) && !nan(v) {
            best = i;
        }
    }
    best
}

/// Draws an index from one row of logits.
fn draw(
    row: &[f64],
    temperature: f64,
    top_k: Option<usize>,
    top_p: Option<f64>,
    rng: &mut StdRng,
) -> usize {
    let mut order: Vec<usize> = (0..row.len()).collect();
    order.sort_by(|&a, &b| {
        row[b]
            .partial_cmp(&row[a])
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    if let Some(k) = top_k {
        order.truncate(k.min(row.len()));
    }
    let max = row[order[0]];
    let mut probs: Vec<f64> = order
        .iter()
        .map(|&i| ((row[i] - max) / temperature).exp())
        .collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    if let Some(p) = top_p {
        let mut cumulative = 0.0;
        let keep = probs
            .iter()
            .position(|q| {
                cumulative += q;
                cumulative >= p
            })
            .map_or(probs.len(), |i| i + 1);
        probs.truncate(keep);
        order.truncate(keep);
    }
    let total: f64 = probs.iter().sum();
    let mut u = rng.random::<f64>() * total;
    for (p, &i) in probs.iter().zip(&order) {
        if u < *p {
            return i;
        }
        u -= p;
    }
    order[probs.len() - 1]
}
