//! The Mamba-3 scan's inputs, their checks, and its state.

use burn::tensor::{backend::Backend, Tensor};

use crate::error::{check_shape, Mamba2Error};

/// The state of the Mamba-3 scan after a token: what the next token's step needs (the
/// layout of `mamba_ssm`'s decode cache).
#[derive(Clone, Debug)]
pub struct TrapezoidalState<B: Backend> {
    /// The rotary angles `θ` reached, `[b, h, s]` (reduced modulo 2π).
    pub angle: Tensor<B, 3>,
    /// The state `h`, `[b, h, p, n]`.
    pub ssm: Tensor<B, 4>,
    /// The last token's keys, biased and rotated, `[b, r, h, n]`.
    pub k: Tensor<B, 4>,
    /// The last token's input `x` (before `mimo_x`), `[b, h, p]`.
    pub v: Tensor<B, 3>,
}

impl<B: Backend> TrapezoidalState<B> {
    /// The state of a fresh sequence (all zeros), in `f32`.
    ///
    /// # Shapes
    /// - `[b, h, s]`, `[b, h, p, n]`, `[b, r, h, n]`, `[b, h, p]` for `[b, r, h, p, n, s]`
    pub fn zeros(dims: [usize; 6], device: &B::Device) -> Self {
        let [b, r, h, p, n, s] = dims;
        let f32 = (device, burn::tensor::DType::F32);
        Self {
            angle: Tensor::zeros([b, h, s], f32),
            ssm: Tensor::zeros([b, h, p, n], f32),
            k: Tensor::zeros([b, r, h, n], f32),
            v: Tensor::zeros([b, h, p], f32),
        }
    }

    /// Cuts the autodiff graph (truncated backpropagation through time).
    pub fn detach(self) -> Self {
        Self {
            angle: self.angle.detach(),
            ssm: self.ssm.detach(),
            k: self.k.detach(),
            v: self.v.detach(),
        }
    }
}

/// The rank-`R` part of a MIMO scan (`mamba_ssm`'s `is_mimo`): the per-rank projections of `x`,
/// of the gate and of the output, and the norm of each rank's output before its gate.
#[derive(Clone, Debug)]
pub struct Mimo<B: Backend> {
    /// `mimo_x`, `[h, r, p]`: `v_{t,r} = x_t ⊙ mimo_x_r`.
    pub x: Tensor<B, 3>,
    /// `mimo_z`, `[h, r, p]`: each rank's gate `z_t ⊙ mimo_z_r`.
    pub z: Tensor<B, 3>,
    /// `mimo_o`, `[h, r, p]`: the output `Σ_r mimo_o_r ⊙ (gated y_{t,r})`.
    pub out: Tensor<B, 3>,
    /// The RMSNorm of each rank's and head's output over `p` before the gate: its weight
    /// `[h, p]` and `eps` (none: no norm).
    pub norm: Option<(Tensor<B, 2>, f64)>,
}

/// The inputs of [`trapezoidal_scan`](super::trapezoidal_scan) and
/// [`trapezoidal_step`](super::trapezoidal_step).
#[derive(Clone, Debug)]
pub struct TrapezoidalInput<B: Backend> {
    /// `C` after its norm, before its bias, `[b, l, r·g, n]`, rank-major (`mamba_ssm`'s
    /// `[b, l, r, g, n]` flattened; head `i` reads group `i / (h / g)`).
    pub q: Tensor<B, 4>,
    /// `B` after its norm, before its bias, `[b, l, r·g, n]`.
    pub k: Tensor<B, 4>,
    /// `x`, `[b, l, h, p]`.
    pub v: Tensor<B, 4>,
    /// `A_t · Δ_t` (≤ 0), `[b, l, h]`.
    pub adt: Tensor<B, 3>,
    /// `Δ_t`, `[b, l, h]`.
    pub dt: Tensor<B, 3>,
    /// `λ_t` before its sigmoid, `[b, l, h]`.
    pub trap: Tensor<B, 3>,
    /// `C_bias`, `[h, r, n]`.
    pub q_bias: Tensor<B, 3>,
    /// `B_bias`, `[h, r, n]`.
    pub k_bias: Tensor<B, 3>,
    /// The angle inputs before their tanh, `[b, l, h, s]` (`2s ≤ n`).
    pub angles: Tensor<B, 4>,
    /// The skip `D`, `[h]` (none: 0).
    pub d: Option<Tensor<B, 1>>,
    /// The gate `z` of `silu(z)`, `[b, l, h, p]` (none: no gate).
    pub z: Option<Tensor<B, 4>>,
    /// The rank-`R` projections (none: SISO, rank 1).
    pub mimo: Option<Mimo<B>>,
    /// Tokens per chunk (results do not depend on it).
    pub chunk_size: usize,
    /// The state before the first token (none: a fresh sequence).
    pub initial: Option<TrapezoidalState<B>>,
}

impl<B: Backend> TrapezoidalInput<B> {
    /// The rank `r`: `mimo_x`'s, 1 without MIMO.
    pub fn rank(&self) -> usize {
        self.mimo.as_ref().map_or(1, |m| m.x.dims()[1])
    }

    /// Checks every shape against `v`'s `[b, l, h, p]`, the rank, `q`'s `[.., r·g, n]` and
    /// `angles`' `s`.
    pub(super) fn check(&self) -> crate::error::Result<()> {
        let [b, l, h, p] = self.v.dims();
        let r = self.rank();
        let [_, _, rg, n] = self.q.dims();
        let s = self.angles.dims()[3];
        let invalid =
            |name: &'static str, reason: String| Err(Mamba2Error::InvalidInput { name, reason });
        if r == 0 || rg == 0 || !rg.is_multiple_of(r) || !h.is_multiple_of(rg / r) {
            return invalid(
                "q",
                format!(
                    "{rg} B/C heads are not rank {r} times a number of groups dividing {h} heads"
                ),
            );
        }
        let (b, l, h, p, r, rg, n, s) = (
            Some(b),
            Some(l),
            Some(h),
            Some(p),
            Some(r),
            Some(rg),
            Some(n),
            Some(s),
        );
        check_shape("q", &self.q.dims(), &[b, l, rg, n], "b, l, r·g, n")?;
        check_shape("k", &self.k.dims(), &[b, l, rg, n], "b, l, r·g, n")?;
        for (name, t) in [("adt", &self.adt), ("dt", &self.dt), ("trap", &self.trap)] {
            check_shape(name, &t.dims(), &[b, l, h], "b, l, h")?;
        }
        check_shape("q_bias", &self.q_bias.dims(), &[h, r, n], "h, r, n")?;
        check_shape("k_bias", &self.k_bias.dims(), &[h, r, n], "h, r, n")?;
        check_shape("angles", &self.angles.dims(), &[b, l, h, s], "b, l, h, s")?;
        if let Some(d) = &self.d {
            check_shape("d", &d.dims(), &[h], "h")?;
        }
        if let Some(z) = &self.z {
            check_shape("z", &z.dims(), &[b, l, h, p], "b, l, h, p")?;
        }
        if let Some(mimo) = &self.mimo {
            check_shape("mimo.x", &mimo.x.dims(), &[h, r, p], "h, r, p")?;
            check_shape("mimo.z", &mimo.z.dims(), &[h, r, p], "h, r, p")?;
            check_shape("mimo.out", &mimo.out.dims(), &[h, r, p], "h, r, p")?;
            if let Some((weight, _)) = &mimo.norm {
                check_shape("mimo.norm", &weight.dims(), &[h, p], "h, p")?;
            }
        }
        if let Some(init) = &self.initial {
            check_shape("initial.angle", &init.angle.dims(), &[b, h, s], "b, h, s")?;
            check_shape("initial.ssm", &init.ssm.dims(), &[b, h, p, n], "b, h, p, n")?;
            check_shape("initial.k", &init.k.dims(), &[b, r, h, n], "b, r, h, n")?;
            check_shape("initial.v", &init.v.dims(), &[b, h, p], "b, h, p")?;
        }
        let (n, s, l) = (n.unwrap(), s.unwrap(), l.unwrap());
        if 2 * s > n {
            return invalid(
                "angles",
                format!("{s} angles rotate {} dimensions of {n}", 2 * s),
            );
        }
        if self.mimo.is_some() && !n.is_multiple_of(2) {
            return invalid(
                "q",
                format!("MIMO rotates the halves of n, and n = {n} is odd"),
            );
        }
        if l == 0 || self.chunk_size == 0 {
            return invalid(
                if l == 0 { "v" } else { "chunk_size" },
                "must be at least 1".into(),
            );
        }
        Ok(())
    }
}
