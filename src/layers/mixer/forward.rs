//! The mixer's forward over a sequence (chunked SSD) and its recurrent step.

use burn::tensor::{backend::Backend, Tensor, TensorData};

use super::layer::Mamba2;
use crate::error::{check_shape, Mamba2Error};
use crate::layers::activation::{silu, softplus, softplus_clamped};
use crate::layers::documents::Documents;
use crate::layers::lora::{adapted, plus_update};
use crate::layers::state::Mamba2State;
use crate::precision::{cast_to, reshape_via_flat, upcast};
use crate::ssd::ssd_step;
use crate::ssd::SsdBackend;
use crate::ssd::{projection, ssd_chunked, SsdInput};

/// The pieces of the in_proj output, before the convolution.
///
/// # Shapes
/// - z, x: `[t, d_inner]`, b, c: `[t, g·n]`, dt: `[t, h]` for `t` tokens
struct Projected<B: Backend> {
    z: Tensor<B, 2>,
    x: Tensor<B, 2>,
    b: Tensor<B, 2>,
    c: Tensor<B, 2>,
    dt: Tensor<B, 2>,
}

impl<B: Backend> Mamba2<B> {
    /// Runs the layer over a sequence, continuing from `state` (a fresh sequence when `None`),
    /// and returns the output and the state after the last token. Any length works, and
    /// splitting a sequence into pieces gives the same result as running it whole.
    ///
    /// # Shapes
    /// - x: `[b, l, d_model]`, `l ≥ 1`
    /// - state: conv `[b, conv_dim, d_conv]`, ssm `[b, h, p, n]`
    /// - returns `[b, l, d_model]` and the new state
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        state: Option<Mamba2State<B>>,
    ) -> crate::error::Result<(Tensor<B, 3>, Mamba2State<B>)>
    where
        B: SsdBackend,
    {
        self.forward_documents(x, None, state)
    }

    /// [`forward`](Self::forward) over packed rows: each row holds the `documents` back to
    /// back, and neither the SSM state nor the convolution reads across a document boundary,
    /// so every document gets the outputs it would get alone. `state` continues each row's
    /// first document; the returned state is that of each row's last document. With
    /// `documents = None` this is [`forward`](Self::forward).
    ///
    /// # Shapes
    /// - x: `[b, l, d_model]`, documents: `[b, l]`
    /// - returns `[b, l, d_model]` and the new state
    pub fn forward_documents(
        &self,
        x: Tensor<B, 3>,
        documents: Option<&Documents<B>>,
        state: Option<Mamba2State<B>>,
    ) -> crate::error::Result<(Tensor<B, 3>, Mamba2State<B>)>
    where
        B: SsdBackend,
    {
        check_shape(
            "x",
            &x.dims(),
            &[None, None, Some(self.d_model)],
            "b, l, d_model",
        )?;
        let [b, l, _] = x.dims();
        if l == 0 {
            return Err(Mamba2Error::Shape {
                name: "x",
                expected: "a sequence of at least one token".into(),
                actual: x.dims().to_vec(),
            });
        }
        if let Some(s) = &state {
            self.check_state(s, b)?;
        }
        if let Some(documents) = documents {
            documents.check(b, l)?;
        }
        let (h, p, g, n) = (self.nheads, self.headdim, self.ngroups, self.d_state);

        let Projected {
            z,
            x,
            b: b_in,
            c: c_in,
            dt,
        } = self.project(x.reshape([b * l, self.d_model]));
        let previous = match &state {
            Some(s) => s.conv.clone(),
            None => Tensor::zeros([b, self.conv_dim(), self.d_conv], (&x.device(), x.dtype())),
        };
        // per tap j of the convolution (token t - (K-1-j)): whether it is t's document
        let taps = documents.map(|d| {
            (0..self.d_conv)
                .map(|j| d.same_as_shifted(self.d_conv - 1 - j).unsqueeze_dim::<3>(2))
                .collect::<Vec<_>>()
        });
        let ([xs, b_mat, c_mat], conv_state) = self.conv_sequence(
            [
                x.reshape([b, l, self.d_inner]),
                b_in.reshape([b, l, g * n]),
                c_in.reshape([b, l, g * n]),
            ],
            previous,
            taps.as_deref(),
        );
        let xs = xs.reshape([b, l, h, p]);
        let b_mat = b_mat.reshape([b, l, g, n]);
        let c_mat = c_mat.reshape([b, l, g, n]);
        let (z, dt) = (z.reshape([b, l, self.d_inner]), dt.reshape([b, l, h]));
        let dt = self.dt_activation(dt);

        let input = SsdInput::new(xs.clone(), dt, self.a(), b_mat, c_mat, self.chunk_size)
            .initial_state(state.map(|s| s.ssm))
            .document_starts(documents.map(Documents::starts))
            .fused_kernels(self.fused_kernels);
        let (y, ssm_state) = ssd_chunked(input);
        let y = y + xs * self.d_skip().unsqueeze::<4>();
        // one product over all tokens rather than one per batch row
        let gated = self.gate(y.reshape([b, l, self.d_inner]), z);
        let out_proj = &self.out_proj;
        let gated = gated.reshape([b * l, self.d_inner]);
        let y = projection(
            gated.clone(),
            out_proj.weight.val(),
            out_proj.bias.as_ref().map(|b| b.val()),
            self.fused_kernels,
        );
        let y = plus_update(y, &self.out_proj_lora, gated);
        Ok((
            y.reshape([b, l, self.d_model]),
            Mamba2State {
                conv: conv_state,
                ssm: ssm_state,
            },
        ))
    }
}

impl<B: Backend> Mamba2<B> {
    /// One recurrent step: the output for a single new token, in constant time and memory.
    ///
    /// # Shapes
    /// - x: `[b, d_model]`
    /// - state: conv `[b, conv_dim, d_conv]`, ssm `[b, h, p, n]`
    /// - returns `[b, d_model]` and the new state
    pub fn step(
        &self,
        x: Tensor<B, 2>,
        state: Mamba2State<B>,
    ) -> crate::error::Result<(Tensor<B, 2>, Mamba2State<B>)> {
        check_shape("x", &x.dims(), &[None, Some(self.d_model)], "b, d_model")?;
        let b = x.dims()[0];
        self.check_state(&state, b)?;
        let (h, p, g, n, k) = (
            self.nheads,
            self.headdim,
            self.ngroups,
            self.d_state,
            self.d_conv,
        );

        // one product for the single token (five would cost five launches), then its slices
        let zxbcdt = adapted(&self.in_proj, &self.in_proj_lora, x);
        let zxbcdt = match self.in_proj_multipliers {
            Some(m) => {
                let factors = self.piece_factors(m, &zxbcdt);
                zxbcdt * factors
            }
            None => zxbcdt,
        };
        let conv_dim = self.conv_dim();
        let z = zxbcdt.clone().narrow(1, 0, self.d_inner);
        let xbc = zxbcdt.clone().narrow(1, self.d_inner, conv_dim); // raw xBC [b, conv_dim]
        let dt = zxbcdt.narrow(1, self.d_inner + conv_dim, h);
        // shift the window left by one and append the new raw column
        let window = Tensor::cat(
            vec![state.conv.narrow(2, 1, k - 1), xbc.unsqueeze_dim::<3>(2)],
            2,
        ); // [b, conv_dim, k]
        let weight = self.conv1d.weight.val().reshape([1, self.conv_dim(), k]);
        let mut conv = (window.clone() * weight)
            .sum_dim(2)
            .reshape([b, self.conv_dim()]);
        if let Some(bias) = &self.conv1d.bias {
            conv = conv + bias.val().unsqueeze::<2>();
        }
        let xbc = silu(conv);
        let xs = xbc.clone().narrow(1, 0, self.d_inner).reshape([b, h, p]);
        let b_mat = xbc
            .clone()
            .narrow(1, self.d_inner, g * n)
            .reshape([b, g, n]);
        let c_mat = xbc
            .narrow(1, self.d_inner + g * n, g * n)
            .reshape([b, g, n]);
        let dt = self.dt_activation(dt);

        let (y, ssm_state) = ssd_step(xs.clone(), dt, self.a(), b_mat, c_mat, state.ssm);
        let y = y + xs * self.d_skip().unsqueeze::<3>();
        let gated = self.gate(y.reshape([b, 1, self.d_inner]), z.unsqueeze_dim::<3>(1));
        let y = adapted(
            &self.out_proj,
            &self.out_proj_lora,
            gated.reshape([b, self.d_inner]),
        );
        Ok((
            y,
            Mamba2State {
                conv: window,
                ssm: ssm_state,
            },
        ))
    }

    /// in_proj, as one product per piece of its output `[z | x | B | C | dt]`, each with its
    /// columns of the weight: the pieces come out contiguous, and their gradients need no
    /// full-width zero-padded buffers, as slices of one product's output would.
    ///
    /// # Shapes
    /// - x: `[t, d_model]` for `t` tokens; returns the pieces (see [`Projected`])
    fn project(&self, x: Tensor<B, 2>) -> Projected<B>
    where
        B: SsdBackend,
    {
        let weight = self.in_proj.weight.val(); // [d_model, d_in_proj]
        let bias = self.in_proj.bias.as_ref().map(|b| b.val());
        let piece = |start: usize, len: usize| {
            let w = weight.clone().narrow(1, start, len);
            // a one-column slice is a strided view with a unit last axis, which `linear`'s
            // reshape to [1, d_model, 1] would read wrong on burn-cubecl (see
            // `precision::reshape_via_flat`): copied first
            let w = if len == 1 {
                reshape_via_flat(w, [weight.dims()[0], 1])
            } else {
                w
            };
            let bias = bias.clone().map(|b| b.narrow(0, start, len));
            let y = projection(x.clone(), w, bias, self.fused_kernels);
            match &self.in_proj_lora {
                Some(lora) => y + lora.forward_columns(x.clone(), start, len),
                None => y,
            }
        };
        let (d_inner, gn) = (self.d_inner, self.ngroups * self.d_state);
        let m = self.in_proj_multipliers.unwrap_or([1.0; 5]);
        let scaled = |t: Tensor<B, 2>, factor: f64| if factor == 1.0 { t } else { t * factor };
        Projected {
            z: scaled(piece(0, d_inner), m[0]),
            x: scaled(piece(d_inner, d_inner), m[1]),
            b: scaled(piece(2 * d_inner, gn), m[2]),
            c: scaled(piece(2 * d_inner + gn, gn), m[3]),
            dt: scaled(piece(2 * d_inner + 2 * gn, self.nheads), m[4]),
        }
    }

    /// The factor of each column of in_proj's output, its piece's multiplier, in `like`'s type.
    ///
    /// # Shapes
    /// - returns `[1, d_in_proj]`
    fn piece_factors(&self, m: [f64; 5], like: &Tensor<B, 2>) -> Tensor<B, 2> {
        let (d_inner, gn) = (self.d_inner, self.ngroups * self.d_state);
        let widths = [d_inner, d_inner, gn, gn, self.nheads];
        let factors: Vec<f32> = widths
            .iter()
            .zip(m)
            .flat_map(|(&w, f)| std::iter::repeat_n(f as f32, w))
            .collect();
        let n = factors.len();
        let t = Tensor::<B, 2>::from_data(TensorData::new(factors, [1, n]), &like.device());
        cast_to(t, like.dtype())
    }

    /// `dt = clamp(softplus(dt + dt_bias), dt_limit)`, in f32 or wider.
    ///
    /// # Shapes
    /// - dt: `[..., h]`; returns the same shape
    fn dt_activation<const D: usize>(&self, dt: Tensor<B, D>) -> Tensor<B, D> {
        let x = upcast(dt) + upcast(self.dt_bias.val()).unsqueeze::<D>();
        let limit = self.dt_limit();
        if limit.is_active() {
            softplus_clamped(x, limit.min, limit.max)
        } else {
            softplus(x)
        }
    }

    /// `A = -exp(A_log)`, `[h]`, in f32 or wider.
    fn a(&self) -> Tensor<B, 1> {
        upcast(self.a_log.val()).exp().neg()
    }

    /// `D` shaped to broadcast over `[.., h, p]`: `[h, 1]` or `[h, p]`.
    fn d_skip(&self) -> Tensor<B, 2> {
        let d = self.d.val();
        if d.dims()[0] == self.nheads {
            d.reshape([self.nheads, 1])
        } else {
            d.reshape([self.nheads, self.headdim])
        }
    }

    /// Gated RMSNorm (or the plain gate), before out_proj.
    ///
    /// # Shapes
    /// - y, z: `[b, l, d_inner]`; returns `[b, l, d_inner]`
    fn gate(&self, y: Tensor<B, 3>, z: Tensor<B, 3>) -> Tensor<B, 3> {
        let y = cast_to(y, z.dtype());
        match &self.norm {
            Some(norm) => norm.forward(y, z),
            None => y * silu(z),
        }
    }
}
