//! A mixture of experts, as the hybrid models put it beside (Granite 4.0-H) or instead of
//! (Nemotron-H) an MLP: a router picks `top_k` of `n_experts` small MLPs for each token, and the
//! token's output is the sum of theirs, each times its routing weight; an optional shared expert
//! (an [`Mlp`]) sees every token.
//!
//! The routing (which experts) is decided on the host from the router's logits, exactly as
//! transformers decides it (it is a discrete choice, with no gradient); the routing weights (how
//! much of each) are tensor operations on the chosen logits, so the router trains. The experts
//! then run grouped: the tokens of each chosen expert gathered into one batch row, one batched
//! product for all experts at once ([`Moe::forward`]). [`Moe::forward_dense`] computes the same
//! sum plainly (every expert on every token, weighted by a dense `[tokens, experts]` matrix that
//! is zero off the choice): the reference the grouped path is tested against.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::activation::sigmoid;
use burn::tensor::{backend::Backend, Distribution, IndexingUpdateOp, Int, Tensor, TensorData};

use crate::error::Mamba2Error;
use crate::init::ParamInit;
use crate::layers::activation::softmax;
use crate::layers::mlp::{Mlp, MlpActivation, MlpConfig};
use crate::precision::cast_to;

/// How a [`Moe`]'s router turns its logits into a choice of experts and their weights.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum RouterKind {
    /// The `top_k` largest logits, their softmax as the weights (Granite 4.0-H).
    Softmax,
    /// Sigmoid scores; the choice by score plus a fixed per-expert correction bias, among the
    /// experts of the `topk_group` groups (of `n_group` equal groups) whose two best such
    /// scores sum highest; the weights the chosen experts' scores, normalised to sum to 1 where
    /// `normalize` is set, times `routed_scaling` (Nemotron-H, after DeepSeek-V3).
    Sigmoid,
}

/// Configuration of a [`Moe`] layer.
#[derive(Config, Debug)]
pub struct MoeConfig {
    /// Width of the input and output.
    pub d_model: usize,
    /// Hidden width of each expert.
    pub d_expert: usize,
    /// Number of experts.
    pub n_experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Gated experts (`down(act(gate(x)) · up(x))`, Granite) or plain (`down(act(up(x)))`,
    /// Nemotron-H). Default: true.
    #[config(default = true)]
    pub gated: bool,
    /// The experts' activation. Default: [`MlpActivation::Silu`].
    #[config(default = "MlpActivation::Silu")]
    pub activation: MlpActivation,
    /// The router. Default: [`RouterKind::Softmax`].
    #[config(default = "RouterKind::Softmax")]
    pub router: RouterKind,
    /// Groups of experts ([`RouterKind::Sigmoid`]). Default: 1.
    #[config(default = 1)]
    pub n_group: usize,
    /// Groups a token's experts come from ([`RouterKind::Sigmoid`]). Default: 1.
    #[config(default = 1)]
    pub topk_group: usize,
    /// Normalise the chosen scores to sum to 1 ([`RouterKind::Sigmoid`]). Default: true.
    #[config(default = true)]
    pub normalize: bool,
    /// Factor of the routing weights ([`RouterKind::Sigmoid`]). Default: 1.
    #[config(default = 1.0)]
    pub routed_scaling: f64,
    /// The shared expert, which every token goes through (Nemotron-H's `shared_experts`;
    /// Granite's `shared_mlp` is the layer's own MLP). Default: none.
    pub shared: Option<MlpConfig>,
}

impl MoeConfig {
    /// Checks the sizes and the router's settings.
    pub fn validate(&self) -> crate::error::Result<()> {
        let err = |field: &'static str, reason: String| Err(Mamba2Error::config(field, reason));
        if self.d_model == 0 || self.d_expert == 0 {
            return err(
                "moe_intermediate_size",
                format!(
                    "the experts' widths must be at least 1, got {} -> {}",
                    self.d_model, self.d_expert
                ),
            );
        }
        if self.top_k == 0 || self.top_k > self.n_experts {
            return err(
                "num_experts_per_tok",
                format!(
                    "must be in 1..={} (the number of experts), got {}",
                    self.n_experts, self.top_k
                ),
            );
        }
        if self.router == RouterKind::Sigmoid {
            let g = self.n_group;
            if g == 0 || !self.n_experts.is_multiple_of(g) || self.n_experts / g < 2 {
                return err(
                    "n_group",
                    format!(
                        "must divide the {} experts into groups of at least 2, got {g}",
                        self.n_experts
                    ),
                );
            }
            if self.topk_group == 0 || self.topk_group > g {
                return err(
                    "topk_group",
                    format!("must be in 1..={g} (n_group), got {}", self.topk_group),
                );
            }
            if self.top_k > self.topk_group * (self.n_experts / g) {
                return err(
                    "num_experts_per_tok",
                    format!(
                        "{} experts cannot come from {} groups of {}",
                        self.top_k,
                        self.topk_group,
                        self.n_experts / g
                    ),
                );
            }
            if !self.routed_scaling.is_finite() {
                return err(
                    "routed_scaling_factor",
                    format!("must be finite, got {}", self.routed_scaling),
                );
            }
        }
        if let Some(shared) = &self.shared {
            shared.validate()?;
            if shared.d_model != self.d_model {
                return err(
                    "moe.shared.d_model",
                    format!("{} differs from {}", shared.d_model, self.d_model),
                );
            }
        }
        Ok(())
    }

    /// The number of parameters [`init`](Self::init) creates (the correction bias of a
    /// sigmoid router among them: the checkpoints hold it, though it does not train).
    pub fn param_count(&self) -> f64 {
        let f = |v: usize| v as f64;
        let (d, e, i) = (f(self.d_model), f(self.n_experts), f(self.d_expert));
        let up = if self.gated { 2.0 } else { 1.0 };
        let bias = if self.router == RouterKind::Sigmoid {
            e
        } else {
            0.0
        };
        let shared = self.shared.as_ref().map_or(0.0, MlpConfig::param_count);
        e * d + bias + e * (up * i * d + d * i) + shared
    }

    /// Builds the layer: router and experts drawn as PyTorch's `nn.Linear` does
    /// (`U(±1/√d_in)`), the correction bias 0.
    pub fn init<B: Backend>(&self, device: &B::Device) -> crate::error::Result<Moe<B>> {
        self.build(&ParamInit::now(device))
    }

    pub(crate) fn build<B: Backend>(&self, init: &ParamInit<B>) -> crate::error::Result<Moe<B>> {
        self.validate()?;
        let (d, e, i) = (self.d_model, self.n_experts, self.d_expert);
        let up = if self.gated { 2 * i } else { i };
        let uniform = |d_in: usize| {
            let bound = 1.0 / (d_in as f64).sqrt();
            Distribution::Uniform(-bound, bound)
        };
        Ok(Moe {
            router: init.linear(d, e, false, 1.0),
            correction_bias: (self.router == RouterKind::Sigmoid).then(|| init.full([e], 0.0)),
            up: init.random([e, up, d], uniform(d), 1.0),
            down: init.random([e, d, i], uniform(i), 1.0),
            shared: self.shared.as_ref().map(|s| s.build(init)).transpose()?,
            top_k: self.top_k,
            gated: self.gated,
            activation: self.activation,
            router_kind: self.router,
            n_group: self.n_group,
            topk_group: self.topk_group,
            normalize: self.normalize,
            routed_scaling: self.routed_scaling,
        })
    }
}

/// A mixture of experts: `y = Σ_{e ∈ top_k(x)} w_e(x) · expert_e(x) + shared(x)`.
///
/// The experts' weights are stacked as PyTorch holds them, `[expert, out, in]`.
#[derive(Module, Debug)]
pub struct Moe<B: Backend> {
    /// `d_model → n_experts` logits.
    pub router: Linear<B>,
    /// The sigmoid router's fixed correction of the scores for the choice, `[n_experts]`; not
    /// trained (no gradient reaches it).
    pub correction_bias: Option<Param<Tensor<B, 1>>>,
    /// `[n_experts, 2 · d_expert, d_model]` (the gate's rows, then the up projection's) when
    /// gated, else `[n_experts, d_expert, d_model]`.
    pub up: Param<Tensor<B, 3>>,
    /// `[n_experts, d_model, d_expert]`.
    pub down: Param<Tensor<B, 3>>,
    /// The shared expert.
    pub shared: Option<Mlp<B>>,
    #[module(skip)]
    top_k: usize,
    #[module(skip)]
    gated: bool,
    #[module(skip)]
    activation: MlpActivation,
    #[module(skip)]
    router_kind: RouterKind,
    #[module(skip)]
    n_group: usize,
    #[module(skip)]
    topk_group: usize,
    #[module(skip)]
    normalize: bool,
    #[module(skip)]
    routed_scaling: f64,
}

/// The experts each token goes to: `experts[t · k + j]` is token `t`'s `j`-th, on the host
/// and as the device's `[tokens, k]` index.
struct Routing<B: Backend> {
    experts: Vec<usize>,
    k: usize,
    index: Tensor<B, 2, Int>,
}

impl<B: Backend> Moe<B> {
    /// Number of experts.
    pub fn n_experts(&self) -> usize {
        self.up.dims()[0]
    }

    /// The experts' outputs summed by their routing weights, grouped by expert, plus the
    /// shared expert's.
    ///
    /// # Shapes
    /// - x: `[tokens, d_model]`; returns `[tokens, d_model]`
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let (weights, routing) = self.route(x.clone());
        let y = self.experts_grouped(x.clone(), weights, &routing);
        self.add_shared(x, y)
    }

    /// The same sum as [`forward`](Self::forward), every expert on every token, weighted by a
    /// dense matrix that is zero off the routing's choice: the plain reference computation.
    ///
    /// # Shapes
    /// - x: `[tokens, d_model]`; returns `[tokens, d_model]`
    pub fn forward_dense(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let (weights, routing) = self.route(x.clone());
        let y = self.experts_dense(x.clone(), weights, &routing);
        self.add_shared(x, y)
    }

    fn add_shared(&self, x: Tensor<B, 2>, y: Tensor<B, 2>) -> Tensor<B, 2> {
        match &self.shared {
            Some(shared) => y + shared.forward(x),
            None => y,
        }
    }

    /// The routing weights `[tokens, top_k]` (differentiable in the router's weights) and the
    /// experts they belong to.
    fn route(&self, x: Tensor<B, 2>) -> (Tensor<B, 2>, Routing<B>) {
        let [t, _] = x.dims();
        let k = self.top_k;
        let logits = self.router.forward(x);
        // what the choice is made on, read back once: the logits, or the sigmoid scores plus
        // the correction bias (no gradient: the choice is discrete)
        let scores = (self.router_kind == RouterKind::Sigmoid).then(|| sigmoid(logits.clone()));
        let choice = match (&scores, &self.correction_bias) {
            (None, _) => logits.clone(),
            (Some(s), None) => s.clone(),
            (Some(s), Some(bias)) => {
                s.clone() + cast_to(bias.val(), s.dtype()).unsqueeze_dim::<2>(0)
            }
        };
        let host: Vec<f32> = choice
            .detach()
            .into_data()
            .convert::<f32>()
            .to_vec()
            .unwrap();
        let experts = match self.router_kind {
            RouterKind::Softmax => top_k_rows(&host, self.n_experts(), k, |_, v| v),
            RouterKind::Sigmoid => self.grouped_choice(&host),
        };
        let device = logits.device();
        let index: Vec<i64> = experts.iter().map(|&e| e as i64).collect();
        let index = Tensor::<B, 2, Int>::from_data(TensorData::new(index, [t, k]), &device);
        let weights = match scores {
            None => softmax(logits.gather(1, index.clone()), 1),
            Some(scores) => {
                let w = scores.gather(1, index.clone());
                let w = if self.normalize {
                    w.clone() / (w.sum_dim(1) + 1e-20)
                } else {
                    w
                };
                w * self.routed_scaling
            }
        };
        (weights, Routing { experts, k, index })
    }

    /// The sigmoid router's choice for each row of `scores` (the sigmoid of the logits plus the
    /// correction bias, `[tokens · n_experts]`, host), as transformers' `NemotronHTopkRouter`
    /// makes it.
    fn grouped_choice(&self, scores: &[f32]) -> Vec<usize> {
        let e = self.n_experts();
        let size = e / self.n_group;
        let mut out = Vec::with_capacity(scores.len() / e * self.top_k);
        for scores in scores.chunks(e) {
            // each group's score: the sum of its two best
            let group_scores: Vec<f32> = scores
                .chunks(size)
                .map(|g| top_k_rows(g, size, 2, |_, v| v).iter().map(|&i| g[i]).sum())
                .collect();
            let groups = top_k_rows(&group_scores, self.n_group, self.topk_group, |_, v| v);
            let mut allowed = vec![false; self.n_group];
            for g in groups {
                allowed[g] = true;
            }
            let masked = |i: usize, v: f32| {
                if allowed[i / size] {
                    v
                } else {
                    f32::NEG_INFINITY
                }
            };
            out.extend(top_k_rows(scores, e, self.top_k, masked));
        }
        out
    }

    /// The activation of the experts' hidden layer (`act(gate) · up` when gated).
    ///
    /// # Shapes
    /// - h: `[experts, tokens, up_width]`; returns `[experts, tokens, d_expert]`
    fn hidden(&self, h: Tensor<B, 3>) -> Tensor<B, 3> {
        if !self.gated {
            return self.activation.forward(h);
        }
        let [e, t, w] = h.dims();
        let i = w / 2;
        let gate = h.clone().slice([0..e, 0..t, 0..i]);
        let up = h.slice([0..e, 0..t, i..w]);
        self.activation.forward(gate) * up
    }

    /// Each active expert on its tokens: the tokens gathered into one row per expert (padded
    /// with a zero token to the busiest expert's count), two batched products, the outputs
    /// weighted and added back to their tokens.
    ///
    /// # Shapes
    /// - x: `[tokens, d_model]`, weights: `[tokens, top_k]`; returns `[tokens, d_model]`
    fn experts_grouped(
        &self,
        x: Tensor<B, 2>,
        weights: Tensor<B, 2>,
        routing: &Routing<B>,
    ) -> Tensor<B, 2> {
        let [t, d] = x.dims();
        let k = routing.k;
        let device = x.device();
        let mut groups = vec![Vec::new(); self.n_experts()];
        for (pair, &e) in routing.experts.iter().enumerate() {
            groups[e].push(pair);
        }
        let active: Vec<usize> = (0..groups.len())
            .filter(|&e| !groups[e].is_empty())
            .collect();
        let n = active.iter().map(|&e| groups[e].len()).max().unwrap_or(0);
        if n == 0 {
            return x.zeros_like();
        }
        let a = active.len();
        // padding rows read token `t` (a zero row) and weight `t · k` (a zero weight)
        let mut tokens = vec![t as i64; a * n];
        let mut pairs = vec![(t * k) as i64; a * n];
        for (row, &e) in active.iter().enumerate() {
            for (j, &pair) in groups[e].iter().enumerate() {
                tokens[row * n + j] = (pair / k) as i64;
                pairs[row * n + j] = pair as i64;
            }
        }
        let ints = |v: Vec<i64>| {
            let n = v.len();
            Tensor::<B, 1, Int>::from_data(TensorData::new(v, [n]), &device)
        };
        let (tokens, pairs) = (ints(tokens), ints(pairs));
        let active = ints(active.iter().map(|&e| e as i64).collect());
        let dtype = x.dtype();
        let zero_row = cast_to(Tensor::<B, 2>::zeros([1, d], &device), dtype);
        let xg = Tensor::cat(vec![x, zero_row.clone()], 0)
            .select(0, tokens.clone())
            .reshape([a, n, d]);
        let w_dtype = weights.dtype();
        let wg = Tensor::cat(
            vec![
                weights.reshape([t * k]),
                cast_to(Tensor::zeros([1], &device), w_dtype),
            ],
            0,
        )
        .select(0, pairs)
        .reshape([a * n, 1]);
        let up = cast_to(self.up.val().select(0, active.clone()), dtype);
        let h = self.hidden(xg.matmul(up.swap_dims(1, 2)));
        let down = cast_to(self.down.val().select(0, active), dtype);
        let out = h.matmul(down.swap_dims(1, 2)).reshape([a * n, d]) * cast_to(wg, dtype);
        cast_to(Tensor::<B, 2>::zeros([t + 1, d], &device), dtype)
            .select_assign(0, tokens, out, IndexingUpdateOp::Add)
            .slice([0..t, 0..d])
    }

    /// Every expert on every token, weighted by the dense `[tokens, experts]` matrix of the
    /// routing weights.
    ///
    /// # Shapes
    /// - x: `[tokens, d_model]`, weights: `[tokens, top_k]`; returns `[tokens, d_model]`
    fn experts_dense(
        &self,
        x: Tensor<B, 2>,
        weights: Tensor<B, 2>,
        routing: &Routing<B>,
    ) -> Tensor<B, 2> {
        let [t, d] = x.dims();
        let e = self.n_experts();
        let device = x.device();
        let dense = cast_to(Tensor::<B, 2>::zeros([t, e], &device), weights.dtype()).scatter(
            1,
            routing.index.clone(),
            weights,
            IndexingUpdateOp::Add,
        );
        let dtype = x.dtype();
        let xs = x.unsqueeze::<3>().expand([e, t, d]);
        let h = self.hidden(xs.matmul(cast_to(self.up.val(), dtype).swap_dims(1, 2)));
        let out = h.matmul(cast_to(self.down.val(), dtype).swap_dims(1, 2));
        let w = cast_to(dense, dtype).transpose().reshape([e, t, 1]);
        (out * w).sum_dim(0).reshape([t, d])
    }
}

/// For each row of `values` (`[rows · width]`), the columns of its `k` largest entries after
/// `key(column, value)`, largest first, the lower column first among equals.
fn top_k_rows(
    values: &[f32],
    width: usize,
    k: usize,
    key: impl Fn(usize, f32) -> f32,
) -> Vec<usize> {
    let mut out = Vec::with_capacity(values.len() / width.max(1) * k);
    let mut order: Vec<usize> = Vec::with_capacity(width);
    for row in values.chunks(width) {
        order.clear();
        order.extend(0..width);
        let keyed: Vec<f32> = row.iter().enumerate().map(|(i, &v)| key(i, v)).collect();
        // NaN last, so that a NaN logit never takes a place a number could
        order.sort_by(|&a, &b| {
            let (x, y) = (keyed[a], keyed[b]);
            y.partial_cmp(&x)
                .unwrap_or_else(|| x.is_nan().cmp(&y.is_nan()))
                .then(a.cmp(&b))
        });
        out.extend_from_slice(&order[..k]);
    }
    out
}
