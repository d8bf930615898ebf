//! Low-rank adapters (LoRA, Hu et al. 2021) on a linear layer, as PEFT defines them: the layer's
//! weight `W` stays frozen and the output gains `dropout(x) · A · B · (alpha / rank)`, with `A`
//! drawn as PEFT draws its `lora_A` and `B` zero, so a fresh adapter changes nothing; merging
//! folds `A · B · (alpha / rank)` into `W`.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::{Dropout, DropoutConfig, Initializer, Linear};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use crate::error::Mamba2Error;

/// Configuration of [`LoraLinear`]: PEFT's `r`, `lora_alpha` and `lora_dropout`.
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
}

/// A linear layer with a low-rank adapter: its weight frozen, the adapter trainable.
#[derive(Module, Debug)]
pub struct LoraLinear<B: Backend> {
    /// The adapted layer, its parameters frozen (no gradient).
    pub base: Linear<B>,
    /// `A`: `[d_input, rank]` (PEFT's `lora_A.weight` transposed).
    pub lora_a: Param<Tensor<B, 2>>,
    /// `B`: `[rank, d_output]` (PEFT's `lora_B.weight` transposed), zero at init.
    pub lora_b: Param<Tensor<B, 2>>,
    /// Dropout on the adapter's input.
    pub dropout: Dropout,
    /// `alpha / rank`.
    pub scaling: f64,
}

impl LoraConfig {
    /// Checks the config: a rank of at least 1, a finite alpha, a dropout in `[0, 1)`.
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
        Ok(())
    }

    /// An adapter on `base`, whose parameters it freezes; `A` drawn on `base`'s device.
    ///
    /// # Shapes
    /// - `base.weight`: `[d_input, d_output]`
    /// - `lora_a`: `[d_input, rank]`, `lora_b`: `[rank, d_output]`
    pub fn init<B: Backend>(&self, base: Linear<B>) -> crate::error::Result<LoraLinear<B>> {
        self.validate()?;
        let [d_input, d_output] = base.weight.shape().dims();
        let device = base.weight.val().device();
        // PEFT's `lora_A`: `nn.Linear`'s default init, kaiming_uniform(a = √5), which is
        // U(-1/√fan_in, 1/√fan_in) with fan_in = d_input
        let bound = 1.0 / (d_input as f64).sqrt();
        let lora_a = Initializer::Uniform {
            min: -bound,
            max: bound,
        }
        .init([d_input, self.rank], &device);
        let lora_b = Initializer::Zeros.init([self.rank, d_output], &device);
        Ok(LoraLinear {
            base: base.no_grad(),
            lora_a,
            lora_b,
            dropout: DropoutConfig::new(self.dropout).init(),
            scaling: self.alpha / self.rank as f64,
        })
    }
}

impl<B: Backend> LoraLinear<B> {
    /// `base(x) + dropout(x) · A · B · scaling`.
    ///
    /// # Shapes
    /// - input: `[..., d_input]`
    /// - output: `[..., d_output]`
    pub fn forward<const D: usize>(&self, input: Tensor<B, D>) -> Tensor<B, D> {
        let update = self
            .lora_a
            .val()
            .matmul(self.lora_b.val())
            .mul_scalar(self.scaling);
        let adapted = self.dropout.forward(input.clone());
        let [d_input, d_output] = update.dims();
        let mut shape = adapted.dims();
        let rows = shape[..D - 1].iter().product();
        shape[D - 1] = d_output;
        let delta = adapted
            .reshape([rows, d_input])
            .matmul(update)
            .reshape(shape);
        self.base.forward(input) + delta
    }

    /// The layer with the update folded into its weight: `W + A · B · scaling` (trainable again).
    pub fn merge(self) -> Linear<B> {
        let update = self
            .lora_a
            .val()
            .matmul(self.lora_b.val())
            .mul_scalar(self.scaling);
        // a new leaf: under autodiff the sum is a node of the graph that made it
        let weight = (self.base.weight.val() + update).detach();
        Linear {
            weight: Param::from_tensor(weight),
            bias: self.base.bias.map(|b| Param::from_tensor(b.val().detach())),
        }
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
        lora.lora_b = Param::from_tensor(Tensor::random([4, 20], Distribution::Default, &device));
        let adapted = lora.forward(x.clone());
        assert!((adapted.clone() - base).abs().max().into_scalar() > 0.1);
        let merged = lora.merge().forward(x);
        merged
            .into_data()
            .assert_approx_eq::<f32>(&adapted.into_data(), Tolerance::absolute(1e-5));
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
        assert!(lora.lora_b.grad(&grads).is_some());
        assert!(lora.lora_a.grad(&grads).is_some());
    }

    #[test]
    fn bad_configs_are_named() {
        let device = Default::default();
        let base = || LinearConfig::new(4, 4).init::<B>(&device);
        for (config, field) in [
            (LoraConfig::new(0), "rank"),
            (LoraConfig::new(2).with_dropout(1.0), "dropout"),
            (LoraConfig::new(2).with_alpha(f64::NAN), "alpha"),
        ] {
            let e = config.init(base()).unwrap_err();
            assert!(
                matches!(&e, Mamba2Error::InvalidConfig { field: f, .. } if *f == field),
                "{e}"
            );
        }
    }
}
