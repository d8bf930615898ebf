//! The reference initialisation of parameters that Burn's own initialisers do not give, drawn
//! at once or deferred.

use burn::module::{Param, ParamId};
use burn::nn::Linear;
use burn::tensor::{backend::Backend, Distribution, Tensor, TensorData};

/// A trainable parameter from an initial value, which may be computed (it is detached first,
/// so that it becomes a leaf of the autodiff graph).
pub(crate) fn param<B: Backend, const D: usize>(value: Tensor<B, D>) -> Param<Tensor<B, D>> {
    Param::from_tensor(value.detach())
}

/// A `Linear` initialised as PyTorch's `nn.Linear` default that state-spaces keeps: weight
/// `U(±1/√d_in)` (stored `[d_in, d_out]`), and a zero bias when `bias` is set.
pub(crate) fn linear<B: Backend>(
    d_in: usize,
    d_out: usize,
    bias: bool,
    device: &B::Device,
) -> Linear<B> {
    ParamInit::now(device).linear(d_in, d_out, bias, 1.0)
}

/// How a model's parameters are created: drawn now, in the order the builders ask for them
/// (so that a seeded backend gives the same weights every time), or deferred to their first
/// use.
///
/// Deferred parameters cost nothing until read: the checkpoint loaders build a model that way
/// and replace every parameter with the checkpoint's, so that loading neither draws random
/// weights nor holds a second copy of them.
pub(crate) struct ParamInit<'a, B: Backend> {
    device: &'a B::Device,
    deferred: bool,
}

impl<'a, B: Backend> ParamInit<'a, B> {
    /// Parameters drawn at once.
    pub(crate) fn now(device: &'a B::Device) -> Self {
        setup_cubecl();
        Self {
            device,
            deferred: false,
        }
    }

    /// Parameters drawn on first use (never, for those a loader replaces).
    pub(crate) fn deferred(device: &'a B::Device) -> Self {
        setup_cubecl();
        Self {
            device,
            deferred: true,
        }
    }

    /// The device the parameters live on.
    pub(crate) fn device(&self) -> &'a B::Device {
        self.device
    }

    /// A trainable parameter of `shape` whose initial value `value` computes on a device.
    pub(crate) fn param<const D: usize>(
        &self,
        shape: [usize; D],
        value: impl Fn(&B::Device) -> Tensor<B, D> + Send + Sync + 'static,
    ) -> Param<Tensor<B, D>> {
        if !self.deferred {
            return param(value(self.device));
        }
        Param::uninitialized(
            ParamId::new(),
            move |device, require_grad| {
                let tensor = value(device).detach();
                if require_grad {
                    tensor.require_grad()
                } else {
                    tensor
                }
            },
            self.device.clone(),
            true,
            shape.into(),
        )
    }

    /// A parameter of `shape` filled with `value`.
    pub(crate) fn full<const D: usize>(
        &self,
        shape: [usize; D],
        value: f64,
    ) -> Param<Tensor<B, D>> {
        self.param(shape, move |device| Tensor::full(shape, value, device))
    }

    /// A parameter of `shape` drawn from `distribution`, then multiplied by `scale`.
    pub(crate) fn random<const D: usize>(
        &self,
        shape: [usize; D],
        distribution: Distribution,
        scale: f64,
    ) -> Param<Tensor<B, D>> {
        self.param(shape, move |device| {
            let t = Tensor::random(shape, distribution, device);
            if scale == 1.0 {
                t
            } else {
                t * scale
            }
        })
    }

    /// `dt_bias` of `h` heads as the reference initialises it: `softplus⁻¹(Δ)` with `Δ`
    /// log-uniform in `[dt_min, dt_max]`, floored at `floor`, computed in `f64` on the host.
    pub(crate) fn dt_bias(
        &self,
        h: usize,
        dt_min: f64,
        dt_max: f64,
        floor: f64,
    ) -> Param<Tensor<B, 1>> {
        let (ln_min, ln_max) = (dt_min.ln(), dt_max.ln());
        self.param([h], move |device| {
            let u: Vec<f64> = Tensor::<B, 1>::random([h], Distribution::Uniform(0.0, 1.0), device)
                .into_data()
                .convert::<f64>()
                .to_vec()
                .expect("f64 data");
            let dt_bias: Vec<f64> = u
                .iter()
                .map(|u| {
                    let dt = (u * (ln_max - ln_min) + ln_min).exp().max(floor);
                    dt + (-(-dt).exp_m1()).ln()
                })
                .collect();
            Tensor::from_data(TensorData::new(dt_bias, [h]), device)
        })
    }

    /// A `Linear` as [`linear`] builds it, its weight multiplied by `scale`.
    pub(crate) fn linear(&self, d_in: usize, d_out: usize, bias: bool, scale: f64) -> Linear<B> {
        let bound = 1.0 / (d_in as f64).sqrt();
        Linear {
            weight: self.random([d_in, d_out], Distribution::Uniform(-bound, bound), scale),
            bias: bias.then(|| self.full([d_out], 0.0)),
        }
    }
}

/// Gives CubeCL the crate's settings before a model's first parameter reaches a GPU device
/// (`cubecl_setup`: every init and loader builds through [`ParamInit`]).
pub(crate) fn setup_cubecl() {
    #[cfg(feature = "cubecl")]
    crate::cubecl_setup::setup_cubecl();
}
