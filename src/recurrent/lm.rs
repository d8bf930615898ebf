//! The step of a language model on the host: embedding, backbone step, head.

use burn::tensor::backend::Backend;

use super::backbone::{CpuBackbone, CpuEmbedding, CpuLinear, CpuState};
use crate::error::{Mamba2Error, Result};
use crate::layers::state::BackboneState;
use crate::models::lm::Mamba2Lm;

/// A [`Mamba2Lm`] on the host, for one token of one sequence at a time: the logits of the next
/// token in constant time, with no tensor dispatch and no allocation per token.
#[derive(Clone, Debug)]
pub struct CpuLm {
    embedding: CpuEmbedding,
    backbone: CpuBackbone,
    /// `None` when the head is tied to the embedding.
    head: Option<CpuLinear>,
}

/// The recurrent state of one sequence in a [`CpuLm`], with its scratch space.
#[derive(Clone, Debug)]
pub struct CpuLmState {
    /// The backbone's state.
    pub backbone: CpuState,
    hidden: Vec<f32>,
}

impl CpuLm {
    /// Copies the weights of a language model (of any backend and float type) to `f32` host
    /// memory.
    pub fn from_lm<B: Backend>(lm: &Mamba2Lm<B>) -> Self {
        Self {
            embedding: CpuEmbedding::from_embedding(&lm.embedding),
            backbone: CpuBackbone::from_backbone(&lm.backbone),
            head: lm.lm_head.as_ref().map(CpuLinear::from_linear),
        }
    }

    /// The (padded) vocabulary size: the length of the logits.
    pub fn vocab_size(&self) -> usize {
        self.embedding.vocab()
    }

    /// The backbone's step.
    pub fn backbone(&self) -> &CpuBackbone {
        &self.backbone
    }

    /// The all-zero state of a fresh sequence.
    pub fn zero_state(&self) -> CpuLmState {
        self.with_scratch(self.backbone.zero_state())
    }

    fn with_scratch(&self, backbone: CpuState) -> CpuLmState {
        CpuLmState {
            backbone,
            hidden: vec![0.0; self.embedding.d_model()],
        }
    }

    /// Copies sequence `index` of a tensor state of `lm` (after a chunked prefill with
    /// [`Mamba2Lm::forward`]) into a host state.
    pub fn state_from<B: Backend>(
        &self,
        lm: &Mamba2Lm<B>,
        state: &BackboneState<B>,
        index: usize,
    ) -> Result<CpuLmState> {
        Ok(self.with_scratch(self.backbone.state_from(&lm.backbone, state, index)?))
    }

    /// One token: the logits of the next, updating `state`.
    ///
    /// # Shapes
    /// - logits: `[vocab_size]`
    pub fn step(&self, token: i64, state: &mut CpuLmState, logits: &mut [f32]) -> Result<()> {
        let vocab = self.vocab_size();
        if logits.len() != vocab {
            return Err(Mamba2Error::Shape {
                name: "logits",
                expected: format!("[vocab_size = {vocab}]"),
                actual: vec![logits.len()],
            });
        }
        let Some(x) = usize::try_from(token)
            .ok()
            .and_then(|t| self.embedding.row(t))
        else {
            return Err(Mamba2Error::InvalidInput {
                name: "token",
                reason: format!("token id {token} is outside the vocabulary [0, {vocab})"),
            });
        };
        let CpuLmState { backbone, hidden } = state;
        self.backbone.step(x, backbone, hidden)?;
        match &self.head {
            Some(head) => head.forward(hidden, logits),
            None => self.embedding.logits(hidden, logits),
        }
        Ok(())
    }
}
