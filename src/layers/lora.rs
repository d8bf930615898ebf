//! Low-rank adapters (LoRA, Hu et al. 2021) on linear layers, as PEFT defines them: the layer's
//! weight `W` stays frozen and the output gains `dropout(x) · A · B · (alpha / rank)`, with `A`
//! drawn as PEFT draws its `lora_A` and `B` zero, so a fresh adapter changes nothing; merging
//! folds `A · B · (alpha / rank)` into `W`. [`Lora`] is the update alone, which the models'
//! layers hold beside each projection they adapt; [`LoraLinear`] is one adapted layer.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::{Dropout, DropoutConfig, Linear};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};

use crate::error::Mamba2Error;

/// The projections a [`LoraConfig`] can adapt, by the name of their field in the crate's
/// layers: the mixer's `in_proj` and `out_proj`; attention's `q_proj`, `k_proj`, `v_proj` and
/// `o_proj`; the MLPs' `gate`, `up` and `down`.
pub const LORA_TARGETS: [&str; 9] = [
    "in_proj", "out_proj", "q_proj", "k_proj", "v_proj", "o_proj", "gate", "up", "down",
];

/// The projections adapted unless a [`LoraConfig`] names others: the mixer's `in_proj`,
/// attention's four, the MLPs' three. Not the mixer's `out_proj`, which PEFT (0.22) refuses to
/// adapt in transformers' Mamba models (`mamba2`, `falcon_h1`, `nemotron_h`): their CUDA
/// kernels read its weight directly, past any adapter. Name it to adapt it; the merged model
/// carries it everywhere, PEFT's adapter files only where PEFT takes them.
pub const DEFAULT_LORA_TARGETS: [&str; 8] = [
    "in_proj", "q_proj", "k_proj", "v_proj", "o_proj", "gate", "up", "down",
];

/// Configuration of low-rank adapters: PEFT's `r`, `lora_alpha`, `lora_dropout` and
/// `target_modules`.
#[derive(Config, Debug)]
pub struct LoraConfig {
    /// Rank of the update `A · B`.
    pub rank: usize,
    /// The update's scale is `alpha / rank`. Default: 16.
    #[config(default = 16.0)]
    pub alpha: f64,
    /// Dropout on the adapter's input. Default: 0.
    #[config(default = 0.0)]
    pub dropout: f64,
    /// The projections adapted where a model has them (names of [`LORA_TARGETS`]). Default:
    /// [`DEFAULT_LORA_TARGETS`], every one but the mixer's `out_proj`.
    #[config(default = "DEFAULT_LORA_TARGETS.iter().map(|t| t.to_string()).collect()")]
    pub targets: Vec<String>,
}

/// A low-rank update of one linear layer `d_input → d_output`: `dropout(x) · A · B · scaling`.
#[derive(Module, Debug)]
pub struct Lora<B: Backend> {
    /// `A`: `[d_input, rank]` (PEFT's `lora_A.weight` transposed).
    pub a: Param<Tensor<B, 2>>,
    /// `B`: `[rank, d_output]` (PEFT's `lora_B.weight` transposed), zero at init.
    pub b: Param<Tensor<B, 2>>,
    /// Dropout on the adapter's input.
    pub dropout: Dropout,
    /// `alpha / rank`.
    pub scaling: f64,
}

/// A linear layer with a low-rank adapter: its weight frozen, the adapter trainable.
#[derive(Module, Debug)]
pub struct LoraLinear<B: Backend> {
    /// The adapted layer, its parameters frozen (no gradient).
    pub base: Linear<B>,
    /// The update added to its output.
    pub lora: Lora<B>,
}

impl LoraConfig {
    /// Checks the config: a rank of at least 1, a finite alpha, a dropout in `[0, 1)`, known
    /// targets.
    pub fn validate(&self) -> crate::error::Result<()> {
        if self.rank == 0 {
            return Err(Mamba2Error::config("rank", "must be at least 1"));
        }
        if !self.alpha.is_finite() {
            return Err(Mamba2Error::config(
                "alpha",
                format!("{} is not finite", self.alpha),
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(Mamba2Error::config(
                "dropout",
                format!("{} is not in [0, 1)", self.dropout),
            ));
        }
        if let Some(t) = self
            .targets
            .iter()
            .find(|t| !LORA_TARGETS.contains(&t.as_str()))
        {
            return Err(Mamba2Error::config(
                "targets",
                format!("{t:?} is none of {}", LORA_TARGETS.join(", ")),
            ));
        }
        if self.targets.is_empty() {
            return Err(Mamba2Error::config("targets", "names no projection"));
        }
        Ok(())
    }

    /// Whether the projection named `target` (one of [`LORA_TARGETS`]) is adapted.
    pub fn targets(&self, target: &str) -> bool {
        self.targets.iter().any(|t| t == target)
    }

    /// An update for a layer `d_input → d_output` on `device`: `A` drawn, `B` zero.
    ///
    /// # Shapes
    /// - `a`: `[d_input, rank]`, `b`: `[rank, d_output]`
    pub fn init_lora<B: Backend>(
        &self,
        d_input: usize,
        d_output: usize,
        device: &B::Device,
    ) -> crate::error::Result<Lora<B>> {
        self.validate()?;
        // PEFT's `lora_A`: `nn.Linear`'s default init, kaiming_uniform(a = √5), which is
        // U(-1/√fan_in, 1/√fan_in) with fan_in = d_input
        // Drawn now, not lazily as an `Initializer` would: a clone of a lazy parameter draws
        // its own values, so a model cloned before its first forward (to export it, to fork
        // it to a device) would hold other adapters than the original.
        let bound = 1.0 / (d_input as f64).sqrt();
        let a = Tensor::random(
            [d_input, self.rank],
            Distribution::Uniform(-bound, bound),
            device,
        );
        Ok(Lora {
            a: Param::from_tensor(a),
            b: Param::from_tensor(Tensor::zeros([self.rank, d_output], device)),
            dropout: DropoutConfig::new(self.dropout).init(),
            scaling: self.alpha / self.rank as f64,
        })
    }

    /// An update for `linear`, where `target` is adapted (`None` otherwise).
    pub fn init_for<B: Backend>(
        &self,
        target: &str,
        linear: &Linear<B>,
    ) -> crate::error::Result<Option<Lora<B>>> {
        if !self.targets(target) {
            return Ok(None);
        }
        let [d_input, d_output] = linear.weight.shape().dims();
        self.init_lora(d_input, d_output, &linear.weight.device())
            .map(Some)
    }

    /// An adapter on `base`, whose parameters it freezes; `A` drawn on `base`'s device.
    ///
    /// # Shapes
    /// - `base.weight`: `[d_input, d_output]`
    pub fn init<B: Backend>(&self, base: Linear<B>) -> crate::error::Result<LoraLinear<B>> {
        let [d_input, d_output] = base.weight.shape().dims();
        let lora = self.init_lora(d_input, d_output, &base.weight.device())?;
        Ok(LoraLinear {
            base: base.no_grad(),
            lora,
        })
    }
}

impl<B: Backend> Lora<B> {
    /// `A · B · scaling`, the update of the weight.
    ///
    /// # Shapes
    /// - returns `[d_input, d_output]`
    pub fn update(&self) -> Tensor<B, 2> {
        self.a.val().matmul(self.b.val()).mul_scalar(self.scaling)
    }

    /// `dropout(x) · A · B · scaling`, as two thin products (never the full update).
    ///
    /// # Shapes
    /// - input: `[..., d_input]`
    /// - output: `[..., d_output]`
    pub fn forward<const D: usize>(&self, input: Tensor<B, D>) -> Tensor<B, D> {
        let [_, d_output] = self.b.shape().dims();
        self.forward_columns(input, 0, d_output)
    }

    /// Columns `start..start + len` of [`forward`](Self::forward)'s output, for a layer whose
    /// output is used in pieces.
    ///
    /// # Shapes
    /// - input: `[..., d_input]`
    /// - output: `[..., len]`
    pub fn forward_columns<const D: usize>(
        &self,
        input: Tensor<B, D>,
        start: usize,
        len: usize,
    ) -> Tensor<B, D> {
        let [d_input, rank] = self.a.shape().dims();
        let x = self.dropout.forward(input);
        let mut shape = x.dims();
        let rows = shape[..D - 1].iter().product();
        shape[D - 1] = len;
        let b = self.b.val().narrow(1, start, len);
        x.reshape([rows, d_input])
            .matmul(self.a.val())
            .mul_scalar(self.scaling)
            .reshape([rows, rank])
            .matmul(b)
            .reshape(shape)
    }

    /// `linear` with the update folded into its weight, `W + A · B · scaling`, as new leaves
    /// (trainable).
    pub fn merge_into(&self, linear: Linear<B>) -> Linear<B> {
        // new leaves: under autodiff the sum is a node of the graph that made it
        let weight = (linear.weight.val() + self.update()).detach();
        Linear {
            weight: Param::from_tensor(weight),
            bias: linear.bias.map(|b| Param::from_tensor(b.val().detach())),
        }
    }
}

/// `y + lora(x)` where there is an update, `y` otherwise: the output `y` of a layer on `x`
/// with its update added.
///
/// # Shapes
/// - y: `[..., d_output]`, x: `[..., d_input]`; returns `[..., d_output]`
pub(crate) fn plus_update<B: Backend, const D: usize>(
    y: Tensor<B, D>,
    lora: &Option<Lora<B>>,
    x: Tensor<B, D>,
) -> Tensor<B, D> {
    match lora {
        Some(lora) => y + lora.forward(x),
        None => y,
    }
}

/// `linear(x)`, with `lora`'s update added where there is one.
///
/// # Shapes
/// - x: `[..., d_input]`; returns `[..., d_output]`
pub(crate) fn adapted<B: Backend, const D: usize>(
    linear: &Linear<B>,
    lora: &Option<Lora<B>>,
    x: Tensor<B, D>,
) -> Tensor<B, D> {
    match lora {
        Some(lora) => linear.forward(x.clone()) + lora.forward(x),
        None => linear.forward(x),
    }
}

/// `linear` with `lora`'s update folded in where there is one (which it takes).
pub(crate) fn merge<B: Backend>(linear: Linear<B>, lora: &mut Option<Lora<B>>) -> Linear<B> {
    match lora.take() {
        Some(lora) => lora.merge_into(linear),
        None => linear,
    }
}

/// `linear` with `lora`'s update folded in where there is one; `linear` itself otherwise.
pub(crate) fn merged<B: Backend>(linear: &Linear<B>, lora: &Option<Lora<B>>) -> Linear<B> {
    match lora {
        Some(lora) => lora.merge_into(linear.clone()),
        None => linear.clone(),
    }
}

impl<B: Backend> LoraLinear<B> {
    /// `base(x) + dropout(x) · A · B · scaling`.
    ///
    /// # Shapes
    /// - input: `[..., d_input]`
    /// - output: `[..., d_output]`
    pub fn forward<const D: usize>(&self, input: Tensor<B, D>) -> Tensor<B, D> {
        self.base.forward(input.clone()) + self.lora.forward(input)
    }

    /// The layer with the update folded into its weight: `W + A · B · scaling` (trainable again).
    pub fn merge(self) -> Linear<B> {
        self.lora.merge_into(self.base)
    }
}

#[cfg(all(test, feature = "ndarray"))]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, NdArray};
    use burn::nn::LinearConfig;
    use burn::tensor::{Distribution, Tolerance};

    type B = Autodiff<NdArray<f32>>;

    fn adapter() -> LoraLinear<B> {
        let device = Default::default();
        let base = LinearConfig::new(12, 20).init::<B>(&device);
        LoraConfig::new(4).with_alpha(8.0).init(base).unwrap()
    }

    #[test]
    fn a_fresh_adapter_changes_nothing_and_merging_keeps_the_output() {
        let device = Default::default();
        let mut lora = adapter();
        let x = Tensor::<B, 3>::random([2, 5, 12], Distribution::Default, &device);
        let base = lora.base.forward(x.clone());
        lora.forward(x.clone())
            .into_data()
            .assert_eq(&base.clone().into_data(), true);
        // a trained adapter (B no longer zero): merged, the same outputs
        lora.lora.b = Param::from_tensor(Tensor::random([4, 20], Distribution::Default, &device));
        let adapted = lora.forward(x.clone());
        assert!((adapted.clone() - base).abs().max().into_scalar() > 0.1);
        let merged = lora.merge().forward(x);
        merged
            .into_data()
            .assert_approx_eq::<f32>(&adapted.into_data(), Tolerance::absolute(1e-5));
    }

    /// A clone made before any forward holds the same adapter (a lazily drawn parameter
    /// would draw again in the clone).
    #[test]
    fn a_clone_holds_the_same_adapter() {
        let lora = adapter();
        let copy = lora.clone();
        assert_eq!(copy.lora.a.val().into_data(), lora.lora.a.val().into_data());
    }

    #[test]
    fn only_the_adapter_trains() {
        let device = Default::default();
        let lora = adapter();
        let x = Tensor::<B, 2>::random([3, 12], Distribution::Default, &device);
        let grads = lora.forward(x).sum().backward();
        assert!(lora.base.weight.grad(&grads).is_none());
        assert!(lora.base.bias.as_ref().unwrap().grad(&grads).is_none());
        // B's gradient is Aᵀ · xᵀ · 1 · scaling (A's is zero while B is)
        assert!(lora.lora.b.grad(&grads).is_some());
        assert!(lora.lora.a.grad(&grads).is_some());
    }

    #[test]
    fn bad_configs_are_named() {
        let device = Default::default();
        let base = || LinearConfig::new(4, 4).init::<B>(&device);
        for (config, field) in [
            (LoraConfig::new(0), "rank"),
            (LoraConfig::new(2).with_dropout(1.0), "dropout"),
            (LoraConfig::new(2).with_alpha(f64::NAN), "alpha"),
            (
                LoraConfig::new(2).with_targets(vec!["x_proj".into()]),
                "targets",
            ),
            (LoraConfig::new(2).with_targets(vec![]), "targets"),
        ] {
            let e = config.init(base()).unwrap_err();
            assert!(
                matches!(&e, Mamba2Error::InvalidConfig { field: f, .. } if *f == field),
                "{e}"
            );
        }
    }
}
