//! Streaming state: what a Mamba-2 layer carries from one piece of a sequence to the next.

use burn::tensor::{backend::Backend, Tensor};

use crate::ssd::continue_rows;

/// The state of one [`Mamba2`](crate::Mamba2) mixer after some prefix of a sequence.
///
/// With it, a sequence can be processed whole, in pieces of any length, or one token at a
/// time, with identical results.
#[derive(Clone, Debug)]
pub struct Mamba2State<B: Backend> {
    /// The last `d_conv` raw (pre-convolution) `xBC` columns, oldest first, zero-padded on the
    /// left when fewer tokens have been seen. Shape `[b, conv_dim, d_conv]`.
    pub conv: Tensor<B, 3>,
    /// The SSM state `S`. Shape `[b, h, p, n]`; kept in `f32` (or `f64`) even for half
    /// precision models.
    pub ssm: Tensor<B, 4>,
}

impl<B: Backend> Mamba2State<B> {
    /// The batch size this state is for.
    pub fn batch_size(&self) -> usize {
        self.ssm.dims()[0]
    }

    /// Cuts the autodiff graph (for truncated backpropagation through time).
    pub fn detach(self) -> Self {
        Self {
            conv: self.conv.detach(),
            ssm: self.ssm.detach(),
        }
    }

    /// Starts a new document in the rows where `starts` is 1 (their state becomes that of a
    /// fresh sequence) and keeps the others: the recurrent step's form of packed sequences.
    ///
    /// # Shapes
    /// - starts: `[b]` (1 or 0)
    pub fn start_documents(self, starts: Tensor<B, 1>) -> Self {
        Self {
            conv: continue_rows(self.conv, starts.clone()),
            ssm: continue_rows(self.ssm, starts),
        }
    }

    /// The states of several batches as one batch, their rows in order.
    ///
    /// # Panics
    /// If `states` is empty.
    pub fn cat(states: Vec<Self>) -> Self {
        let (conv, ssm): (Vec<_>, Vec<_>) = states.into_iter().map(|s| (s.conv, s.ssm)).unzip();
        Self {
            conv: Tensor::cat(conv, 0),
            ssm: Tensor::cat(ssm, 0),
        }
    }
}

/// The state of a whole stack of layers: one [`Mamba2State`] per layer, in order.
#[derive(Clone, Debug)]
pub struct BackboneState<B: Backend> {
    /// Per-layer states.
    pub layers: Vec<Mamba2State<B>>,
}

impl<B: Backend> BackboneState<B> {
    /// Cuts the autodiff graph of every layer's state.
    pub fn detach(self) -> Self {
        Self {
            layers: self.layers.into_iter().map(Mamba2State::detach).collect(),
        }
    }

    /// [`Mamba2State::start_documents`] in every layer.
    ///
    /// # Shapes
    /// - starts: `[b]` (1 or 0)
    pub fn start_documents(self, starts: Tensor<B, 1>) -> Self {
        Self {
            layers: self
                .layers
                .into_iter()
                .map(|s| s.start_documents(starts.clone()))
                .collect(),
        }
    }

    /// The states of several batches of the same stack as one batch, their rows in order
    /// ([`Mamba2State::cat`] in every layer).
    ///
    /// # Panics
    /// If `states` is empty or their layer counts differ.
    pub fn cat(states: Vec<Self>) -> Self {
        let n_layers = states[0].layers.len();
        let mut per_layer: Vec<Vec<Mamba2State<B>>> = (0..n_layers).map(|_| Vec::new()).collect();
        for state in states {
            assert_eq!(state.layers.len(), n_layers, "states of different stacks");
            for (layer, s) in per_layer.iter_mut().zip(state.layers) {
                layer.push(s);
            }
        }
        Self {
            layers: per_layer.into_iter().map(Mamba2State::cat).collect(),
        }
    }
}
