//! The internal steps against each other and against f64, on NdArray and (with the `wgpu`
//! feature) on Wgpu. Inputs come from a seeded generator of their own, so every backend and
//! every run sees the same numbers.

use super::*;
use burn::backend::Autodiff;
use burn::tensor::{ElementConversion, TensorData};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// Values of `shape` drawn uniformly in `range` from `rng`.
pub(crate) fn uniform_data(
    rng: &mut StdRng,
    shape: &[usize],
    range: std::ops::Range<f32>,
) -> TensorData {
    let values: Vec<f32> = (0..shape.iter().product::<usize>())
        .map(|_| rng.random_range(range.clone()))
        .collect();
    TensorData::new(values, shape.to_vec())
}

/// A tensor of uniform draws in `range` from `rng` ([`uniform_data`]).
pub(crate) fn uniform<B: Backend, const D: usize>(
    rng: &mut StdRng,
    shape: [usize; D],
    range: std::ops::Range<f32>,
    device: &B::Device,
) -> Tensor<B, D> {
    Tensor::from_data(uniform_data(rng, &shape, range), device)
}

/// `max |a - b| <= 1e-5 · max |b|`, the path tests' tolerance.
pub(crate) fn assert_close<B: Backend, const D: usize>(
    what: &str,
    a: Tensor<B, D>,
    b: Tensor<B, D>,
) {
    assert_within(what, a, b, 1e-5);
}

/// `max |a - b| <= tol · max |b|`; the relative error `max |a - b| / max |b|`.
pub(crate) fn assert_within<B: Backend, const D: usize>(
    what: &str,
    a: Tensor<B, D>,
    b: Tensor<B, D>,
    tol: f64,
) -> f64 {
    assert_eq!(a.dims(), b.dims(), "{what}: shapes differ");
    let scale: f32 = b.clone().abs().max().into_scalar().elem();
    let err: f32 = (a - b).abs().max().into_scalar().elem();
    let rel = err as f64 / (scale as f64).max(1e-30);
    assert!(rel <= tol, "{what}: relative error {rel:.3e} > {tol:e}");
    rel
}

/// The two forms of the inter-chunk recurrence give the same entering and final states,
/// for one chunk, a few, and many.
fn state_passing_forms_agree<B: Backend>(device: &B::Device) {
    let mut rng = StdRng::seed_from_u64(17);
    for c in [1, 5, 40] {
        let (b, g, r, p, n) = (2, 2, 3, 4, 5);
        let states = uniform::<B, 6>(&mut rng, [b, c, g, r, p, n], -1.0..1.0, device);
        let decay = uniform::<B, 4>(&mut rng, [b, g, r, c], -3.0..0.0, device);
        let init = uniform::<B, 5>(&mut rng, [b, g, r, p, n], -1.0..1.0, device);
        let (e1, f1) = state_passing_matrix(states.clone(), decay.clone(), init.clone());
        let (e2, f2) = state_passing_loop(states, decay, init);
        assert_close(&format!("c = {c}: entering states"), e1, e2);
        assert_close(&format!("c = {c}: final state"), f1, f2);
    }
}

/// The intra-chunk decay matrix (`exp` of the stable segment sums, one product with a
/// triangular matrix), on a plain backend and under autodiff, against `exp(Σ a)` summed in
/// f64, on strongly decaying rows (segment sums down to about -250, so entries span the
/// whole f32 range and underflow).
///
/// Tolerance: on every entry of the lower triangle above 1e-30 (segment sums `s` above
/// -69), relative error <= 1e-6 · (1 + |s|): `exp` turns an absolute error of the sum into
/// a relative one, and f32 rounds `s` to about 6e-8 · |s|, so this allows some 16 roundings
/// of the sum (a difference of two prefix sums, off by 6e-8 of the prefix, fails it at
/// t = 256). Entries below 1e-30 must stay below 2e-30; the upper triangle is exactly 1.
fn decay_matrix_matches_f64_on_strong_decays<B: Backend>(device: &B::Device) {
    let mut rng = StdRng::seed_from_u64(23);
    for t in [64, 256] {
        let m = 6;
        let a = uniform::<B, 2>(&mut rng, [m, t], -2.0..0.0, device);
        let a_host: Vec<f32> = a.to_data().to_vec().unwrap();
        let direct: Vec<f32> = decay_matrix(a.clone()).into_data().to_vec().unwrap();
        let tracked = Tensor::<Autodiff<B>, 2>::from_inner(a).require_grad();
        let stable: Vec<f32> = decay_matrix(tracked).inner().into_data().to_vec().unwrap();
        for (form, got) in [("plain backend", &direct), ("autodiff backend", &stable)] {
            let mut worst: f64 = 0.0;
            for row in 0..m {
                let a_row = &a_host[row * t..(row + 1) * t];
                for i in 0..t {
                    let mut sum = 0.0f64; // Σ_{k=j+1}^{i} a_k, growing as j goes down
                    for j in (0..t).rev() {
                        let v = got[(row * t + i) * t + j] as f64;
                        if j > i {
                            assert_eq!(v, 1.0, "{form}, t = {t}: [{i}, {j}] above the diagonal");
                            continue;
                        }
                        if j < i {
                            sum += a_row[j + 1] as f64;
                        }
                        let want = sum.exp();
                        if want > 1e-30 {
                            worst = worst.max((v - want).abs() / want / (1.0 + sum.abs()));
                        } else {
                            assert!(
                                v < 2e-30,
                                "{form}, t = {t}: [{i}, {j}] = {v:e}, want {want:e}"
                            );
                        }
                    }
                }
            }
            assert!(
                worst <= 1e-6,
                "{form}, t = {t}: relative error / (1 + |s|) {worst:.3e} > 1e-6"
            );
        }
    }
}

/// Each check, once per backend; on a device backend (`$ignore`) ignored unless asked for
/// (`-- --ignored`), as it needs a device driver. CubeCL is configured first as a model's
/// `init` configures it, so that a test run's processes share the crate's autotune cache.
macro_rules! on_backend {
    ($module:ident, $backend:ty $(, $ignore:meta)?) => {
        mod $module {
            type B = $backend;

            #[test]
            $(#[$ignore])?
            fn state_passing_forms_agree() {
                crate::init::setup_cubecl();
                super::state_passing_forms_agree::<B>(&Default::default());
            }

            #[test]
            $(#[$ignore])?
            fn decay_matrix_matches_f64_on_strong_decays() {
                crate::init::setup_cubecl();
                super::decay_matrix_matches_f64_on_strong_decays::<B>(&Default::default());
            }
        }
    };
}

on_backend!(ndarray, burn::backend::NdArray);
#[cfg(feature = "wgpu")]
on_backend!(
    wgpu,
    burn::backend::Wgpu,
    ignore = "needs a device driver: run with -- --ignored"
);
