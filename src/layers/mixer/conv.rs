//! The mixer's depthwise causal convolution over a sequence, continuing a window and masked at
//! document boundaries.

use burn::tensor::{backend::Backend, Tensor};

use super::layer::Mamba2;
use crate::layers::activation::silu;
use crate::precision::cast_to;

impl<B: Backend> Mamba2<B> {
    /// Depthwise causal convolution + SiLU over a sequence, continuing the raw window
    /// `previous`: `out[t, c] = silu(bias[c] + Σ_k w[c, k] · xBC[t - (K-1) + k, c])`, on the
    /// three pieces `x`, `B`, `C` of `xBC` (channels `[0, d_inner)`, then `g·n` each).
    ///
    /// # Shapes
    /// - pieces: `[b, l, d_inner]`, `[b, l, g·n]`, `[b, l, g·n]`; previous: `[b, conv_dim, d_conv]`
    /// - returns the pieces convolved (same shapes) and the new window `[b, conv_dim, d_conv]`
    pub(super) fn conv_sequence(
        &self,
        pieces: [Tensor<B, 3>; 3],
        previous: Tensor<B, 3>,
        taps: Option<&[Tensor<B, 3>]>,
    ) -> ([Tensor<B, 3>; 3], Tensor<B, 3>) {
        let mut start = 0;
        let mut windows = Vec::with_capacity(3);
        let out = pieces.map(|piece| {
            let width = piece.dims()[2];
            let (out, window) =
                self.conv_channels(piece, previous.clone().narrow(1, start, width), start, taps);
            start += width;
            windows.push(window);
            out
        });
        (out, Tensor::cat(windows, 1))
    }

    /// [`Self::conv_sequence`] on the channels `[first, first + c)` of `xBC`.
    ///
    /// # Shapes
    /// - xbc: `[b, l, c]`, previous: `[b, c, d_conv]`, taps: `d_conv` of `[b, l, 1]` (1 where
    ///   tap `j`, token `t - (d_conv-1-j)`, is in `t`'s document)
    /// - returns `[b, l, c]` and the new window `[b, c, d_conv]`
    fn conv_channels(
        &self,
        xbc: Tensor<B, 3>,
        previous: Tensor<B, 3>,
        first: usize,
        taps: Option<&[Tensor<B, 3>]>,
    ) -> (Tensor<B, 3>, Tensor<B, 3>) {
        let [_, l, c] = xbc.dims();
        let k = self.d_conv;
        // the K-1 newest columns of the previous window, then the new ones: [b, K-1+l, c]
        let full = Tensor::cat(vec![previous.narrow(2, 1, k - 1).swap_dims(1, 2), xbc], 1);
        let weight = self.conv1d.weight.val().narrow(0, first, c).reshape([c, k]);
        let tap = |j: usize| {
            let term = full.clone().narrow(1, j, l);
            let term = match taps {
                Some(taps) => {
                    let dtype = term.dtype();
                    term * cast_to(taps[j].clone(), dtype)
                }
                None => term,
            };
            term * weight.clone().narrow(1, j, 1).reshape([1, 1, c])
        };
        let mut out = tap(0);
        for j in 1..k {
            out = out + tap(j);
        }
        if let Some(bias) = &self.conv1d.bias {
            out = out + bias.val().narrow(0, first, c).reshape([1, 1, c]);
        }
        let mut window = full.narrow(1, l - 1, k);
        if let Some(taps) = taps {
            // the columns of the last token's document only, as if it had run alone
            let last = taps.iter().map(|m| m.clone().narrow(1, l - 1, 1)).collect();
            let dtype = window.dtype();
            window = window * cast_to(Tensor::cat(last, 1), dtype);
        }
        (silu(out), window.swap_dims(1, 2))
    }
}
