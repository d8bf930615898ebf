//! The Mamba-3 layer (SISO or MIMO): its parameters, its forward over a sequence (the trapezoidal
//! scan's chunked form) and its recurrent step (the scan's recurrence, one token at a time).

use burn::module::{Content, DisplaySettings, Module, ModuleDisplay, Param};
use burn::nn::Linear;
use burn::tensor::{backend::Backend, Tensor};

use crate::error::{check_shape, Mamba2Error};
use crate::layers::activation::{heavy_tail, softplus};
use crate::layers::norm::{RmsNorm, RmsNormGated};
use crate::precision::upcast;
use crate::ssd::{trapezoidal_scan, trapezoidal_step, Mimo, TrapezoidalInput, TrapezoidalState};

/// The Mamba-3 layer (Lahoti et al. 2026; `mamba_ssm` 2.3's `Mamba3`), single-input
/// single-output or of rank `r` (MIMO): in_proj's eight slices `[z, x, B, C, dd_dt, dd_A,
/// trap, angles]`, RMS-normed `B` and `C` (`r` of each a token for MIMO) with per-head biases,
/// rotated by data-dependent angles, a data-dependent `A = min(−heavy_tail(dd_A), −A_floor)`,
/// `Δ = softplus(dd_dt + dt_bias)`, the exponential-trapezoidal scan ([`trapezoidal_scan`]),
/// then `silu(z)` (or a per-head RMSNorm before that gate), for MIMO each rank's through
/// `mimo_x`, `mimo_z` and `mimo_o`, and out_proj. No convolution, no bias on either projection.
///
/// Parameter names follow `mamba_ssm`'s state dict (`b_bias` for `B_bias`, `b_norm` for
/// `B_norm`, `d` for `D`); `Linear` weights are stored `[in, out]`, as Burn does.
#[derive(Module, Debug)]
#[module(custom_display)]
pub struct Mamba3<B: Backend> {
    /// `d_model → [z | x | B | C | dd_dt | dd_A | trap | angles]`.
    pub in_proj: Linear<B>,
    /// Added to `dd_dt` before the softplus, `[h]`.
    pub dt_bias: Param<Tensor<B, 1>>,
    /// Added to the normed `B` of each head and rank, `[h, r, n]`.
    pub b_bias: Param<Tensor<B, 3>>,
    /// Added to the normed `C` of each head and rank, `[h, r, n]`.
    pub c_bias: Param<Tensor<B, 3>>,
    /// RMSNorm of `B` over the state dimension, weight `[n]`.
    pub b_norm: RmsNorm<B>,
    /// RMSNorm of `C` over the state dimension, weight `[n]`.
    pub c_norm: RmsNorm<B>,
    /// Skip connection, `[h]`.
    pub d: Param<Tensor<B, 1>>,
    /// RMSNorm per head (and rank) before the gate, weight `[d_inner]` (with
    /// `is_outproj_norm`).
    pub norm: Option<RmsNormGated<B>>,
    /// `d_inner → d_model`.
    pub out_proj: Linear<B>,
    /// MIMO: each rank's input `x ⊙ mimo_x_r`, `[h, r, p]`.
    pub mimo_x: Option<Param<Tensor<B, 3>>>,
    /// MIMO: each rank's gate `z ⊙ mimo_z_r`, `[h, r, p]`.
    pub mimo_z: Option<Param<Tensor<B, 3>>>,
    /// MIMO: the output `Σ_r mimo_o_r ⊙ (gated y_r)`, `[h, r, p]`.
    pub mimo_o: Option<Param<Tensor<B, 3>>>,
    pub(crate) d_model: usize,
    pub(crate) d_state: usize,
    pub(crate) headdim: usize,
    pub(crate) nheads: usize,
    pub(crate) ngroups: usize,
    pub(crate) num_rope_angles: usize,
    pub(crate) a_floor: f64,
    pub(crate) chunk_size: usize,
}

/// What in_proj gives for a sequence, ready for the scan.
///
/// # Shapes
/// - z, x: `[b, l, h, p]`; b, c: `[b, l, g, n]` (normed, before their biases);
///   adt, dt, trap: `[b, l, h]`; angles: `[b, l, h, s]` (every head the token's)
struct Projected<B: Backend> {
    z: Tensor<B, 4>,
    x: Tensor<B, 4>,
    b: Tensor<B, 4>,
    c: Tensor<B, 4>,
    adt: Tensor<B, 3>,
    dt: Tensor<B, 3>,
    trap: Tensor<B, 3>,
    angles: Tensor<B, 4>,
}

impl<B: Backend> Mamba3<B> {
    /// Width of the residual stream.
    pub fn d_model(&self) -> usize {
        self.d_model
    }

    /// Heads `h`.
    pub fn nheads(&self) -> usize {
        self.nheads
    }

    /// The rank `r` (1: SISO): the B/C biases' middle axis.
    pub fn rank(&self) -> usize {
        let [_, r, _] = self.b_bias.shape().dims();
        r
    }

    /// Rotary angles per token `s`.
    pub fn num_rope_angles(&self) -> usize {
        self.num_rope_angles
    }

    /// Tokens per chunk of the scan.
    pub fn chunk_size(&self) -> usize {
        self.chunk_size
    }

    /// Sets the tokens per chunk of the scan (results do not depend on it).
    pub fn set_chunk_size(&mut self, chunk_size: usize) -> crate::error::Result<()> {
        if chunk_size == 0 {
            return Err(Mamba2Error::config("chunk_size", "must be at least 1"));
        }
        self.chunk_size = chunk_size;
        Ok(())
    }

    /// The state of a fresh sequence (all zeros).
    pub fn zero_state(&self, batch: usize, device: &B::Device) -> TrapezoidalState<B> {
        TrapezoidalState::zeros(
            [
                batch,
                self.rank(),
                self.nheads,
                self.headdim,
                self.d_state,
                self.num_rope_angles,
            ],
            device,
        )
    }

    /// Checks `state` against this layer for a batch of `batch`.
    pub fn check_state(
        &self,
        state: &TrapezoidalState<B>,
        batch: usize,
    ) -> crate::error::Result<()> {
        let (b, r, h, p, n, s) = (
            Some(batch),
            Some(self.rank()),
            Some(self.nheads),
            Some(self.headdim),
            Some(self.d_state),
            Some(self.num_rope_angles),
        );
        check_shape("state.angle", &state.angle.dims(), &[b, h, s], "b, h, s")?;
        check_shape("state.ssm", &state.ssm.dims(), &[b, h, p, n], "b, h, p, n")?;
        check_shape("state.k", &state.k.dims(), &[b, r, h, n], "b, r, h, n")?;
        check_shape("state.v", &state.v.dims(), &[b, h, p], "b, h, p")
    }

    /// Runs the layer over a sequence, continuing from `state` (a fresh sequence when `None`),
    /// and returns the output and the state after the last token. Any length works, and
    /// splitting a sequence into pieces gives the same result as running it whole.
    ///
    /// # Shapes
    /// - x: `[b, l, d_model]`, `l ≥ 1`
    /// - state: angle `[b, h, s]`, ssm `[b, h, p, n]`, k `[b, r, h, n]`, v `[b, h, p]`
    /// - returns `[b, l, d_model]` and the new state
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        state: Option<TrapezoidalState<B>>,
    ) -> crate::error::Result<(Tensor<B, 3>, TrapezoidalState<B>)> {
        check_shape(
            "x",
            &x.dims(),
            &[None, None, Some(self.d_model)],
            "b, l, d_model",
        )?;
        let [b, l, _] = x.dims();
        if l == 0 {
            return Err(Mamba2Error::InvalidInput {
                name: "x",
                reason: "the sequence is empty (l = 0)".into(),
            });
        }
        if let Some(state) = &state {
            self.check_state(state, b)?;
        }
        let projected = self.project(x);
        let z = projected.z.clone();
        let (y, state) = trapezoidal_scan(self.scan_input(projected, state))?;
        Ok((self.output(y, z), state))
    }

    /// One token through the layer's recurrence (constant time and memory in the sequence's
    /// length): the output and the state after it, equal to [`forward`](Self::forward) over the
    /// sequence token by token.
    ///
    /// # Shapes
    /// - x: `[b, d_model]`
    /// - state: as in [`forward`](Self::forward)
    /// - returns `[b, d_model]` and the new state
    pub fn step(
        &self,
        x: Tensor<B, 2>,
        state: TrapezoidalState<B>,
    ) -> crate::error::Result<(Tensor<B, 2>, TrapezoidalState<B>)> {
        check_shape("x", &x.dims(), &[None, Some(self.d_model)], "b, d_model")?;
        let b = x.dims()[0];
        self.check_state(&state, b)?;
        let projected = self.project(x.unsqueeze_dim(1));
        let z = projected.z.clone();
        let (y, state) = trapezoidal_step(self.scan_input(projected, Some(state)))?;
        Ok((self.output(y, z).reshape([b, self.d_model]), state))
    }

    /// in_proj and its slices: `B` and `C` normed, `Δ = softplus(dd_dt + dt_bias)`,
    /// `A·Δ` with `A = min(−heavy_tail(dd_A), −A_floor)`, the angles given to every head. `Δ`,
    /// `A` and the angles are computed in `f32` or wider, as `mamba_ssm` does for a
    /// half-precision model.
    ///
    /// # Shapes
    /// - x: `[b, l, d_model]`
    fn project(&self, x: Tensor<B, 3>) -> Projected<B> {
        let [b, l, _] = x.dims();
        let (h, p, rg, n, s) = (
            self.nheads,
            self.headdim,
            self.rank() * self.ngroups,
            self.d_state,
            self.num_rope_angles,
        );
        let zx = self.in_proj.forward(x);
        let mut start = 0;
        let mut slice = |width: usize| {
            let piece = zx.clone().narrow(2, start, width);
            start += width;
            piece
        };
        let (z, x) = (slice(h * p), slice(h * p));
        let (b_in, c_in) = (slice(rg * n), slice(rg * n));
        let (dd_dt, dd_a, trap, angles) = (slice(h), slice(h), slice(h), slice(s));

        let dt = softplus(upcast(dd_dt) + upcast(self.dt_bias.val()).reshape([1, 1, h]));
        let a = heavy_tail(upcast(dd_a)).neg().clamp_max(-self.a_floor);
        Projected {
            z: z.reshape([b, l, h, p]),
            x: x.reshape([b, l, h, p]),
            b: self.b_norm.forward(b_in.reshape([b, l, rg, n])),
            c: self.c_norm.forward(c_in.reshape([b, l, rg, n])),
            adt: a * dt.clone(),
            dt,
            trap: upcast(trap),
            angles: upcast(angles).unsqueeze_dim::<4>(2).expand([b, l, h, s]),
        }
    }

    /// The scan's inputs: the gate goes into the scan unless the output norm comes before it
    /// (SISO); for MIMO, the gate, the norm and the ranks' projections all go in.
    fn scan_input(
        &self,
        projected: Projected<B>,
        initial: Option<TrapezoidalState<B>>,
    ) -> TrapezoidalInput<B> {
        let mimo = match (&self.mimo_x, &self.mimo_z, &self.mimo_o) {
            (Some(x), Some(z), Some(out)) => Some(Mimo {
                x: x.val(),
                z: z.val(),
                out: out.val(),
                norm: self.norm.as_ref().map(|norm| {
                    (
                        norm.weight.val().reshape([self.nheads, self.headdim]),
                        norm.eps,
                    )
                }),
            }),
            _ => None,
        };
        // SISO with the output norm: the norm and the gate come after the scan (`output`)
        let gate_after_norm = mimo.is_none() && self.norm.is_some();
        TrapezoidalInput {
            q: projected.c,
            k: projected.b,
            v: projected.x,
            adt: projected.adt,
            dt: projected.dt,
            trap: projected.trap,
            q_bias: self.c_bias.val(),
            k_bias: self.b_bias.val(),
            angles: projected.angles,
            d: Some(self.d.val()),
            z: (!gate_after_norm).then_some(projected.z),
            mimo,
            chunk_size: self.chunk_size,
            initial,
        }
    }

    /// The scan's output through the output norm and gate where the scan has not applied them
    /// (SISO with `is_outproj_norm`), then out_proj.
    ///
    /// # Shapes
    /// - y, z: `[b, l, h, p]`; returns `[b, l, d_model]`
    fn output(&self, y: Tensor<B, 4>, z: Tensor<B, 4>) -> Tensor<B, 3> {
        let [b, l, h, p] = y.dims();
        let y = y.reshape([b, l, h * p]);
        let y = match (&self.norm, &self.mimo_x) {
            (Some(norm), None) => norm.forward(y, z.reshape([b, l, h * p])),
            _ => y,
        };
        self.out_proj.forward(y)
    }
}

impl<B: Backend> ModuleDisplay for Mamba3<B> {
    fn custom_settings(&self) -> Option<DisplaySettings> {
        crate::layers::norm::inline_display()
    }

    fn custom_content(&self, content: Content) -> Option<Content> {
        content
            .add("d_model", &self.d_model)
            .add("d_state", &self.d_state)
            .add("nheads", &self.nheads)
            .add("headdim", &self.headdim)
            .add("ngroups", &self.ngroups)
            .add("rank", &self.rank())
            .add("num_rope_angles", &self.num_rope_angles)
            .add("outproj_norm", &self.norm.is_some())
            .optional()
    }
}
