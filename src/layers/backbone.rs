//! The backbone: a stack of residual blocks and the final norm.

use crate::ssd::{FusedKernels, SsdBackend};
use burn::config::Config;
use burn::module::Module;
use burn::tensor::{backend::Backend, Tensor};

use crate::error::{check_shape, Mamba2Error};
use crate::init::ParamInit;
use crate::layers::block::{Mamba2Block, Mamba2BlockConfig};
use crate::layers::documents::Documents;
use crate::layers::mixer::Mamba2Config;
use crate::layers::norm::{RmsNorm, RmsNormConfig};
use crate::layers::state::BackboneState;
use crate::precision::upcast;

/// Configuration of a [`Mamba2Backbone`].
#[derive(Config, Debug)]
pub struct Mamba2BackboneConfig {
    /// Number of blocks.
    pub n_layer: usize,
    /// The mixer of every block.
    pub mixer: Mamba2Config,
    /// Epsilon of the block norms and the final norm. Default: 1e-5.
    #[config(default = 1e-5)]
    pub norm_eps: f64,
    /// Scale each out_proj weight by `1/√n_layer` at init, as state-spaces does. Default: true.
    #[config(default = true)]
    pub rescale_prenorm_residual: bool,
}

impl Mamba2BackboneConfig {
    /// The number of parameters [`init`](Self::init) creates, computed from the config in
    /// `f64` (which cannot overflow for sizes from a corrupt file: the checkpoint loaders compare
    /// it with a file's size before building anything).
    pub(crate) fn param_count(&self) -> f64 {
        let d_model = self.mixer.d_model as f64;
        // each block's norm, and `norm_f`
        let block = d_model + self.mixer.param_count();
        self.n_layer as f64 * block + d_model
    }

    /// Checks the config (and its mixer's).
    pub fn validate(&self) -> crate::error::Result<()> {
        if self.n_layer == 0 {
            return Err(Mamba2Error::config("n_layer", "must be at least 1"));
        }
        if !(self.norm_eps > 0.0) {
            return Err(Mamba2Error::config(
                "norm_eps",
                format!("must be > 0, got {}", self.norm_eps),
            ));
        }
        self.mixer.validate()
    }

    /// Builds the backbone with state-spaces' initialisation.
    pub fn init<B: Backend>(&self, device: &B::Device) -> crate::error::Result<Mamba2Backbone<B>> {
        self.build(&ParamInit::now(device))
    }

    /// [`init`](Self::init) with parameters made by `init`.
    pub(crate) fn build<B: Backend>(
        &self,
        init: &ParamInit<B>,
    ) -> crate::error::Result<Mamba2Backbone<B>> {
        self.validate()?;
        let block = Mamba2BlockConfig::new(self.mixer.clone()).with_norm_eps(self.norm_eps);
        let scale = if self.rescale_prenorm_residual {
            1.0 / (self.n_layer as f64).sqrt()
        } else {
            1.0
        };
        let layers = (0..self.n_layer)
            .map(|_| block.build(init, scale))
            .collect::<crate::error::Result<Vec<_>>>()?;
        Ok(Mamba2Backbone {
            layers,
            norm_f: RmsNormConfig::new(self.mixer.d_model)
                .with_eps(self.norm_eps)
                .build(init),
        })
    }
}

/// A stack of [`Mamba2Block`]s followed by the final RMSNorm `norm_f`.
#[derive(Module, Debug)]
pub struct Mamba2Backbone<B: Backend> {
    /// The blocks, in order.
    pub layers: Vec<Mamba2Block<B>>,
    /// The final norm.
    pub norm_f: RmsNorm<B>,
}

impl<B: Backend> Mamba2Backbone<B> {
    /// Width of the residual stream.
    pub fn d_model(&self) -> usize {
        self.layers[0].mixer.d_model()
    }

    /// Sets where every layer's chunked SSD and projections run the backend's fused kernels
    /// ([`Mamba2::set_fused_kernels`](crate::Mamba2::set_fused_kernels)); the models reach it
    /// through their `backbone` field.
    pub fn set_fused_kernels(&mut self, mode: FusedKernels) {
        for layer in &mut self.layers {
            layer.mixer.set_fused_kernels(mode);
        }
    }

    /// The all-zero state of a fresh batch of `batch` sequences.
    pub fn zero_state(&self, batch: usize, device: &B::Device) -> BackboneState<B> {
        BackboneState {
            layers: self
                .layers
                .iter()
                .map(|l| l.mixer.zero_state(batch, device))
                .collect(),
        }
    }

    fn check_layers(&self, state: &BackboneState<B>) -> crate::error::Result<()> {
        if state.layers.len() != self.layers.len() {
            return Err(Mamba2Error::Shape {
                name: "state.layers",
                expected: format!("{} layer states", self.layers.len()),
                actual: vec![state.layers.len()],
            });
        }
        Ok(())
    }
}

impl<B: Backend> Mamba2Backbone<B> {
    /// Runs the blocks and returns the residual stream after each one (before `norm_f`)
    /// with the new state.
    ///
    /// # Shapes
    /// - x: `[b, l, d_model]`; returns one `[b, l, d_model]` per layer
    pub fn forward_layers(
        &self,
        x: Tensor<B, 3>,
        state: Option<BackboneState<B>>,
    ) -> crate::error::Result<(Vec<Tensor<B, 3>>, BackboneState<B>)>
    where
        B: SsdBackend,
    {
        self.forward_layers_documents(x, None, state)
    }

    /// [`forward_layers`](Self::forward_layers), over packed rows when `documents` are given.
    ///
    /// # Shapes
    /// - x: `[b, l, d_model]`, documents: `[b, l]`; returns one `[b, l, d_model]` per layer
    pub fn forward_layers_documents(
        &self,
        x: Tensor<B, 3>,
        documents: Option<&Documents<B>>,
        state: Option<BackboneState<B>>,
    ) -> crate::error::Result<(Vec<Tensor<B, 3>>, BackboneState<B>)>
    where
        B: SsdBackend,
    {
        check_shape(
            "x",
            &x.dims(),
            &[None, None, Some(self.d_model())],
            "b, l, d_model",
        )?;
        let mut states: Vec<Option<_>> = match state {
            Some(s) => {
                self.check_layers(&s)?;
                s.layers.into_iter().map(Some).collect()
            }
            None => vec![None; self.layers.len()],
        };
        let mut h = upcast(x); // the residual stream stays in f32 or wider
        let mut outputs = Vec::with_capacity(self.layers.len());
        let mut new_states = Vec::with_capacity(self.layers.len());
        for (layer, state) in self.layers.iter().zip(states.iter_mut()) {
            let (out, s) = layer.forward_documents(h, documents, state.take())?;
            outputs.push(out.clone());
            new_states.push(s);
            h = out;
        }
        Ok((outputs, BackboneState { layers: new_states }))
    }

    /// # Shapes
    /// - x: `[b, l, d_model]`; returns `[b, l, d_model]` (after `norm_f`) and the new state
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        state: Option<BackboneState<B>>,
    ) -> crate::error::Result<(Tensor<B, 3>, BackboneState<B>)>
    where
        B: SsdBackend,
    {
        self.forward_documents(x, None, state)
    }

    /// [`forward`](Self::forward) over packed rows: each row holds the `documents` back to back
    /// and no layer's state crosses a document boundary (see
    /// [`Mamba2::forward_documents`](crate::Mamba2::forward_documents)); `None` is
    /// [`forward`](Self::forward).
    ///
    /// # Shapes
    /// - x: `[b, l, d_model]`, documents: `[b, l]`; returns `[b, l, d_model]` (after `norm_f`)
    ///   and the state of each row's last document
    pub fn forward_documents(
        &self,
        x: Tensor<B, 3>,
        documents: Option<&Documents<B>>,
        state: Option<BackboneState<B>>,
    ) -> crate::error::Result<(Tensor<B, 3>, BackboneState<B>)>
    where
        B: SsdBackend,
    {
        let (mut outputs, state) = self.forward_layers_documents(x, documents, state)?;
        let last = outputs.pop().expect("at least one layer");
        Ok((self.norm_f.forward(last), state))
    }

    /// One recurrent step through every block.
    ///
    /// # Shapes
    /// - x: `[b, d_model]`; returns `[b, d_model]` (after `norm_f`) and the new state
    pub fn step(
        &self,
        x: Tensor<B, 2>,
        state: BackboneState<B>,
    ) -> crate::error::Result<(Tensor<B, 2>, BackboneState<B>)>
    where
        B: SsdBackend,
    {
        check_shape("x", &x.dims(), &[None, Some(self.d_model())], "b, d_model")?;
        self.check_layers(&state)?;
        let mut h = upcast(x);
        let mut new_states = Vec::with_capacity(self.layers.len());
        for (layer, s) in self.layers.iter().zip(state.layers) {
            let (out, s) = layer.step(h, s)?;
            new_states.push(s);
            h = out;
        }
        Ok((self.norm_f.forward(h), BackboneState { layers: new_states }))
    }
}
