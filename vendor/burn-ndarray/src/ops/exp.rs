//! A vectorisable `f32` exponential (local change, not from upstream; see `vendor/README.md`).
//!
//! `float_exp` maps the scalar `f32::exp` (a libm call per element) over the array, which is
//! about 30 times slower than a simple element-wise product. This version is branch-free, so
//! the compiler vectorises the loop over a contiguous buffer. Method (Cephes `expf`): `k =
//! round(x / ln 2)`, `r = x - k ln 2` in two parts (Cody-Waite), a degree-7 polynomial for
//! `exp(r)` on `|r| <= ln(2) / 2`, then scaling by `2^k` as two powers of two so that results
//! in the subnormal range round once. Error within 2 ulp of the exact value (checked
//! against `f64` over the whole range by the crate that vendors this); `exp(-inf) = 0`,
//! `exp(inf) = inf`, `exp(NaN) = NaN`, overflow to `inf` above ~88.72.

use burn_backend::DType;

use crate::{SharedArray, element::NdArrayElement};

/// `exp(x)` in `f32`, branch-free.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = core::f32::consts::LOG2_E;
    // ln 2 = LN2_HI + LN2_LO, LN2_HI with few enough bits that k * LN2_HI is exact
    const LN2_HI: f32 = 0.693_359_375;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // adding and subtracting 1.5 * 2^23 rounds to the nearest integer
    const ROUND: f32 = 12_582_912.0;
    // below -104 the result is 0, above 89 infinite; the clamp keeps k within [-150, 128]
    // (NaN passes through)
    let x = x.clamp(-104.0, 89.0);
    let t = x * LOG2E + ROUND;
    let kf = t - ROUND;
    let r = x - kf * LN2_HI - kf * LN2_LO;
    let mut p = 1.987_569_2e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 5.000_000_1e-1;
    let y = p * r * r + r + 1.0;
    // k read from the low bits of t (no float-to-int conversion, which would not vectorise);
    // 2^k as 2^k1 * 2^k2, each a normal number for k in [-150, 128] (for NaN, y is NaN and the
    // scale does not matter)
    let k = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let k1 = k >> 1;
    let k2 = k.wrapping_sub(k1);
    let s1 = f32::from_bits((k1.wrapping_add(127) as u32).wrapping_shl(23));
    let s2 = f32::from_bits((k2.wrapping_add(127) as u32).wrapping_shl(23));
    y * s1 * s2
}

/// `exp_f32` over a buffer, in place.
fn exp_in_place(values: &mut [f32]) {
    #[cfg(all(target_arch = "x86_64", feature = "std"))]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has the feature
            return unsafe { exp_in_place_avx512(values) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has the feature
            return unsafe { exp_in_place_avx2(values) };
        }
    }
    exp_in_place_plain(values)
}

/// `exp_f32` over a buffer, in place, in the baseline instruction set.
fn exp_in_place_plain(values: &mut [f32]) {
    for v in values.iter_mut() {
        *v = exp_f32(*v);
    }
}

// The same loop compiled for wider vectors. No fused multiply-add is enabled, so every lane
// computes the same rounded operations and the results do not depend on the path.
#[cfg(all(target_arch = "x86_64", feature = "std"))]
#[target_feature(enable = "avx2")]
unsafe fn exp_in_place_avx2(values: &mut [f32]) {
    exp_in_place_plain(values)
}

#[cfg(all(target_arch = "x86_64", feature = "std"))]
#[target_feature(enable = "avx512f")]
unsafe fn exp_in_place_avx512(values: &mut [f32]) {
    exp_in_place_plain(values)
}

/// Element-wise `exp`; `f32` arrays use [`exp_f32`], in place when the buffer is not shared.
pub(crate) fn exp<E: NdArrayElement>(array: SharedArray<E>) -> SharedArray<E> {
    if E::dtype() != DType::F32 {
        return array.mapv_into(|a: E| a.exp_elem()).into_shared();
    }
    // SAFETY: E is f32 (checked above); the crate's SIMD paths cast the same way.
    let array = unsafe { core::mem::transmute::<SharedArray<E>, SharedArray<f32>>(array) };
    let out = if array.is_standard_layout() {
        // a shared buffer is copied first (into_owned), then updated in place
        let mut owned = array.into_owned();
        exp_in_place(owned.as_slice_mut().expect("standard layout"));
        owned.into_shared()
    } else {
        array.mapv_into(exp_f32).into_shared()
    };
    // SAFETY: as above
    unsafe { core::mem::transmute::<SharedArray<f32>, SharedArray<E>>(out) }
}
