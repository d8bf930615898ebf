//! Low-rank adapters on the language models, for fine-tuning: every parameter frozen, an update
//! beside each projection a [`LoraConfig`] targets (the mixers' `in_proj` and `out_proj`;
//! attention's four projections and the MLPs' three, the shared experts' included; a mixture's
//! routed experts are not adapted), then folded back into the weights for export.

use std::borrow::Cow;

use burn::module::Module;
use burn::tensor::backend::Backend;

use crate::error::Mamba2Error;
use crate::layers::lora::LoraConfig;
use crate::models::hybrid::{HybridLayer, HybridLm};
use crate::models::lm::Mamba2Lm;

/// The error of a config whose targets adapt none of a model's projections.
fn no_target(lora: &LoraConfig, has: &str) -> Mamba2Error {
    Mamba2Error::config(
        "targets",
        format!(
            "{} adapt none of the model's projections ({has})",
            lora.targets.join(", ")
        ),
    )
}

impl<B: Backend> Mamba2Lm<B> {
    /// The model to fine-tune with low-rank adapters: every parameter frozen (no gradient, so
    /// no optimizer state), and an update, the only trainable parameters, beside each mixer's
    /// `in_proj` and `out_proj` that `lora` targets. An
    /// [`InvalidConfig`](Mamba2Error::InvalidConfig) error names `targets` when they adapt
    /// nothing here.
    pub fn with_lora(self, lora: &LoraConfig) -> crate::error::Result<Self> {
        lora.validate()?;
        let mut model = self.no_grad();
        let layers = std::mem::take(&mut model.backbone.layers);
        model.backbone.layers = layers
            .into_iter()
            .map(|mut block| {
                block.mixer = block.mixer.with_lora(lora)?;
                Ok(block)
            })
            .collect::<crate::error::Result<_>>()?;
        if !model.has_lora() {
            return Err(no_target(lora, "in_proj, out_proj"));
        }
        Ok(model)
    }

    /// Whether any layer holds a low-rank update.
    pub fn has_lora(&self) -> bool {
        self.backbone.layers.iter().any(|b| b.mixer.has_lora())
    }

    /// The model as export writes it: itself without low-rank updates, else a copy with them
    /// folded in ([`merge_lora`](Self::merge_lora)).
    pub(crate) fn lora_folded(&self) -> Cow<'_, Self> {
        match self.has_lora() {
            true => Cow::Owned(self.clone().merge_lora()),
            false => Cow::Borrowed(self),
        }
    }

    /// The model with every low-rank update folded into its projection's weight (what
    /// export writes); the other parameters as they were.
    pub fn merge_lora(mut self) -> Self {
        let layers = std::mem::take(&mut self.backbone.layers);
        self.backbone.layers = layers
            .into_iter()
            .map(|mut block| {
                block.mixer = block.mixer.merge_lora();
                block
            })
            .collect();
        self
    }
}

impl<B: Backend> HybridLayer<B> {
    fn with_lora(mut self, lora: &LoraConfig) -> crate::error::Result<Self> {
        self.mamba = self.mamba.map(|m| m.with_lora(lora)).transpose()?;
        self.attention = self.attention.map(|a| a.with_lora(lora)).transpose()?;
        self.mlp = self.mlp.map(|m| m.with_lora(lora)).transpose()?;
        if let Some(moe) = &mut self.moe {
            moe.shared = moe.shared.take().map(|m| m.with_lora(lora)).transpose()?;
        }
        Ok(self)
    }

    fn has_lora(&self) -> bool {
        self.mamba.as_ref().is_some_and(|m| m.has_lora())
            || self.attention.as_ref().is_some_and(|a| a.has_lora())
            || self.mlp.as_ref().is_some_and(|m| m.has_lora())
            || self
                .moe
                .as_ref()
                .and_then(|moe| moe.shared.as_ref())
                .is_some_and(|m| m.has_lora())
    }

    fn merge_lora(mut self) -> Self {
        self.mamba = self.mamba.map(|m| m.merge_lora());
        self.attention = self.attention.map(|a| a.merge_lora());
        self.mlp = self.mlp.map(|m| m.merge_lora());
        if let Some(moe) = &mut self.moe {
            moe.shared = moe.shared.take().map(|m| m.merge_lora());
        }
        self
    }
}

impl<B: Backend> HybridLm<B> {
    /// The model to fine-tune with low-rank adapters: every parameter frozen (no gradient, so
    /// no optimizer state), and an update, the only trainable parameters, beside each
    /// projection that `lora` targets: the Mamba layers' `in_proj` and `out_proj`, attention's
    /// `q_proj`, `k_proj`, `v_proj` and `o_proj`, the MLPs' (and shared experts') `gate`, `up`
    /// and `down`; never the routed experts. An [`InvalidConfig`](Mamba2Error::InvalidConfig)
    /// error names `targets` when they adapt nothing here.
    pub fn with_lora(self, lora: &LoraConfig) -> crate::error::Result<Self> {
        lora.validate()?;
        let mut model = self.no_grad();
        let layers = std::mem::take(&mut model.layers);
        model.layers = layers
            .into_iter()
            .map(|layer| layer.with_lora(lora))
            .collect::<crate::error::Result<_>>()?;
        if !model.has_lora() {
            return Err(no_target(lora, "the layers' projections"));
        }
        Ok(model)
    }

    /// Whether any layer holds a low-rank update.
    pub fn has_lora(&self) -> bool {
        self.layers.iter().any(HybridLayer::has_lora)
    }

    /// The model as export writes it: itself without low-rank updates, else a copy with them
    /// folded in ([`merge_lora`](Self::merge_lora)).
    pub(crate) fn lora_folded(&self) -> Cow<'_, Self> {
        match self.has_lora() {
            true => Cow::Owned(self.clone().merge_lora()),
            false => Cow::Borrowed(self),
        }
    }

    /// The model with every low-rank update folded into its projection's weight (what
    /// export writes); the other parameters as they were.
    pub fn merge_lora(mut self) -> Self {
        let layers = std::mem::take(&mut self.layers);
        self.layers = layers.into_iter().map(HybridLayer::merge_lora).collect();
        self
    }
}
