//! The mixer module: its parameters, sizes, states and display.

use burn::module::{Content, DisplaySettings, Module, ModuleDisplay, Param};
use burn::nn::conv::Conv1d;
use burn::nn::Linear;
use burn::tensor::{backend::Backend, Tensor};

use super::dt_limit::DtLimit;
use crate::error::{check_shape, Mamba2Error};
use crate::layers::lora::{merge, Lora, LoraConfig};
use crate::layers::norm::RmsNormGated;
use crate::layers::state::Mamba2State;
use crate::ssd::FusedKernels;

/// The Mamba-2 mixer (one SSD layer with its projections).
///
/// Parameter names follow the checkpoints (`in_proj`, `conv1d`, `dt_bias`, `a_log` for
/// `A_log`, `d` for `D`, `norm`, `out_proj`); `Linear` weights are stored `[in, out]`, as
/// Burn does.
#[derive(Module, Debug)]
#[module(custom_display)]
pub struct Mamba2<B: Backend> {
    /// `d_model → [z | x | B | C | dt]`.
    pub in_proj: Linear<B>,
    /// Depthwise causal convolution over `xBC`; weight `[conv_dim, 1, d_conv]`.
    pub conv1d: Conv1d<B>,
    /// Added to `dt` before the softplus, `[nheads]`.
    pub dt_bias: Param<Tensor<B, 1>>,
    /// `A = -exp(a_log)`, `[nheads]`.
    pub a_log: Param<Tensor<B, 1>>,
    /// Skip connection, `[nheads]` (or `[d_inner]` with `d_has_hdim`).
    pub d: Param<Tensor<B, 1>>,
    /// Group-wise gated RMSNorm (absent when `rmsnorm = false`).
    pub norm: Option<RmsNormGated<B>>,
    /// `d_inner → d_model`.
    pub out_proj: Linear<B>,
    /// A low-rank update of `in_proj` (fine-tuning; [`with_lora`](Self::with_lora)).
    pub in_proj_lora: Option<Lora<B>>,
    /// A low-rank update of `out_proj`.
    pub out_proj_lora: Option<Lora<B>>,
    pub(crate) d_model: usize,
    pub(crate) d_inner: usize,
    pub(crate) d_state: usize,
    pub(crate) d_conv: usize,
    pub(crate) headdim: usize,
    pub(crate) nheads: usize,
    pub(crate) ngroups: usize,
    pub(crate) chunk_size: usize,
    pub(crate) dt_limit: (f64, f64),
    /// The path of the chunked SSD and the projections: a setting, not a parameter.
    #[module(skip)]
    pub(crate) fused_kernels: FusedKernels,
    /// Fixed factors of in_proj's pieces `[z, x, B, C, dt]` (`None` where all are 1): from the
    /// config, not parameters.
    #[module(skip)]
    pub(crate) in_proj_multipliers: Option<[f64; 5]>,
}

impl<B: Backend> Mamba2<B> {
    /// Width of the residual stream.
    pub fn d_model(&self) -> usize {
        self.d_model
    }

    /// Number of heads.
    pub fn nheads(&self) -> usize {
        self.nheads
    }

    /// Channels of the convolution (x, B, C).
    pub fn conv_dim(&self) -> usize {
        self.d_inner + 2 * self.ngroups * self.d_state
    }

    /// The chunk length of the chunked SSD.
    pub fn chunk_size(&self) -> usize {
        self.chunk_size
    }

    /// Sets the chunk length of the chunked SSD (results do not depend on it, speed does).
    pub fn set_chunk_size(&mut self, chunk_size: usize) -> crate::error::Result<()> {
        if chunk_size == 0 {
            return Err(Mamba2Error::config("chunk_size", "must be at least 1"));
        }
        self.chunk_size = chunk_size;
        Ok(())
    }

    /// Where the chunked SSD and the projections run the backend's fused kernels.
    pub fn fused_kernels(&self) -> FusedKernels {
        self.fused_kernels
    }

    /// Sets where the chunked SSD and the projections run the backend's fused kernels (results
    /// agree to rounding, speed does not); set it before a forward pass, not between one and
    /// its backward.
    pub fn set_fused_kernels(&mut self, mode: FusedKernels) {
        self.fused_kernels = mode;
    }

    /// The all-zero state of a fresh sequence.
    pub fn zero_state(&self, batch: usize, device: &B::Device) -> Mamba2State<B> {
        Mamba2State {
            conv: Tensor::zeros([batch, self.conv_dim(), self.d_conv], device),
            ssm: Tensor::zeros([batch, self.nheads, self.headdim, self.d_state], device),
        }
    }

    /// Checks `state` against this layer for a batch of `batch`.
    pub fn check_state(&self, state: &Mamba2State<B>, batch: usize) -> crate::error::Result<()> {
        check_shape(
            "state.conv",
            &state.conv.dims(),
            &[Some(batch), Some(self.conv_dim()), Some(self.d_conv)],
            "b, conv_dim, d_conv",
        )?;
        check_shape(
            "state.ssm",
            &state.ssm.dims(),
            &[
                Some(batch),
                Some(self.nheads),
                Some(self.headdim),
                Some(self.d_state),
            ],
            "b, h, p, n",
        )
    }

    /// The layer with low-rank updates on the projections that `lora` targets (`in_proj`,
    /// `out_proj`), in place of any it had; its other parameters are left as they are.
    pub fn with_lora(mut self, lora: &LoraConfig) -> crate::error::Result<Self> {
        self.in_proj_lora = lora.init_for("in_proj", &self.in_proj)?;
        self.out_proj_lora = lora.init_for("out_proj", &self.out_proj)?;
        Ok(self)
    }

    /// The layer with its low-rank updates folded into the projections' weights.
    pub fn merge_lora(mut self) -> Self {
        self.in_proj = merge(self.in_proj, &mut self.in_proj_lora);
        self.out_proj = merge(self.out_proj, &mut self.out_proj_lora);
        self
    }

    /// Whether the layer holds a low-rank update.
    pub fn has_lora(&self) -> bool {
        self.in_proj_lora.is_some() || self.out_proj_lora.is_some()
    }

    /// The bounds of `dt` (stored as a pair: a module field must be a module or a constant).
    pub(crate) fn dt_limit(&self) -> DtLimit {
        let (min, max) = self.dt_limit;
        DtLimit { min, max }
    }
}

impl<B: Backend> ModuleDisplay for Mamba2<B> {
    fn custom_settings(&self) -> Option<DisplaySettings> {
        crate::layers::norm::inline_display()
    }

    fn custom_content(&self, content: Content) -> Option<Content> {
        content
            .add("d_model", &self.d_model)
            .add("d_inner", &self.d_inner)
            .add("d_state", &self.d_state)
            .add("nheads", &self.nheads)
            .add("headdim", &self.headdim)
            .add("ngroups", &self.ngroups)
            .add("d_conv", &self.d_conv)
            .add("chunk_size", &self.chunk_size)
            .add("gated_norm", &self.norm.is_some())
            .add("params", &self.num_params())
            .optional()
    }
}

#[cfg(all(test, feature = "ndarray"))]
mod tests {
    use super::*;
    use crate::layers::mixer::Mamba2Config;

    #[test]
    fn the_mixer_displays_its_sizes() {
        let device = Default::default();
        let mixer = Mamba2Config::new(32)
            .with_d_state(8)
            .with_headdim(16)
            .init::<burn::backend::NdArray>(&device)
            .unwrap();
        let text = mixer.to_string();
        for part in [
            "d_model: 32",
            "d_inner: 64",
            "d_state: 8",
            "nheads: 4",
            "headdim: 16",
        ] {
            assert!(text.contains(part), "{part} missing from {text}");
        }
        let params = mixer.num_params();
        assert!(text.contains(&format!("params: {params}")), "{text}");
    }

    /// Two mixers in one process take their own paths: one built with `Never` runs the tensor
    /// operations while its clone set to `Always` runs NdArray's fused scan and projections
    /// (the two agree to rounding but not bit for bit), and the calling thread's override takes
    /// precedence over both.
    #[test]
    fn each_mixer_takes_its_own_path() {
        use crate::ssd::{override_fused_kernels, FusedKernels};
        use burn::tensor::backend::Backend;
        use burn::tensor::{Tensor, TensorData};
        use rand::{rngs::StdRng, Rng, SeedableRng};
        type B = burn::backend::NdArray;
        let device = Default::default();
        // the weights and the input drawn from fixed seeds: the same case in every run
        B::seed(&device, 29);
        let never = Mamba2Config::new(32)
            .with_d_state(8)
            .with_headdim(16)
            .with_chunk_size(8)
            .with_fused_kernels(Some(FusedKernels::Never))
            .init::<B>(&device)
            .unwrap();
        assert_eq!(never.fused_kernels(), FusedKernels::Never);
        let mut always = never.clone();
        always.set_fused_kernels(FusedKernels::Always);
        let mut rng = StdRng::seed_from_u64(29);
        let values: Vec<f32> = (0..2 * 21 * 32)
            .map(|_| rng.random_range(-2.0..2.0))
            .collect();
        let x = Tensor::<B, 3>::from_data(TensorData::new(values, [2, 21, 32]), &device);
        let run = |m: &Mamba2<B>| m.forward(x.clone(), None).unwrap().0.into_data();
        let (y_never, y_always) = (run(&never), run(&always));
        assert_ne!(y_never, y_always, "both mixers ran the same path");
        // within 1e-4 of each element, or a few roundings of the largest one (8 ulp): an
        // output near zero is a sum of larger terms, whose two summation orders differ by
        // their roundings, not by a part of the element itself
        let scale = y_never
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .fold(0.0f32, |m, v| m.max(v.abs()));
        let floor = 8.0 * f32::EPSILON * scale;
        y_never.assert_approx_eq::<f32>(&y_always, burn::tensor::Tolerance::rel_abs(1e-4, floor));
        let _forced = override_fused_kernels(FusedKernels::Never);
        assert_eq!(run(&always), y_never);
    }
}
