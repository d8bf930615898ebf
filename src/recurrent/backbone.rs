//! The step of a trained backbone in plain `f32` loops over host memory.

use burn::module::Param;
use burn::nn::{Embedding, Linear};
use burn::tensor::{backend::Backend, Tensor};

use crate::error::Mamba2Error;
use crate::layers::activation::softplus_f32;
use crate::layers::backbone::Mamba2Backbone;
use crate::layers::lora::merged;
use crate::layers::mixer::{DtLimit, Mamba2};
use crate::layers::norm::{RmsNorm, RmsNormGated};

use super::simd;

/// Copies a tensor to a host `Vec<f32>`.
///
/// Through a product with 1 (exact): burn-ndarray hands over the storage of a tensor nothing
/// else holds, but copies a shared one (a parameter's value) element by element through its
/// dynamic-rank iterator, about 30 ns an element: 1.4 s for the embedding of a 130m model,
/// where the product takes a few milliseconds.
fn host<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    (t * 1.0)
        .into_data()
        .convert::<f32>()
        .into_vec()
        .expect("f32 data after convert")
}

fn host_param<B: Backend, const D: usize>(p: &Param<Tensor<B, D>>) -> Vec<f32> {
    host(p.val())
}

/// A linear layer on the host: weight `[d_in, d_out]` row-major (Burn's layout), bias
/// `[d_out]`.
#[derive(Clone, Debug)]
pub struct CpuLinear {
    weight: Vec<f32>,
    bias: Option<Vec<f32>>,
    d_in: usize,
    d_out: usize,
}

impl CpuLinear {
    /// Copies a Burn `Linear`.
    pub fn from_linear<B: Backend>(linear: &Linear<B>) -> Self {
        let [d_in, d_out] = linear.weight.val().dims();
        Self {
            weight: host_param(&linear.weight),
            bias: linear.bias.as_ref().map(host_param),
            d_in,
            d_out,
        }
    }

    /// Input width.
    pub fn d_in(&self) -> usize {
        self.d_in
    }

    /// Output width.
    pub fn d_out(&self) -> usize {
        self.d_out
    }

    /// `out = x · W + bias`.
    ///
    /// # Shapes
    /// - x: `[d_in]`, out: `[d_out]`
    pub fn forward(&self, x: &[f32], out: &mut [f32]) {
        debug_assert_eq!(x.len(), self.d_in);
        debug_assert_eq!(out.len(), self.d_out);
        match &self.bias {
            Some(b) => out.copy_from_slice(b),
            None => out.fill(0.0),
        }
        simd::matvec_acc(&self.weight, x, out);
    }
}

/// A token embedding on the host, `[vocab, d_model]` row-major (Burn's layout), which also
/// serves as the tied LM head.
#[derive(Clone, Debug)]
pub struct CpuEmbedding {
    weight: Vec<f32>,
    vocab: usize,
    d_model: usize,
}

impl CpuEmbedding {
    /// Copies a Burn `Embedding`.
    pub fn from_embedding<B: Backend>(embedding: &Embedding<B>) -> Self {
        let [vocab, d_model] = embedding.weight.val().dims();
        Self {
            weight: host_param(&embedding.weight),
            vocab,
            d_model,
        }
    }

    /// Number of rows.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Row width.
    pub fn d_model(&self) -> usize {
        self.d_model
    }

    /// The embedding of `token`, `None` outside `0..vocab`.
    ///
    /// # Shapes
    /// - returns `[d_model]`
    pub fn row(&self, token: usize) -> Option<&[f32]> {
        (token < self.vocab).then(|| &self.weight[token * self.d_model..(token + 1) * self.d_model])
    }

    /// The tied head: `out[v] = E[v, :] · h`.
    ///
    /// # Shapes
    /// - h: `[d_model]`, out: `[vocab]`
    pub fn logits(&self, h: &[f32], out: &mut [f32]) {
        debug_assert_eq!(h.len(), self.d_model);
        debug_assert_eq!(out.len(), self.vocab);
        simd::rows_dot(&self.weight, h, out);
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// An RMSNorm on the host: `x · (mean(x²) + eps)^(-1/2) · weight` over each group of
/// `group_size` channels (the whole width for a plain RMSNorm).
#[derive(Clone, Debug)]
struct CpuRmsNorm {
    weight: Vec<f32>,
    eps: f32,
    group_size: usize,
}

impl CpuRmsNorm {
    fn from_norm<B: Backend>(norm: &RmsNorm<B>) -> Self {
        let weight = host_param(&norm.weight);
        Self {
            group_size: weight.len(),
            weight,
            eps: norm.eps as f32,
        }
    }

    fn from_gated_norm<B: Backend>(norm: &RmsNormGated<B>) -> Self {
        Self {
            weight: host_param(&norm.weight),
            eps: norm.eps as f32,
            group_size: norm.group_size,
        }
    }

    /// # Shapes
    /// - x: `[weight.len()]`, normalised in place
    fn forward_in_place(&self, x: &mut [f32]) {
        let groups = x.chunks_mut(self.group_size);
        for (xg, wg) in groups.zip(self.weight.chunks(self.group_size)) {
            let ms = xg.iter().map(|v| v * v).sum::<f32>() / xg.len() as f32;
            let inv = 1.0 / (ms + self.eps).sqrt();
            for (v, w) in xg.iter_mut().zip(wg) {
                *v = *v * inv * w;
            }
        }
    }
}

/// The mixer's output gate on the host: `y · silu(z)`, with the gated RMSNorm before or after
/// the gate when the mixer has one.
#[derive(Clone, Debug)]
struct CpuGate {
    norm: Option<CpuRmsNorm>,
    /// With a norm: normalise, then gate (else gate, then normalise).
    norm_before_gate: bool,
}

impl CpuGate {
    fn from_mixer<B: Backend>(m: &Mamba2<B>) -> Self {
        Self {
            norm: m.norm.as_ref().map(CpuRmsNorm::from_gated_norm),
            norm_before_gate: m.norm.as_ref().is_some_and(|norm| norm.norm_before_gate),
        }
    }

    /// # Shapes
    /// - y: `[d_inner]` (gated in place), z: `[d_inner]`
    fn forward_in_place(&self, y: &mut [f32], z: &[f32]) {
        let gate = |y: &mut [f32]| {
            for (yv, zv) in y.iter_mut().zip(z) {
                *yv *= silu(*zv);
            }
        };
        match &self.norm {
            None => gate(y),
            Some(norm) if self.norm_before_gate => {
                norm.forward_in_place(y);
                gate(y);
            }
            Some(norm) => {
                gate(y);
                norm.forward_in_place(y);
            }
        }
    }
}

/// The depthwise causal convolution on the host, one column at a time.
#[derive(Clone, Debug)]
struct CpuConv {
    /// `[channels, k]`
    weight: Vec<f32>,
    bias: Option<Vec<f32>>,
    k: usize,
}

impl CpuConv {
    /// Shifts `raw` into each channel's window of the last `k` inputs and writes
    /// `silu(conv(window))`.
    ///
    /// # Shapes
    /// - window: `[channels, k]` (oldest first), raw: `[channels]`, out: `[channels]`
    fn step(&self, window: &mut [f32], raw: &[f32], out: &mut [f32]) {
        let k = self.k;
        for (c, (&x, o)) in raw.iter().zip(out.iter_mut()).enumerate() {
            let taps = &mut window[c * k..(c + 1) * k];
            taps.copy_within(1.., 0);
            taps[k - 1] = x;
            let w = &self.weight[c * k..(c + 1) * k];
            let mut acc = self.bias.as_ref().map_or(0.0, |b| b[c]);
            for (wv, xv) in w.iter().zip(taps.iter()) {
                acc += wv * xv;
            }
            *o = silu(acc);
        }
    }
}

/// The SSM of one mixer on the host: per head, `dt` from its raw value, the decay
/// `exp(dt · A)`, the state update and readout, and the `D` skip.
#[derive(Clone, Debug)]
struct CpuSsm {
    dt_bias: Vec<f32>,
    dt_limit: DtLimit,
    /// `A = -exp(A_log)`, `[h]`
    a: Vec<f32>,
    /// `[h]` or `[h·p]`
    d: Vec<f32>,
    h: usize,
    p: usize,
    n: usize,
    g: usize,
}

impl CpuSsm {
    /// `dt = clamp(softplus(dt_raw + dt_bias))` of head `hi`.
    fn dt(&self, dt_raw: &[f32], hi: usize) -> f32 {
        self.dt_limit
            .clamp_f32(softplus_f32(dt_raw[hi] + self.dt_bias[hi]))
    }

    /// `y += x · D` for head `hi`.
    fn skip(&self, hi: usize, x: &[f32], y: &mut [f32]) {
        if self.d.len() == self.h {
            let d = self.d[hi];
            for (yv, xv) in y.iter_mut().zip(x) {
                *yv += xv * d;
            }
        } else {
            let p = self.p;
            for ((yv, xv), d) in y.iter_mut().zip(x).zip(&self.d[hi * p..(hi + 1) * p]) {
                *yv += xv * d;
            }
        }
    }

    /// One token: updates `ssm` and writes `y` (with the skip); `x_dt` is scratch `[p]`.
    ///
    /// # Shapes
    /// - x: `[h·p]`, b_mat and c_mat: `[g·n]`, dt_raw: `[h]`, ssm: `[h, p, n]`, y: `[h·p]`
    #[allow(clippy::too_many_arguments)]
    fn step(
        &self,
        x: &[f32],
        b_mat: &[f32],
        c_mat: &[f32],
        dt_raw: &[f32],
        ssm: &mut [f32],
        x_dt: &mut [f32],
        y: &mut [f32],
    ) {
        let (p, n) = (self.p, self.n);
        let r = self.h / self.g; // heads per group
        for hi in 0..self.h {
            let dt = self.dt(dt_raw, hi);
            let xh = &x[hi * p..(hi + 1) * p];
            for (t, v) in x_dt.iter_mut().zip(xh) {
                *t = v * dt;
            }
            let group = (hi / r) * n..(hi / r + 1) * n;
            let yh = &mut y[hi * p..(hi + 1) * p];
            simd::ssm_head(
                &mut ssm[hi * p * n..(hi + 1) * p * n],
                (dt * self.a[hi]).exp(),
                x_dt,
                &b_mat[group.clone()],
                &c_mat[group],
                yh,
            );
            self.skip(hi, xh, yh);
        }
    }
}

/// One [`Mamba2`] mixer on the host (see the module documentation).
#[derive(Clone, Debug)]
pub struct CpuMixer {
    in_proj: CpuLinear,
    conv: CpuConv,
    ssm: CpuSsm,
    gate: CpuGate,
    out_proj: CpuLinear,
    d_inner: usize,
}

/// The recurrent state of one sequence in one [`CpuMixer`], with its scratch space.
#[derive(Clone, Debug)]
pub struct CpuMixerState {
    /// The last `k` raw `xBC` columns, `[conv_dim, k]`, oldest first.
    pub conv: Vec<f32>,
    /// `S`, `[h, p, n]`.
    pub ssm: Vec<f32>,
    zxbcdt: Vec<f32>,
    xbc: Vec<f32>,
    x_dt: Vec<f32>,
    y: Vec<f32>,
}

impl CpuMixer {
    /// Copies the weights of a mixer.
    pub fn from_mixer<B: Backend>(m: &Mamba2<B>) -> Self {
        let conv_dim = m.conv_dim();
        Self {
            in_proj: CpuLinear::from_linear(&merged(&m.in_proj, &m.in_proj_lora)),
            conv: CpuConv {
                weight: host(m.conv1d.weight.val().reshape([conv_dim * m.d_conv])),
                bias: m.conv1d.bias.as_ref().map(host_param),
                k: m.d_conv,
            },
            ssm: CpuSsm {
                dt_bias: host_param(&m.dt_bias),
                dt_limit: m.dt_limit(),
                a: host_param(&m.a_log).iter().map(|v| -v.exp()).collect(),
                d: host_param(&m.d),
                h: m.nheads,
                p: m.headdim,
                n: m.d_state,
                g: m.ngroups,
            },
            gate: CpuGate::from_mixer(m),
            out_proj: CpuLinear::from_linear(&merged(&m.out_proj, &m.out_proj_lora)),
            d_inner: m.d_inner,
        }
    }

    fn conv_dim(&self) -> usize {
        self.d_inner + 2 * self.ssm.g * self.ssm.n
    }

    /// The all-zero state of a fresh sequence.
    pub fn zero_state(&self) -> CpuMixerState {
        let ssm = &self.ssm;
        CpuMixerState {
            conv: vec![0.0; self.conv_dim() * self.conv.k],
            ssm: vec![0.0; ssm.h * ssm.p * ssm.n],
            zxbcdt: vec![0.0; self.in_proj.d_out],
            xbc: vec![0.0; self.conv_dim()],
            x_dt: vec![0.0; ssm.p],
            y: vec![0.0; self.d_inner],
        }
    }

    /// Copies a tensor state (batch element `index`, already checked) into a host state.
    fn state_from<B: Backend>(
        &self,
        s: &crate::layers::state::Mamba2State<B>,
        index: usize,
    ) -> CpuMixerState {
        let mut out = self.zero_state();
        out.conv = host(s.conv.clone().narrow(0, index, 1).reshape([out.conv.len()]));
        out.ssm = host(s.ssm.clone().narrow(0, index, 1).reshape([out.ssm.len()]));
        out
    }

    /// One token: `out = mixer(x)`, updating `state`: the input projection to
    /// `[z | xBC | dt]`, the convolution step on `xBC`, the SSM step, the gate, the output
    /// projection.
    ///
    /// # Shapes
    /// - x: `[d_model]`, out: `[d_model]`
    pub fn step(&self, x: &[f32], state: &mut CpuMixerState, out: &mut [f32]) {
        let CpuMixerState {
            conv,
            ssm,
            zxbcdt,
            xbc,
            x_dt,
            y,
        } = state;
        self.in_proj.forward(x, zxbcdt);
        let (z, rest) = zxbcdt.split_at(self.d_inner);
        let (xbc_raw, dt_raw) = rest.split_at(self.conv_dim());
        self.conv.step(conv, xbc_raw, xbc);
        let (xs, bc) = xbc.split_at(self.d_inner);
        let (b_mat, c_mat) = bc.split_at(self.ssm.g * self.ssm.n);
        self.ssm.step(xs, b_mat, c_mat, dt_raw, ssm, x_dt, y);
        self.gate.forward_in_place(y, z);
        self.out_proj.forward(y, out);
    }
}

/// One pre-norm residual block on the host.
#[derive(Clone, Debug)]
struct CpuBlock {
    norm: CpuRmsNorm,
    mixer: CpuMixer,
}

/// A [`Mamba2Backbone`] on the host, for one token of one sequence at a time.
#[derive(Clone, Debug)]
pub struct CpuBackbone {
    layers: Vec<CpuBlock>,
    norm_f: CpuRmsNorm,
    d_model: usize,
}

/// The recurrent state of one sequence in a [`CpuBackbone`], with its scratch space.
#[derive(Clone, Debug)]
pub struct CpuState {
    /// Per-layer states.
    pub layers: Vec<CpuMixerState>,
    normed: Vec<f32>,
    mixed: Vec<f32>,
}

impl CpuBackbone {
    /// Copies the weights of a backbone (of any backend and float type) to `f32` host memory.
    pub fn from_backbone<B: Backend>(backbone: &Mamba2Backbone<B>) -> Self {
        Self {
            layers: backbone
                .layers
                .iter()
                .map(|layer| CpuBlock {
                    norm: CpuRmsNorm::from_norm(&layer.norm),
                    mixer: CpuMixer::from_mixer(&layer.mixer),
                })
                .collect(),
            norm_f: CpuRmsNorm::from_norm(&backbone.norm_f),
            d_model: backbone.d_model(),
        }
    }

    /// Width of the residual stream.
    pub fn d_model(&self) -> usize {
        self.d_model
    }

    /// Checks that a state has one entry per layer.
    fn check_layers(&self, layers: usize) -> crate::error::Result<()> {
        if layers != self.layers.len() {
            return Err(Mamba2Error::Shape {
                name: "state.layers",
                expected: format!("{} layer states", self.layers.len()),
                actual: vec![layers],
            });
        }
        Ok(())
    }

    /// The all-zero state of a fresh sequence.
    pub fn zero_state(&self) -> CpuState {
        CpuState {
            layers: self.layers.iter().map(|l| l.mixer.zero_state()).collect(),
            normed: vec![0.0; self.d_model],
            mixed: vec![0.0; self.d_model],
        }
    }

    /// Copies batch element `index` of a tensor state of `backbone` (for example after a
    /// chunked prefill with [`Mamba2Backbone::forward`]) into a host state.
    pub fn state_from<B: Backend>(
        &self,
        backbone: &Mamba2Backbone<B>,
        state: &crate::layers::state::BackboneState<B>,
        index: usize,
    ) -> crate::error::Result<CpuState> {
        self.check_layers(state.layers.len())?;
        let mut out = self.zero_state();
        for (((s, block), dst), tensor_mixer) in state
            .layers
            .iter()
            .zip(&self.layers)
            .zip(out.layers.iter_mut())
            .zip(&backbone.layers)
        {
            let batch = s.batch_size();
            tensor_mixer.mixer.check_state(s, batch)?;
            if index >= batch {
                return Err(Mamba2Error::InvalidInput {
                    name: "index",
                    reason: format!("batch index {index} out of range for a batch of {batch}"),
                });
            }
            *dst = block.mixer.state_from(s, index);
        }
        Ok(out)
    }

    /// One token through every block and the final norm: `out = backbone(x)`, updating
    /// `state`.
    ///
    /// # Shapes
    /// - x: `[d_model]`, out: `[d_model]`
    pub fn step(
        &self,
        x: &[f32],
        state: &mut CpuState,
        out: &mut [f32],
    ) -> crate::error::Result<()> {
        for (name, len) in [("x", x.len()), ("out", out.len())] {
            if len != self.d_model {
                return Err(Mamba2Error::Shape {
                    name,
                    expected: format!("[d_model = {}]", self.d_model),
                    actual: vec![len],
                });
            }
        }
        self.check_layers(state.layers.len())?;
        // the residual stream lives in `out`
        out.copy_from_slice(x);
        let CpuState {
            layers,
            normed,
            mixed,
        } = state;
        for (block, s) in self.layers.iter().zip(layers.iter_mut()) {
            normed.copy_from_slice(out);
            block.norm.forward_in_place(normed);
            block.mixer.step(normed, s, mixed);
            for (o, m) in out.iter_mut().zip(mixed.iter()) {
                *o += m;
            }
        }
        self.norm_f.forward_in_place(out);
        Ok(())
    }
}
