//! The Mamba-3 layer's configuration: its sizes, their checks, and the reference initialisation.

use burn::config::Config;
use burn::tensor::backend::Backend;

use super::layer::Mamba3;
use crate::error::Mamba2Error;
use crate::init::ParamInit;
use crate::layers::norm::{RmsNormConfig, RmsNormGatedConfig};

/// Configuration of a [`Mamba3`] layer, single-input single-output (SISO) or of rank
/// `mimo_rank` (MIMO), as `mamba_ssm` 2.3's `Mamba3` constructor takes it (the defaults are its
/// own).
#[derive(Config, Debug)]
pub struct Mamba3Config {
    /// Width of the residual stream.
    pub d_model: usize,
    /// State size `n` per head. Default: 128.
    #[config(default = 128)]
    pub d_state: usize,
    /// `d_inner = expand · d_model`. Default: 2.
    #[config(default = 2)]
    pub expand: usize,
    /// Channels per head `p`. Default: 64.
    #[config(default = 64)]
    pub headdim: usize,
    /// B/C groups `g` (heads share them as attention's grouped keys do). Default: 1.
    #[config(default = 1)]
    pub ngroups: usize,
    /// The fraction of the state's dimensions that rotate (0.5 or 1.0). Default: 0.5.
    #[config(default = 0.5)]
    pub rope_fraction: f64,
    /// Smallest initial `Δ` (`dt_bias` init). Default: 1e-3.
    #[config(default = 1e-3)]
    pub dt_min: f64,
    /// Largest initial `Δ`. Default: 0.1.
    #[config(default = 0.1)]
    pub dt_max: f64,
    /// Floor of the initial `Δ`. Default: 1e-4.
    #[config(default = 1e-4)]
    pub dt_init_floor: f64,
    /// `A ≤ −a_floor` (`A_floor`). Default: 1e-4.
    #[config(default = 1e-4)]
    pub a_floor: f64,
    /// An RMSNorm per head (and rank) before the gate (`is_outproj_norm`). Default: false.
    #[config(default = false)]
    pub is_outproj_norm: bool,
    /// Multiple inputs and outputs: rank-`mimo_rank` state updates (`is_mimo`). Default: false.
    #[config(default = false)]
    pub is_mimo: bool,
    /// The rank `r` of a MIMO layer (1 for SISO, whatever this says). Default: 4.
    #[config(default = 4)]
    pub mimo_rank: usize,
    /// Tokens per chunk of the scan (results do not depend on it). Default: 64.
    #[config(default = 64)]
    pub chunk_size: usize,
}

/// `eps` of the B/C norms and of the output norm (`mamba_ssm`'s `Mamba3`).
pub(crate) const NORM_EPS: f64 = 1e-5;

impl Mamba3Config {
    /// `expand · d_model`.
    pub fn d_inner(&self) -> usize {
        self.expand * self.d_model
    }

    /// Heads `h = d_inner / headdim`.
    pub fn nheads(&self) -> usize {
        self.d_inner() / self.headdim.max(1)
    }

    /// Rotary angles per token `s`: half the rotated dimensions, `⌊n · rope_fraction⌋` rounded
    /// down to even.
    pub fn num_rope_angles(&self) -> usize {
        let rotated = (self.d_state as f64 * self.rope_fraction) as usize;
        (rotated - rotated % 2) / 2
    }

    /// The rank `r`: `mimo_rank` for MIMO, 1 for SISO.
    pub fn rank(&self) -> usize {
        if self.is_mimo {
            self.mimo_rank
        } else {
            1
        }
    }

    /// in_proj's width: `[z, x, B, C, dd_dt, dd_A, trap, angles]`, `B` and `C` of `r·g·n`.
    pub fn d_in_proj(&self) -> usize {
        let (d_inner, h) = (self.d_inner(), self.nheads());
        let bc = self.rank() * self.ngroups * self.d_state;
        2 * d_inner + 2 * bc + 3 * h + self.num_rope_angles()
    }

    /// The number of parameters [`init`](Self::init) creates, in `f64` (no overflow for sizes
    /// read from a corrupt file).
    pub fn param_count(&self) -> f64 {
        let f = |v: usize| v as f64;
        let (d, d_inner, h) = (f(self.d_model), f(self.d_inner()), f(self.nheads()));
        let (n, p, r) = (f(self.d_state), f(self.headdim), f(self.rank()));
        let projections = d * f(self.d_in_proj()) + d_inner * d;
        // dt_bias and D, the B/C biases, the B/C norms
        let small = 2.0 * h + 2.0 * h * r * n + 2.0 * n;
        let norm = if self.is_outproj_norm { d_inner } else { 0.0 };
        let mimo = if self.is_mimo { 3.0 * h * r * p } else { 0.0 };
        projections + small + norm + mimo
    }

    /// Checks every size and setting, naming the field at fault.
    pub fn validate(&self) -> crate::error::Result<()> {
        let bad =
            |field: &'static str, reason: String| Err(Mamba2Error::InvalidConfig { field, reason });
        for (field, value) in [
            ("d_model", self.d_model),
            ("d_state", self.d_state),
            ("expand", self.expand),
            ("headdim", self.headdim),
            ("ngroups", self.ngroups),
            ("chunk_size", self.chunk_size),
        ] {
            if value == 0 {
                return bad(field, "must be at least 1".into());
            }
        }
        if !self.d_inner().is_multiple_of(self.headdim) {
            return bad(
                "headdim",
                format!(
                    "{} does not divide d_inner = {}",
                    self.headdim,
                    self.d_inner()
                ),
            );
        }
        if !self.nheads().is_multiple_of(self.ngroups) {
            return bad(
                "ngroups",
                format!(
                    "{} does not divide the {} heads",
                    self.ngroups,
                    self.nheads()
                ),
            );
        }
        if self.rope_fraction != 0.5 && self.rope_fraction != 1.0 {
            return bad(
                "rope_fraction",
                format!("must be 0.5 or 1.0, not {}", self.rope_fraction),
            );
        }
        if self.is_mimo && self.mimo_rank == 0 {
            return bad("mimo_rank", "must be at least 1".into());
        }
        if self.is_mimo && !self.d_state.is_multiple_of(2) {
            return bad(
                "d_state",
                format!(
                    "MIMO rotates the halves of the state, and {} is odd",
                    self.d_state
                ),
            );
        }
        if !(self.dt_min > 0.0 && self.dt_min <= self.dt_max) {
            return bad(
                "dt_min",
                format!(
                    "must be positive and at most dt_max ({} and {})",
                    self.dt_min, self.dt_max
                ),
            );
        }
        if !(self.dt_init_floor >= 0.0) {
            return bad("dt_init_floor", "must not be negative".into());
        }
        if !(self.a_floor >= 0.0) {
            return bad("a_floor", "must not be negative".into());
        }
        Ok(())
    }

    /// Builds the layer, initialised as `mamba_ssm` does: in_proj and out_proj (no biases)
    /// `U(±1/√fan_in)`, `dt_bias = softplus⁻¹(Δ)` with `Δ` log-uniform in `[dt_min, dt_max]`
    /// (floored at `dt_init_floor`), the B/C biases, the norms' weights and `D` all 1; for MIMO,
    /// `mimo_x` and `mimo_o` `1/r`, `mimo_z` 1.
    ///
    /// Seed the backend (`B::seed`) for reproducible weights.
    pub fn init<B: Backend>(&self, device: &B::Device) -> crate::error::Result<Mamba3<B>> {
        self.build(&ParamInit::now(device), 1.0)
    }

    /// [`init`](Self::init) with parameters made by `init`, out_proj's weight multiplied by
    /// `out_proj_scale` (a language model's `1/√n_layer`, as `mamba_ssm` rescales it).
    pub(crate) fn build<B: Backend>(
        &self,
        init: &ParamInit<B>,
        out_proj_scale: f64,
    ) -> crate::error::Result<Mamba3<B>> {
        self.validate()?;
        let (d_inner, h, n, p, r) = (
            self.d_inner(),
            self.nheads(),
            self.d_state,
            self.headdim,
            self.rank(),
        );

        let dt_bias = init.dt_bias(h, self.dt_min, self.dt_max, self.dt_init_floor);
        let norm = |width| RmsNormConfig::new(width).with_eps(NORM_EPS).build(init);

        Ok(Mamba3 {
            in_proj: init.linear(self.d_model, self.d_in_proj(), false, 1.0),
            dt_bias,
            b_bias: init.full([h, r, n], 1.0),
            c_bias: init.full([h, r, n], 1.0),
            b_norm: norm(n),
            c_norm: norm(n),
            d: init.full([h], 1.0),
            norm: self.is_outproj_norm.then(|| {
                RmsNormGatedConfig::new(d_inner, self.headdim)
                    .with_eps(NORM_EPS)
                    .with_norm_before_gate(true)
                    .build(init)
            }),
            out_proj: init.linear(d_inner, self.d_model, false, out_proj_scale),
            mimo_x: self.is_mimo.then(|| init.full([h, r, p], 1.0 / r as f64)),
            mimo_z: self.is_mimo.then(|| init.full([h, r, p], 1.0)),
            mimo_o: self.is_mimo.then(|| init.full([h, r, p], 1.0 / r as f64)),
            d_model: self.d_model,
            d_state: n,
            headdim: self.headdim,
            nheads: h,
            ngroups: self.ngroups,
            num_rope_angles: self.num_rope_angles(),
            a_floor: self.a_floor,
            chunk_size: self.chunk_size,
        })
    }
}
