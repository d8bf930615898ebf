//! The feed-forward layers of the hybrid models: the gated MLP (SwiGLU and its kin) and the
//! plain one (relu², as Nemotron-H has it).

use burn::config::Config;
use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::{activation::relu, backend::Backend, Tensor};

use crate::error::Mamba2Error;
use crate::init::ParamInit;
use crate::layers::activation::silu;
use crate::layers::lora::{adapted, merge, Lora, LoraConfig};

/// The activation of an [`Mlp`].
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum MlpActivation {
    /// `x · sigmoid(x)` (transformers' `silu`, `swish`).
    Silu,
    /// `relu(x)²` (transformers' `relu2`).
    Relu2,
}

impl MlpActivation {
    /// The activation transformers names `name` (`hidden_act`, `mlp_hidden_act`).
    pub fn from_hf(name: &str) -> Option<Self> {
        match name {
            "silu" | "swish" => Some(Self::Silu),
            "relu2" => Some(Self::Relu2),
            _ => None,
        }
    }

    /// # Shapes
    /// - any; returns the same shape
    pub fn forward<B: Backend, const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        match self {
            Self::Silu => silu(x),
            Self::Relu2 => relu(x).square(),
        }
    }
}

/// Configuration of an [`Mlp`].
#[derive(Config, Debug)]
pub struct MlpConfig {
    /// Width of the input and output.
    pub d_model: usize,
    /// Width of the hidden layer.
    pub d_hidden: usize,
    /// Gated (`down(act(gate(x)) · up(x))`, SwiGLU with `Silu`) or plain (`down(act(up(x)))`).
    /// Default: true.
    #[config(default = true)]
    pub gated: bool,
    /// The activation. Default: [`MlpActivation::Silu`].
    #[config(default = "MlpActivation::Silu")]
    pub activation: MlpActivation,
    /// Biases on the projections. Default: false.
    #[config(default = false)]
    pub bias: bool,
    /// Fixed factors `(gate, down)`: of the gate's product before the activation, and of the
    /// output (Falcon-H1's μP `mlp_multipliers`). Default: `(1, 1)`.
    #[config(default = "(1.0, 1.0)")]
    pub multipliers: (f64, f64),
}

impl MlpConfig {
    /// Checks the sizes.
    pub fn validate(&self) -> crate::error::Result<()> {
        if self.d_model == 0 || self.d_hidden == 0 {
            return Err(Mamba2Error::config(
                "intermediate_size",
                format!(
                    "the MLP's widths must be at least 1, got {} -> {}",
                    self.d_model, self.d_hidden
                ),
            ));
        }
        Ok(())
    }

    /// The number of parameters [`init`](Self::init) creates.
    pub fn param_count(&self) -> f64 {
        let (d, i) = (self.d_model as f64, self.d_hidden as f64);
        let up = if self.gated { 2.0 } else { 1.0 };
        let bias = if self.bias { up * i + d } else { 0.0 };
        up * d * i + i * d + bias
    }

    /// Builds the layer, its weights drawn as PyTorch's `nn.Linear` does (`U(±1/√d_in)`).
    pub fn init<B: Backend>(&self, device: &B::Device) -> crate::error::Result<Mlp<B>> {
        self.build(&ParamInit::now(device))
    }

    pub(crate) fn build<B: Backend>(&self, init: &ParamInit<B>) -> crate::error::Result<Mlp<B>> {
        self.validate()?;
        let (d, i) = (self.d_model, self.d_hidden);
        Ok(Mlp {
            gate: self.gated.then(|| init.linear(d, i, self.bias, 1.0)),
            up: init.linear(d, i, self.bias, 1.0),
            down: init.linear(i, d, self.bias, 1.0),
            gate_lora: None,
            up_lora: None,
            down_lora: None,
            activation: self.activation,
            multipliers: self.multipliers,
        })
    }
}

/// A feed-forward layer: `down(act(gate(x)) · up(x))` when gated, `down(act(up(x)))` otherwise
/// (with μP multipliers: `m_down · down(act(m_gate · gate(x)) · up(x))`).
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    /// `d_model → d_hidden`, through the activation (absent when not gated).
    pub gate: Option<Linear<B>>,
    /// `d_model → d_hidden`.
    pub up: Linear<B>,
    /// `d_hidden → d_model`.
    pub down: Linear<B>,
    /// Low-rank updates of `gate`, `up` and `down` (fine-tuning;
    /// [`with_lora`](Self::with_lora)).
    pub gate_lora: Option<Lora<B>>,
    /// See `gate_lora`.
    pub up_lora: Option<Lora<B>>,
    /// See `gate_lora`.
    pub down_lora: Option<Lora<B>>,
    #[module(skip)]
    activation: MlpActivation,
    /// `(gate, down)` factors, not parameters.
    #[module(skip)]
    multipliers: (f64, f64),
}

impl<B: Backend> Mlp<B> {
    /// # Shapes
    /// - x: `[..., d_model]`; returns `[..., d_model]`
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let scaled = |t: Tensor<B, D>, f: f64| if f == 1.0 { t } else { t * f };
        let (gate_multiplier, down_multiplier) = self.multipliers;
        let up = |x| adapted(&self.up, &self.up_lora, x);
        let hidden = match &self.gate {
            Some(gate) => {
                let g = adapted(gate, &self.gate_lora, x.clone());
                self.activation.forward(scaled(g, gate_multiplier)) * up(x)
            }
            None => self.activation.forward(up(x)),
        };
        scaled(
            adapted(&self.down, &self.down_lora, hidden),
            down_multiplier,
        )
    }

    /// The layer with low-rank updates on the projections that `lora` targets (`gate`, where
    /// the layer is gated, `up`, `down`), in place of any it had.
    pub fn with_lora(mut self, lora: &LoraConfig) -> crate::error::Result<Self> {
        self.gate_lora = match &self.gate {
            Some(gate) => lora.init_for("gate", gate)?,
            None => None,
        };
        self.up_lora = lora.init_for("up", &self.up)?;
        self.down_lora = lora.init_for("down", &self.down)?;
        Ok(self)
    }

    /// Whether the layer holds a low-rank update.
    pub fn has_lora(&self) -> bool {
        self.gate_lora.is_some() || self.up_lora.is_some() || self.down_lora.is_some()
    }

    /// The layer with its low-rank updates folded into the projections' weights.
    pub fn merge_lora(mut self) -> Self {
        self.gate = self.gate.map(|g| merge(g, &mut self.gate_lora));
        self.up = merge(self.up, &mut self.up_lora);
        self.down = merge(self.down, &mut self.down_lora);
        self
    }
}
