//! A dedicated CPU path for the recurrent step: one token of one sequence through the whole
//! backbone in plain `f32` loops over host memory, with no tensor dispatch and no allocation
//! per token.
//!
//! It computes exactly what [`Mamba2::step`](crate::Mamba2::step) and
//! [`Mamba2Backbone::step`](crate::Mamba2Backbone::step) compute (the tests check it against
//! them and against the chunked forward), for models of any backend: the weights are copied to
//! `f32` host vectors once, by [`CpuBackbone::from_backbone`]. Use it to score a live stream
//! tick by tick or to decode on a CPU; train and prefill with the tensor modules.
//!
//! Dimension letters as in [`ssd`](crate::ssd): `h` heads, `p` head dimension, `n` state size,
//! `g` groups, `k` convolution width.
//!
//! On x86-64 the matrix-vector products and the state update run in a version compiled for
//! AVX2 + FMA when the processor has them (checked once, at run time), and in portable code
//! otherwise.

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::{backend::Backend, Tensor};

use crate::activation::softplus_f32;
use crate::backbone::Mamba2Backbone;
use crate::error::Mamba2Error;
use crate::mixer::{DtLimit, Mamba2};
use crate::norm::RmsNorm;

/// Copies a tensor to a host `Vec<f32>`.
fn host<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .to_vec()
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
        kernels::matvec_acc(&self.weight, x, out);
    }
}

/// Row-wise kernels, with an AVX2 + FMA build chosen at run time on x86-64.
mod kernels {
    /// `out += x · W` for `W` `[x.len(), out.len()]` row-major: one axpy per input.
    #[inline(always)]
    fn matvec_acc_body<const FMA: bool>(w: &[f32], x: &[f32], out: &mut [f32]) {
        let n = out.len();
        for (i, &xi) in x.iter().enumerate() {
            let row = &w[i * n..(i + 1) * n];
            for (o, &wv) in out.iter_mut().zip(row) {
                *o = if FMA {
                    wv.mul_add(xi, *o)
                } else {
                    wv * xi + *o
                };
            }
        }
    }

    /// One head's state update and readout:
    /// `S[p, n] = decay·S[p, n] + x̃[p]·B[n]`, `y[p] = Σ_n S[p, n]·C[n]`.
    #[inline(always)]
    fn ssm_head_body<const FMA: bool>(
        state: &mut [f32],
        decay: f32,
        x_dt: &[f32],
        b: &[f32],
        c: &[f32],
        y: &mut [f32],
    ) {
        let n = b.len();
        for (pi, (&xv, yv)) in x_dt.iter().zip(y.iter_mut()).enumerate() {
            let row = &mut state[pi * n..(pi + 1) * n];
            for (s, &bv) in row.iter_mut().zip(b) {
                *s = if FMA {
                    bv.mul_add(xv, decay * *s)
                } else {
                    decay * *s + xv * bv
                };
            }
            // eight partial sums so that the reduction vectorises
            let mut acc = [0.0f32; 8];
            let mut chunks = row.chunks_exact(8);
            let mut cc = c.chunks_exact(8);
            for (sv, cv) in (&mut chunks).zip(&mut cc) {
                for j in 0..8 {
                    acc[j] = if FMA {
                        sv[j].mul_add(cv[j], acc[j])
                    } else {
                        sv[j] * cv[j] + acc[j]
                    };
                }
            }
            let mut total: f32 = acc.iter().sum();
            for (sv, cv) in chunks.remainder().iter().zip(cc.remainder()) {
                total += sv * cv;
            }
            *yv = total;
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn matvec_acc_avx2(w: &[f32], x: &[f32], out: &mut [f32]) {
        matvec_acc_body::<true>(w, x, out)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn ssm_head_avx2(
        state: &mut [f32],
        decay: f32,
        x_dt: &[f32],
        b: &[f32],
        c: &[f32],
        y: &mut [f32],
    ) {
        ssm_head_body::<true>(state, decay, x_dt, b, c, y)
    }

    #[cfg(target_arch = "x86_64")]
    fn has_avx2_fma() -> bool {
        use std::sync::OnceLock;
        static DETECTED: OnceLock<bool> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
        })
    }

    /// `out += x · W`.
    pub fn matvec_acc(w: &[f32], x: &[f32], out: &mut [f32]) {
        assert_eq!(w.len(), x.len() * out.len(), "weight size");
        #[cfg(target_arch = "x86_64")]
        if has_avx2_fma() {
            // SAFETY: the processor supports AVX2 and FMA (checked above).
            return unsafe { matvec_acc_avx2(w, x, out) };
        }
        matvec_acc_body::<false>(w, x, out)
    }

    /// See `ssm_head_body`.
    pub fn ssm_head(
        state: &mut [f32],
        decay: f32,
        x_dt: &[f32],
        b: &[f32],
        c: &[f32],
        y: &mut [f32],
    ) {
        assert_eq!(state.len(), x_dt.len() * b.len(), "state size");
        #[cfg(target_arch = "x86_64")]
        if has_avx2_fma() {
            // SAFETY: the processor supports AVX2 and FMA (checked above).
            return unsafe { ssm_head_avx2(state, decay, x_dt, b, c, y) };
        }
        ssm_head_body::<false>(state, decay, x_dt, b, c, y)
    }
}

/// `x · (mean(x²) + eps)^(-1/2) · w`, in place.
fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ms + eps).sqrt();
    for (v, w) in x.iter_mut().zip(weight) {
        *v = *v * inv * w;
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// One [`Mamba2`] mixer on the host (see the module documentation).
#[derive(Clone, Debug)]
pub struct CpuMixer {
    in_proj: CpuLinear,
    /// `[conv_dim, k]`
    conv_weight: Vec<f32>,
    conv_bias: Option<Vec<f32>>,
    dt_bias: Vec<f32>,
    /// `A = -exp(A_log)`, `[h]`
    a: Vec<f32>,
    /// `[h]` or `[h·p]`
    d: Vec<f32>,
    /// gated norm weight `[d_inner]`, group size, eps, norm before gate
    norm: Option<(Vec<f32>, usize, f32, bool)>,
    out_proj: CpuLinear,
    d_inner: usize,
    h: usize,
    p: usize,
    n: usize,
    g: usize,
    k: usize,
    dt_limit: DtLimit,
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
            in_proj: CpuLinear::from_linear(&m.in_proj),
            conv_weight: host(m.conv1d.weight.val().reshape([conv_dim * m.d_conv])),
            conv_bias: m.conv1d.bias.as_ref().map(host_param),
            dt_bias: host_param(&m.dt_bias),
            a: host_param(&m.a_log).iter().map(|v| -v.exp()).collect(),
            d: host_param(&m.d),
            norm: m.norm.as_ref().map(|norm| {
                (
                    host_param(&norm.weight),
                    norm.group_size,
                    norm.eps as f32,
                    norm.norm_before_gate,
                )
            }),
            out_proj: CpuLinear::from_linear(&m.out_proj),
            d_inner: m.d_inner,
            h: m.nheads,
            p: m.headdim,
            n: m.d_state,
            g: m.ngroups,
            k: m.d_conv,
            dt_limit: DtLimit {
                min: m.dt_limit.0,
                max: m.dt_limit.1,
            },
        }
    }

    fn conv_dim(&self) -> usize {
        self.d_inner + 2 * self.g * self.n
    }

    /// The all-zero state of a fresh sequence.
    pub fn zero_state(&self) -> CpuMixerState {
        CpuMixerState {
            conv: vec![0.0; self.conv_dim() * self.k],
            ssm: vec![0.0; self.h * self.p * self.n],
            zxbcdt: vec![0.0; self.in_proj.d_out],
            xbc: vec![0.0; self.conv_dim()],
            x_dt: vec![0.0; self.p],
            y: vec![0.0; self.d_inner],
        }
    }

    /// Copies a tensor state (batch element `index`, already checked) into a host state.
    fn state_from<B: Backend>(&self, s: &crate::Mamba2State<B>, index: usize) -> CpuMixerState {
        let mut out = self.zero_state();
        out.conv = host(s.conv.clone().narrow(0, index, 1).reshape([out.conv.len()]));
        out.ssm = host(s.ssm.clone().narrow(0, index, 1).reshape([out.ssm.len()]));
        out
    }

    /// One token: `out = mixer(x)`, updating `state`.
    ///
    /// # Shapes
    /// - x: `[d_model]`, out: `[d_model]`
    pub fn step(&self, x: &[f32], state: &mut CpuMixerState, out: &mut [f32]) {
        let (d_inner, h, p, n, g, k) = (self.d_inner, self.h, self.p, self.n, self.g, self.k);
        let conv_dim = self.conv_dim();
        let CpuMixerState {
            conv,
            ssm,
            zxbcdt,
            xbc,
            x_dt,
            y,
        } = state;

        // in_proj: [z | xBC | dt]
        self.in_proj.forward(x, zxbcdt);
        let (z, rest) = zxbcdt.split_at(d_inner);
        let (raw, dt_raw) = rest.split_at(conv_dim);

        // depthwise causal convolution over the shifted window, then SiLU
        for c in 0..conv_dim {
            let window = &mut conv[c * k..(c + 1) * k];
            window.copy_within(1.., 0);
            window[k - 1] = raw[c];
            let w = &self.conv_weight[c * k..(c + 1) * k];
            let mut acc = self.conv_bias.as_ref().map_or(0.0, |b| b[c]);
            for (wv, xv) in w.iter().zip(window.iter()) {
                acc += wv * xv;
            }
            xbc[c] = silu(acc);
        }
        let (xs, bc) = xbc.split_at(d_inner);
        let (b_mat, c_mat) = bc.split_at(g * n);

        // SSM step per head, then the D skip
        let r = h / g;
        for hi in 0..h {
            let dt = self
                .dt_limit
                .clamp_f32(softplus_f32(dt_raw[hi] + self.dt_bias[hi]));
            let decay = (dt * self.a[hi]).exp();
            let xh = &xs[hi * p..(hi + 1) * p];
            for (t, v) in x_dt.iter_mut().zip(xh) {
                *t = v * dt;
            }
            let gi = hi / r;
            let yh = &mut y[hi * p..(hi + 1) * p];
            kernels::ssm_head(
                &mut ssm[hi * p * n..(hi + 1) * p * n],
                decay,
                x_dt,
                &b_mat[gi * n..(gi + 1) * n],
                &c_mat[gi * n..(gi + 1) * n],
                yh,
            );
            if self.d.len() == h {
                let d = self.d[hi];
                for (yv, xv) in yh.iter_mut().zip(xh) {
                    *yv += xv * d;
                }
            } else {
                for ((yv, xv), d) in yh.iter_mut().zip(xh).zip(&self.d[hi * p..(hi + 1) * p]) {
                    *yv += xv * d;
                }
            }
        }

        // gate and gated RMSNorm
        match &self.norm {
            Some((weight, group, eps, before)) => {
                if *before {
                    for (yg, wg) in y.chunks_mut(*group).zip(weight.chunks(*group)) {
                        rms_norm_in_place(yg, wg, *eps);
                    }
                    for (yv, zv) in y.iter_mut().zip(z) {
                        *yv *= silu(*zv);
                    }
                } else {
                    for (yv, zv) in y.iter_mut().zip(z) {
                        *yv *= silu(*zv);
                    }
                    for (yg, wg) in y.chunks_mut(*group).zip(weight.chunks(*group)) {
                        rms_norm_in_place(yg, wg, *eps);
                    }
                }
            }
            None => {
                for (yv, zv) in y.iter_mut().zip(z) {
                    *yv *= silu(*zv);
                }
            }
        }
        self.out_proj.forward(y, out);
    }
}

/// A [`Mamba2Backbone`] on the host, for one token of one sequence at a time.
#[derive(Clone, Debug)]
pub struct CpuBackbone {
    layers: Vec<(Vec<f32>, f32, CpuMixer)>,
    norm_f: (Vec<f32>, f32),
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

fn norm_params<B: Backend>(norm: &RmsNorm<B>) -> (Vec<f32>, f32) {
    (host_param(&norm.weight), norm.eps as f32)
}

impl CpuBackbone {
    /// Copies the weights of a backbone (of any backend and float type) to `f32` host memory.
    pub fn from_backbone<B: Backend>(backbone: &Mamba2Backbone<B>) -> Self {
        Self {
            layers: backbone
                .layers
                .iter()
                .map(|layer| {
                    let (w, eps) = norm_params(&layer.norm);
                    (w, eps, CpuMixer::from_mixer(&layer.mixer))
                })
                .collect(),
            norm_f: norm_params(&backbone.norm_f),
            d_model: backbone.d_model(),
        }
    }

    /// Width of the residual stream.
    pub fn d_model(&self) -> usize {
        self.d_model
    }

    /// Checks that a state has one entry per layer.
    fn check_layers(&self, layers: usize) -> crate::Result<()> {
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
            layers: self.layers.iter().map(|(_, _, m)| m.zero_state()).collect(),
            normed: vec![0.0; self.d_model],
            mixed: vec![0.0; self.d_model],
        }
    }

    /// Copies batch element `index` of a tensor state of `backbone` (for example after a
    /// chunked prefill with [`Mamba2Backbone::forward`]) into a host state.
    pub fn state_from<B: Backend>(
        &self,
        backbone: &Mamba2Backbone<B>,
        state: &crate::BackboneState<B>,
        index: usize,
    ) -> crate::Result<CpuState> {
        self.check_layers(state.layers.len())?;
        let mut out = self.zero_state();
        for (((s, (_, _, mixer)), dst), tensor_mixer) in state
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
            *dst = mixer.state_from(s, index);
        }
        Ok(out)
    }

    /// One token through every block and the final norm: `out = backbone(x)`, updating
    /// `state`.
    ///
    /// # Shapes
    /// - x: `[d_model]`, out: `[d_model]`
    pub fn step(&self, x: &[f32], state: &mut CpuState, out: &mut [f32]) -> crate::Result<()> {
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
        for ((weight, eps, mixer), s) in self.layers.iter().zip(layers.iter_mut()) {
            normed.copy_from_slice(out);
            rms_norm_in_place(normed, weight, *eps);
            mixer.step(normed, s, mixed);
            for (o, m) in out.iter_mut().zip(mixed.iter()) {
                *o += m;
            }
        }
        rms_norm_in_place(out, &self.norm_f.0, self.norm_f.1);
        Ok(())
    }
}
