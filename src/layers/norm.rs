//! RMS normalisation: the plain RMSNorm of the residual blocks and the group-wise gated
//! RMSNorm of the mixer (paper §7.1).
//!
//! Statistics are computed in `f32` when the input is half precision, and in the input's own
//! type otherwise (so `f64` models stay `f64` end to end).

use burn::config::Config;
use burn::module::{Content, DisplaySettings, Module, ModuleDisplay, Param};
use burn::tensor::{backend::Backend, Tensor};

use crate::init::ParamInit;
use crate::layers::activation::silu;
use crate::precision::{cast_to, upcast};

/// Configuration of an [`RmsNorm`].
#[derive(Config, Debug)]
pub struct RmsNormConfig {
    /// Width of the normalised (last) dimension.
    pub d_model: usize,
    /// Added to the mean square before the square root. Default: `1e-5`.
    #[config(default = 1e-5)]
    pub eps: f64,
}

/// `y = x / sqrt(mean(x²) + eps) · weight` over the last dimension.
///
/// Its parameter is `weight`, as in PyTorch checkpoints (initialised to ones).
#[derive(Module, Debug)]
#[module(custom_display)]
pub struct RmsNorm<B: Backend> {
    /// Per-channel scale `[d_model]`.
    pub weight: Param<Tensor<B, 1>>,
    /// Added to the mean square.
    pub eps: f64,
}

impl RmsNormConfig {
    /// Builds the layer with `weight = 1`.
    pub fn init<B: Backend>(&self, device: &B::Device) -> RmsNorm<B> {
        self.build(&ParamInit::now(device))
    }

    /// [`init`](Self::init) with the weight made by `init`.
    pub(crate) fn build<B: Backend>(&self, init: &ParamInit<B>) -> RmsNorm<B> {
        RmsNorm {
            weight: init.full([self.d_model], 1.0),
            eps: self.eps,
        }
    }
}

/// Normalises the last dimension of `x` by its root mean square (no scale).
fn rms_normalize<B: Backend, const D: usize>(x: Tensor<B, D>, eps: f64) -> Tensor<B, D> {
    let dtype = x.dtype();
    let x = upcast(x);
    // x · (mean(x²) + eps)^(-1/2): a product rather than a quotient, because the gradient of
    // a tensor division goes through `recip`, which burn-ndarray computes with the approximate
    // SIMD reciprocal (12 to 14 bits on x86) and which then spoils every gradient upstream.
    //
    // The mean is a product with a `[d, 1]` column of `1/d`: the gradient of `mean_dim` would
    // allocate a tensor of ones of the input's full size.
    let d = x.dims()[D - 1];
    let mean_column = Tensor::<B, 2>::full([d, 1], 1.0 / d as f64, (&x.device(), x.dtype()));
    let inv_rms = (x.clone().square().matmul(mean_column.unsqueeze::<D>()) + eps).powf_scalar(-0.5);
    cast_to(x * inv_rms, dtype)
}

impl<B: Backend> RmsNorm<B> {
    /// # Shapes
    /// - x: `[..., d_model]`
    /// - returns `[..., d_model]`, in the weight's float type
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        // in the input's type (the residual stream is f32 or wider even in a half-precision
        // model), then in the weight's: the next layer's type
        let weight = self.weight.val();
        let dtype = weight.dtype();
        let x = rms_normalize(x, self.eps);
        let compute = x.dtype();
        cast_to(x * cast_to(weight, compute).unsqueeze(), dtype)
    }
}

/// Configuration of a [`RmsNormGated`].
#[derive(Config, Debug)]
pub struct RmsNormGatedConfig {
    /// Width of the input (`d_inner` in the mixer).
    pub d_model: usize,
    /// Size of each normalisation group (`d_inner / ngroups` in the mixer).
    pub group_size: usize,
    /// Added to the mean square. Default: `1e-5`.
    #[config(default = 1e-5)]
    pub eps: f64,
    /// Normalise `y` before multiplying by the gate (`true`), or normalise `y · silu(z)`
    /// (`false`, the published models). Default: `false`.
    #[config(default = false)]
    pub norm_before_gate: bool,
}

/// Gated RMSNorm, normalised per group of `group_size` contiguous channels:
///
/// - `norm_before_gate = false`: `out = rms_g(y · silu(z)) · weight`
/// - `norm_before_gate = true`: `out = rms_g(y) · weight · silu(z)`
#[derive(Module, Debug)]
#[module(custom_display)]
pub struct RmsNormGated<B: Backend> {
    /// Per-channel scale `[d_model]` (ones at init).
    pub weight: Param<Tensor<B, 1>>,
    /// Channels per normalisation group.
    pub group_size: usize,
    /// Added to the mean square.
    pub eps: f64,
    /// Whether the gate is applied after the normalisation.
    pub norm_before_gate: bool,
}

impl RmsNormGatedConfig {
    /// Builds the layer with `weight = 1`.
    pub fn init<B: Backend>(&self, device: &B::Device) -> RmsNormGated<B> {
        self.build(&ParamInit::now(device))
    }

    /// [`init`](Self::init) with the weight made by `init`.
    pub(crate) fn build<B: Backend>(&self, init: &ParamInit<B>) -> RmsNormGated<B> {
        RmsNormGated {
            weight: init.full([self.d_model], 1.0),
            group_size: self.group_size,
            eps: self.eps,
            norm_before_gate: self.norm_before_gate,
        }
    }
}

impl<B: Backend> RmsNormGated<B> {
    /// # Shapes
    /// - y, z: `[b, l, d_model]`
    /// - returns `[b, l, d_model]`
    pub fn forward(&self, y: Tensor<B, 3>, z: Tensor<B, 3>) -> Tensor<B, 3> {
        let [b, l, d] = y.dims();
        let groups = d / self.group_size;
        let gate = silu(z);
        let grouped = |t: Tensor<B, 3>| {
            rms_normalize(t.reshape([b, l, groups, self.group_size]), self.eps).reshape([b, l, d])
        };
        let weight = self.weight.val().reshape([1, 1, d]);
        if self.norm_before_gate {
            grouped(y) * weight * gate
        } else {
            grouped(y * gate) * weight
        }
    }
}

impl<B: Backend> ModuleDisplay for RmsNorm<B> {
    fn custom_settings(&self) -> Option<DisplaySettings> {
        inline_display()
    }

    fn custom_content(&self, content: Content) -> Option<Content> {
        let [d_model] = self.weight.shape().dims();
        content
            .add("d_model", &d_model)
            .add("eps", &self.eps)
            .optional()
    }
}

impl<B: Backend> ModuleDisplay for RmsNormGated<B> {
    fn custom_settings(&self) -> Option<DisplaySettings> {
        inline_display()
    }

    fn custom_content(&self, content: Content) -> Option<Content> {
        let [d_model] = self.weight.shape().dims();
        content
            .add("d_model", &d_model)
            .add("group_size", &self.group_size)
            .add("eps", &self.eps)
            .add("norm_before_gate", &self.norm_before_gate)
            .optional()
    }
}

/// The display settings of this crate's modules: their sizes on one line, as burn-nn's.
pub(crate) fn inline_display() -> Option<DisplaySettings> {
    DisplaySettings::new()
        .with_new_line_after_attribute(false)
        .optional()
}
