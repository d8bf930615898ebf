//! The pre-norm residual block: `h + Mamba2(RMSNorm(h))`.

use crate::ssd::SsdBackend;
use burn::config::Config;
use burn::module::Module;
use burn::tensor::{backend::Backend, Tensor};

use crate::init::ParamInit;
use crate::layers::documents::Documents;
use crate::layers::mixer::{Mamba2, Mamba2Config};
use crate::layers::norm::{RmsNorm, RmsNormConfig};
use crate::layers::state::Mamba2State;
use crate::precision::cast_to;

/// Configuration of a [`Mamba2Block`].
#[derive(Config, Debug)]
pub struct Mamba2BlockConfig {
    /// The mixer.
    pub mixer: Mamba2Config,
    /// Epsilon of the pre-norm. Default: 1e-5.
    #[config(default = 1e-5)]
    pub norm_eps: f64,
}

impl Mamba2BlockConfig {
    /// Builds the block (norm weight 1, mixer as [`Mamba2Config::init`]).
    pub fn init<B: Backend>(&self, device: &B::Device) -> crate::error::Result<Mamba2Block<B>> {
        self.build(&ParamInit::now(device), 1.0)
    }

    /// [`init`](Self::init) with parameters made by `init`, the mixer's out_proj weight
    /// multiplied by `out_proj_scale`.
    pub(crate) fn build<B: Backend>(
        &self,
        init: &ParamInit<B>,
        out_proj_scale: f64,
    ) -> crate::error::Result<Mamba2Block<B>> {
        Ok(Mamba2Block {
            norm: RmsNormConfig::new(self.mixer.d_model)
                .with_eps(self.norm_eps)
                .build(init),
            mixer: self.mixer.build(init, out_proj_scale)?,
        })
    }
}

/// A residual block: `h_out = h + mixer(norm(h))`. The residual stream keeps the type it
/// comes in with (the backbone keeps it in `f32` or wider).
#[derive(Module, Debug)]
pub struct Mamba2Block<B: Backend> {
    /// The pre-norm.
    pub norm: RmsNorm<B>,
    /// The mixer.
    pub mixer: Mamba2<B>,
}

impl<B: Backend> Mamba2Block<B> {
    /// # Shapes
    /// - h: `[b, l, d_model]`; returns `[b, l, d_model]` and the mixer's new state
    pub fn forward(
        &self,
        h: Tensor<B, 3>,
        state: Option<Mamba2State<B>>,
    ) -> crate::error::Result<(Tensor<B, 3>, Mamba2State<B>)>
    where
        B: SsdBackend,
    {
        self.forward_documents(h, None, state)
    }

    /// [`forward`](Self::forward), over packed rows when `documents` are given (see
    /// [`Mamba2::forward_documents`](crate::Mamba2::forward_documents)).
    ///
    /// # Shapes
    /// - h: `[b, l, d_model]`, documents: `[b, l]`; returns `[b, l, d_model]` and the new state
    pub fn forward_documents(
        &self,
        h: Tensor<B, 3>,
        documents: Option<&Documents<B>>,
        state: Option<Mamba2State<B>>,
    ) -> crate::error::Result<(Tensor<B, 3>, Mamba2State<B>)>
    where
        B: SsdBackend,
    {
        let x = cast_to(self.norm.forward(h.clone()), self.norm.weight.val().dtype());
        let (y, state) = self.mixer.forward_documents(x, documents, state)?;
        let dtype = h.dtype();
        Ok((h + cast_to(y, dtype), state))
    }

    /// # Shapes
    /// - h: `[b, d_model]`; returns `[b, d_model]` and the mixer's new state
    pub fn step(
        &self,
        h: Tensor<B, 2>,
        state: Mamba2State<B>,
    ) -> crate::error::Result<(Tensor<B, 2>, Mamba2State<B>)>
    where
        B: SsdBackend,
    {
        let x = cast_to(self.norm.forward(h.clone()), self.norm.weight.val().dtype());
        let (y, state) = self.mixer.step(x, state)?;
        let dtype = h.dtype();
        Ok((h + cast_to(y, dtype), state))
    }
}
