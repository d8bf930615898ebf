//! The CPU backend's kernels this crate relies on, where `vendor/burn-ndarray` changes them.
//!
//! - `exp` in f32 (vectorised, `vendor/burn-ndarray/src/ops/exp.rs`): within 2 ulp of the
//!   exact value over the whole range (1 unit of the smallest subnormal below the normal
//!   range), exact at the special values, and the same on every memory layout.
//! - `cumsum` / `cumprod` (accumulated in place): equal to a running sum / product along every
//!   axis, exactly (same operations in the same order).
//! - slices (views of the sliced tensor's buffer): writing to either never changes the other.
//! - `zeros`, `ones`, `full` (filled in place): every element the value, in f32 and f64.
//! - `matmul` in f32 and f64 (the `gemm` crate without BLAS): within the dot-product error
//!   bound of an exact product, for standard, transposed and broadcast operands, odd sizes, and
//!   products large enough to be split over threads.
//! - the crate's activations whose gradient would go through burn-ndarray's `recip` (the
//!   approximate SIMD reciprocal, 12 bits with AVX2 and 14 with AVX-512; not changed by the
//!   vendored crate): the gradients of `softplus` and `log_softmax` are within a few rounding
//!   errors of f64, where `recip` alone would be off by 2⁻¹⁴ to 2⁻¹².

use burn::backend::NdArray;
use burn::tensor::{DType, Tensor, TensorData};

type B = NdArray<f32>;

fn exp_of(values: &[f32]) -> Vec<f32> {
    let t = Tensor::<B, 1>::from_data(TensorData::from(values), &Default::default());
    t.exp().into_data().to_vec().unwrap()
}

/// Error of `got` in units in the last place of the f32 nearest to `want`.
fn ulp_error(got: f32, want: f64) -> f64 {
    let min_normal = f32::MIN_POSITIVE as f64;
    let ulp = if want < min_normal {
        2f64.powi(-149)
    } else {
        2f64.powi(want.log2().floor() as i32 - 23)
    };
    (got as f64 - want).abs() / ulp
}

#[test]
fn exp_f32_is_within_two_ulp() {
    // every 2^-10 from -110 to 95, and every representable value in [-1e-3, 1e-3] steps
    let mut xs: Vec<f32> = (0..(205 * 1024))
        .map(|i| -110.0 + i as f32 / 1024.0)
        .collect();
    xs.extend((-1000..=1000).map(|i| i as f32 * 1e-6));
    let got = exp_of(&xs);
    let mut worst = (0.0f64, 0.0f32);
    for (&x, &y) in xs.iter().zip(&got) {
        let want = (x as f64).exp();
        if want > f32::MAX as f64 {
            assert_eq!(y, f32::INFINITY, "exp({x}) should overflow");
            continue;
        }
        let e = ulp_error(y, want);
        if e > worst.0 {
            worst = (e, x);
        }
    }
    eprintln!("exp f32: worst error {:.2} ulp at x = {}", worst.0, worst.1);
    assert!(worst.0 <= 2.0, "exp({}) off by {:.2} ulp", worst.1, worst.0);
}

#[test]
fn exp_f32_special_values_and_layouts() {
    let special = [
        0.0f32,
        -0.0,
        1.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        89.0,
        -104.0,
        -200.0,
    ];
    let got = exp_of(&special);
    assert_eq!(got[0], 1.0);
    assert_eq!(got[1], 1.0);
    assert!((got[2] - std::f32::consts::E).abs() <= f32::EPSILON * 3.0);
    assert_eq!(got[3], f32::INFINITY);
    assert_eq!(got[4], 0.0);
    assert_eq!(got[5], f32::INFINITY);
    assert_eq!(got[6], 0.0);
    assert_eq!(got[7], 0.0);
    assert!(exp_of(&[f32::NAN])[0].is_nan());

    // contiguous, transposed (strided) and shared inputs give the same values
    let dev = Default::default();
    let values: Vec<f32> = (0..64 * 48)
        .map(|i| (i as f32 * 0.37).sin() * 30.0)
        .collect();
    let t = Tensor::<B, 2>::from_data(TensorData::new(values, [64, 48]), &dev);
    let plain: Vec<f32> = t.clone().exp().into_data().to_vec().unwrap();
    let strided: Vec<f32> = t
        .clone()
        .swap_dims(0, 1)
        .exp()
        .swap_dims(0, 1)
        .into_data()
        .to_vec()
        .unwrap();
    let kept = t.clone();
    let shared: Vec<f32> = t.exp().into_data().to_vec().unwrap();
    assert_eq!(plain, strided);
    assert_eq!(plain, shared);
    drop(kept);
}

#[test]
fn cumulative_ops_along_every_axis() {
    let dev = Default::default();
    let dims = [3usize, 4, 5];
    let values: Vec<f32> = (0..60).map(|i| 1.0 + ((i * 7) % 11) as f32 * 0.1).collect();
    let t = Tensor::<B, 3>::from_data(TensorData::new(values.clone(), dims), &dev);
    let at = |v: &[f32], i: usize, j: usize, k: usize| v[(i * dims[1] + j) * dims[2] + k];
    for axis in 0..3 {
        let sum: Vec<f32> = t.clone().cumsum(axis).into_data().to_vec().unwrap();
        let prod: Vec<f32> = t.clone().cumprod(axis).into_data().to_vec().unwrap();
        for i in 0..dims[0] {
            for j in 0..dims[1] {
                for k in 0..dims[2] {
                    let idx = [i, j, k];
                    let (mut s, mut p) = (0.0f32, 1.0f32);
                    for step in 0..=idx[axis] {
                        let mut src = idx;
                        src[axis] = step;
                        s += at(&values, src[0], src[1], src[2]);
                        p *= at(&values, src[0], src[1], src[2]);
                    }
                    assert_eq!(at(&sum, i, j, k), s, "cumsum axis {axis} at {idx:?}");
                    assert_eq!(at(&prod, i, j, k), p, "cumprod axis {axis} at {idx:?}");
                }
            }
        }
    }
}

#[test]
fn slices_are_copy_on_write() {
    let dev = Default::default();
    let values: Vec<f32> = (0..24).map(|i| i as f32).collect();
    let t = Tensor::<B, 2>::from_data(TensorData::new(values.clone(), [4, 6]), &dev);
    let rows = t.clone().narrow(0, 1, 2); // rows 1..3
    let cols = t.clone().narrow(1, 2, 3); // columns 2..5

    // in-place candidates on the views, then on the original while the views live
    let rows_plus: Vec<f32> = (rows.clone() + 100.0).into_data().to_vec().unwrap();
    let cols_times: Vec<f32> = (cols.clone() * 2.0).into_data().to_vec().unwrap();
    let t_minus: Vec<f32> = (t.clone() - 1.0).into_data().to_vec().unwrap();
    // a broadcast sum in place (by value) on the views and on the original
    let row = Tensor::<B, 2>::from_data(TensorData::new(vec![0.5f32; 3], [1, 3]), &dev);
    let cols_plus: Vec<f32> = (cols.clone() + row.clone()).into_data().to_vec().unwrap();
    let column = Tensor::<B, 2>::from_data(TensorData::new(vec![0.25f32; 4], [4, 1]), &dev);
    let t_plus: Vec<f32> = (t.clone() + column).into_data().to_vec().unwrap();
    assert_eq!(t_plus, values.iter().map(|v| v + 0.25).collect::<Vec<_>>());
    assert_eq!(
        rows_plus,
        values[6..18].iter().map(|v| v + 100.0).collect::<Vec<_>>()
    );
    let want_cols: Vec<f32> = (0..4)
        .flat_map(|r| (2..5).map(move |c| (r * 6 + c) as f32 * 2.0))
        .collect();
    assert_eq!(cols_times, want_cols);
    let want_cols_plus: Vec<f32> = want_cols.iter().map(|v| v / 2.0 + 0.5).collect();
    assert_eq!(cols_plus, want_cols_plus);
    assert_eq!(t_minus, values.iter().map(|v| v - 1.0).collect::<Vec<_>>());
    // the original and the views are unchanged
    let t_now: Vec<f32> = t.into_data().to_vec().unwrap();
    assert_eq!(t_now, values);
    let rows_now: Vec<f32> = rows.into_data().to_vec().unwrap();
    assert_eq!(rows_now, values[6..18].to_vec());
    let cols_now: Vec<f32> = cols.into_data().to_vec().unwrap();
    let want: Vec<f32> = (0..4)
        .flat_map(|r| (2..5).map(move |c| (r * 6 + c) as f32))
        .collect();
    assert_eq!(cols_now, want);
}

/// Deterministic values in [-1, 1) from an index (no random generator: every run sees the same
/// operands).
fn pattern(len: usize, seed: usize) -> Vec<f64> {
    (0..len)
        .map(|i| {
            let x = (i * 2_654_435_761 + seed * 40_503) % 1_000_003;
            x as f64 / 500_001.5 - 1.0
        })
        .collect()
}

/// `lhs · rhs` of `[batch, m, k]` and `[batch, k, n]` (batch 1 broadcast) row-major values, in
/// f64, with the sum of |products| of each entry (the scale of its rounding error).
fn reference_product(
    lhs: &[f64],
    rhs: &[f64],
    [bl, br, m, k, n]: [usize; 5],
) -> (Vec<f64>, Vec<f64>) {
    let batch = bl.max(br);
    let (mut out, mut scale) = (vec![0.0; batch * m * n], vec![0.0; batch * m * n]);
    for z in 0..batch {
        let (zl, zr) = (if bl == 1 { 0 } else { z }, if br == 1 { 0 } else { z });
        for i in 0..m {
            for j in 0..n {
                let (mut s, mut a) = (0.0, 0.0);
                for t in 0..k {
                    let p = lhs[(zl * m + i) * k + t] * rhs[(zr * k + t) * n + j];
                    s += p;
                    a += p.abs();
                }
                out[(z * m + i) * n + j] = s;
                scale[(z * m + i) * n + j] = a;
            }
        }
    }
    (out, scale)
}

/// Checks `matmul` in `dtype` for the given sizes, with each operand either stored as is or
/// stored transposed and swapped back (a strided view).
fn check_matmul(dims: [usize; 5], dtype: DType) {
    let eps = match dtype {
        DType::F64 => f64::EPSILON,
        _ => f32::EPSILON as f64,
    };
    let dev = Default::default();
    let [bl, br, m, k, n] = dims;
    let (lhs, rhs) = (pattern(bl * m * k, 1), pattern(br * k * n, 2));
    let (want, scale) = reference_product(&lhs, &rhs, dims);
    let transpose = |v: &[f64], batch: usize, rows: usize, cols: usize| -> Vec<f64> {
        let mut t = vec![0.0; v.len()];
        for z in 0..batch {
            for i in 0..rows {
                for j in 0..cols {
                    t[(z * cols + j) * rows + i] = v[(z * rows + i) * cols + j];
                }
            }
        }
        t
    };
    let tensor = |v: Vec<f64>, shape: [usize; 3], transposed: bool| -> Tensor<B, 3> {
        if transposed {
            let [z, r, c] = shape;
            let stored = TensorData::new(transpose(&v, z, r, c), [z, c, r]);
            Tensor::<B, 3>::from_data(stored, (&dev, dtype)).swap_dims(1, 2)
        } else {
            Tensor::<B, 3>::from_data(TensorData::new(v, shape), (&dev, dtype))
        }
    };
    for (lt, rt) in [(false, false), (true, false), (false, true), (true, true)] {
        let a = tensor(lhs.clone(), [bl, m, k], lt);
        let b = tensor(rhs.clone(), [br, k, n], rt);
        let product = a.matmul(b);
        assert_eq!(product.dtype(), dtype);
        let got: Vec<f64> = product.into_data().convert::<f64>().to_vec().unwrap();
        assert_eq!(got.len(), want.len());
        // a dot product of k terms rounds to within about k·eps of the sum of |terms|; 2k·eps
        // leaves room for the inputs' own rounding to the element type
        let bound = 2.0 * k as f64 * eps;
        for (idx, ((g, w), s)) in got.iter().zip(&want).zip(&scale).enumerate() {
            assert!(
                (g - w).abs() <= bound * s + f64::MIN_POSITIVE,
                "{dims:?} transposed ({lt}, {rt}) at {idx}: got {g}, want {w} (bound {})",
                bound * s
            );
        }
    }
}

#[test]
fn matmul_matches_an_exact_product() {
    // [lhs batch, rhs batch, m, k, n]
    for dims in [
        [1, 1, 1, 1, 1],
        [1, 1, 37, 129, 65],  // odd sizes, remainders of every kernel block
        [4, 4, 64, 64, 64],   // batched, as the SSD's chunk products
        [1, 3, 16, 33, 8],    // lhs broadcast over the batch
        [5, 1, 7, 300, 9],    // rhs broadcast, long dot products
        [1, 1, 256, 96, 160], // one product split over threads
        [2, 2, 3, 2, 1],
    ] {
        check_matmul(dims, DType::F32);
    }
    check_matmul([2, 2, 33, 70, 17], DType::F64);
    check_matmul([1, 1, 200, 64, 200], DType::F64);
}

#[test]
fn constant_tensors_are_filled() {
    let dev = Default::default();
    for dtype in [DType::F32, DType::F64] {
        let shape = [3, 5, 7];
        let cases = [
            (Tensor::<B, 3>::zeros(shape, (&dev, dtype)), 0.0),
            (Tensor::<B, 3>::ones(shape, (&dev, dtype)), 1.0),
            (Tensor::<B, 3>::full(shape, -2.5, (&dev, dtype)), -2.5),
            (
                Tensor::<B, 3>::full(shape, 0.1, (&dev, dtype)).ones_like(),
                1.0,
            ),
        ];
        for (t, want) in cases {
            assert_eq!(t.dtype(), dtype);
            assert_eq!(t.dims(), shape);
            let got: Vec<f64> = t.into_data().convert::<f64>().to_vec().unwrap();
            assert_eq!(got.len(), 105);
            assert!(
                got.iter().all(|&v| v == want),
                "{dtype:?}: {got:?} != {want}"
            );
        }
    }
}

/// f32's unit roundoff, 2⁻²⁴.
const U32: f64 = 1.0 / 16_777_216.0;

/// Values from -30 to 30 (softplus saturates at 20), 4,096 of them: contiguous and long
/// enough for burn-ndarray's SIMD kernels.
fn activation_inputs() -> Vec<f32> {
    (0..4096)
        .map(|i| -30.0 + 60.0 * i as f32 / 4095.0)
        .collect()
}

#[test]
fn softplus_gradient_is_the_exact_sigmoid() {
    use burn::backend::Autodiff;
    type A = Autodiff<B>;
    let xs = activation_inputs();
    let x = Tensor::<A, 1>::from_data(TensorData::from(xs.as_slice()), &Default::default())
        .require_grad();
    let grads = mamba2_burn::activation::softplus(x.clone())
        .sum()
        .backward();
    let got: Vec<f32> = x.grad(&grads).unwrap().into_data().to_vec().unwrap();
    // sigmoid(x) = 1 / (1 + e⁻ˣ) in f32: exp within 2 ulp, the sum and the quotient one rounding
    // each, so within 4 ulp of the exact value (relative error 4 · 2 · 2⁻²⁴ at most)
    let mut worst = 0f64;
    for (&x, &g) in xs.iter().zip(&got) {
        let want = 1.0 / (1.0 + (-(x as f64)).exp());
        worst = worst.max((g as f64 - want).abs() / want);
    }
    eprintln!("softplus gradient: worst relative error {worst:.2e}");
    assert!(worst <= 8.0 * U32, "worst relative error {worst:e}");
}

#[test]
fn log_softmax_gradient_is_exact() {
    use burn::backend::Autodiff;
    type A = Autodiff<B>;
    let (rows, v) = (64, 64);
    // logits in [-8, 8] (a different order in every row) and the negative log-likelihood of
    // token r % v in row r: the gradient is softmax(x) - onehot, every entry of which the
    // approximate reciprocal would move by 2⁻¹⁴ or more of its size
    let xs: Vec<f32> = pattern(rows * v, 3)
        .iter()
        .map(|&x| 8.0 * x as f32)
        .collect();
    let mut ws = vec![0f32; rows * v];
    for r in 0..rows {
        ws[r * v + r % v] = -1.0;
    }
    let dev = Default::default();
    let x = Tensor::<A, 2>::from_data(TensorData::new(xs.clone(), [rows, v]), &dev).require_grad();
    let w = Tensor::<A, 2>::from_data(TensorData::new(ws.clone(), [rows, v]), &dev);
    let grads = (mamba2_burn::activation::log_softmax(x.clone(), 1) * w)
        .sum()
        .backward();
    let got: Vec<f32> = x.grad(&grads).unwrap().into_data().to_vec().unwrap();
    let mut worst = 0f64;
    for r in 0..rows {
        let row = &xs[r * v..(r + 1) * v];
        let max = row.iter().fold(f64::MIN, |m, &x| m.max(x as f64));
        let z: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
        for j in 0..v {
            let softmax = (row[j] as f64 - max).exp() / z;
            let want = softmax + ws[r * v + j] as f64;
            // exp(x - lse): the row sum of v exponentials within v · 2⁻²⁴ of itself, so lse
            // within (v + 1) · 2⁻²⁴ absolute; the subtractions within 2 · 16 · 2⁻²⁴ (|x|, |lse|
            // ≤ 16); exp within 2 ulp: the softmax within (v + 40) · 2⁻²⁴ of itself. The
            // target's subtraction of 1 adds one rounding of the result.
            let bound = ((v as f64 + 40.0) * softmax + want.abs()) * U32;
            worst = worst.max((got[r * v + j] as f64 - want).abs() / bound);
        }
    }
    eprintln!("log_softmax gradient: worst error {worst:.2} of its bound");
    assert!(worst <= 1.0, "an entry off by {worst:.2} times its bound");
}
