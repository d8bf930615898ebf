//! The host step's row-wise kernels (matrix-vector products and the state update of one
//! head), with an AVX2 + FMA build chosen at run time on x86-64 and portable code otherwise.

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
        *yv = dot_body::<FMA>(row, c);
    }
}

/// `Σ a[i]·b[i]`, in eight partial sums so that the reduction vectorises.
#[inline(always)]
fn dot_body<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut chunks = a.chunks_exact(8);
    let mut bc = b.chunks_exact(8);
    for (av, bv) in (&mut chunks).zip(&mut bc) {
        for j in 0..8 {
            acc[j] = if FMA {
                av[j].mul_add(bv[j], acc[j])
            } else {
                av[j] * bv[j] + acc[j]
            };
        }
    }
    let mut total: f32 = acc.iter().sum();
    for (av, bv) in chunks.remainder().iter().zip(bc.remainder()) {
        total += av * bv;
    }
    total
}

/// `out[r] = W[r, :] · x` for `W` `[out.len(), x.len()]` row-major.
#[inline(always)]
fn rows_dot_body<const FMA: bool>(w: &[f32], x: &[f32], out: &mut [f32]) {
    for (o, row) in out.iter_mut().zip(w.chunks_exact(x.len())) {
        *o = dot_body::<FMA>(row, x);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_dot_avx2(w: &[f32], x: &[f32], out: &mut [f32]) {
    rows_dot_body::<true>(w, x, out)
}

/// `out = W · x` for `W` `[out.len(), x.len()]` row-major.
pub(super) fn rows_dot(w: &[f32], x: &[f32], out: &mut [f32]) {
    assert_eq!(w.len(), x.len() * out.len(), "weight size");
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the processor supports AVX2 and FMA (checked above).
        return unsafe { rows_dot_avx2(w, x, out) };
    }
    rows_dot_body::<false>(w, x, out)
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
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    })
}

/// `out += x · W`.
pub(super) fn matvec_acc(w: &[f32], x: &[f32], out: &mut [f32]) {
    assert_eq!(w.len(), x.len() * out.len(), "weight size");
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the processor supports AVX2 and FMA (checked above).
        return unsafe { matvec_acc_avx2(w, x, out) };
    }
    matvec_acc_body::<false>(w, x, out)
}

/// See `ssm_head_body`.
pub(super) fn ssm_head(
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
