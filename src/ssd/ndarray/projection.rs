//! The layer's projections on burn-ndarray, `y = x · W (+ b)`, and their gradient: one `gemm`
//! product each, split by `gemm` over rayon's threads, the operands read in place ([`host`]).
//!
//! Why here and not burn-ndarray's `matmul`: the published burn-ndarray 0.21.0 multiplies
//! through `matrixmultiply` and copies every operand into a fresh standard-layout array first
//! (its `reshape` copies, and the gradients' operands are transposed views); that was about a
//! third of a training step in a project that imports this crate. Here the products read the
//! activations and the weights where they lie, transposed operands through `gemm`'s strides.
//!
//! [`host`]: super::host

use super::host::HostFloat;
use super::matmul::{matmul_on, Mat, MatMut};

/// `x · w (+ bias)`: `[m, n]` from x `[m, k]`, w `[k, n]` and bias `[n]`, all row-major.
pub(super) fn forward<E: HostFloat>(
    x: &[E],
    w: &[E],
    bias: Option<&[E]>,
    [m, k, n]: [usize; 3],
) -> Vec<E> {
    let mut y = vec![E::ZERO; m * n];
    if let Some(bias) = bias {
        for row in y.chunks_mut(n.max(1)) {
            row.copy_from_slice(bias);
        }
    }
    matmul_on(
        MatMut::rows(&mut y, 0, [m, n], n),
        Mat::rows(x, 0, [m, k], k),
        Mat::rows(w, 0, [k, n], n),
        bias.is_some(),
        rayon::current_num_threads(),
    );
    y
}

/// The gradients of [`forward`]'s inputs from `dy` `[m, n]`: `dx = dy · wᵀ` `[m, k]`,
/// `dw = xᵀ · dy` `[k, n]` (transposed operands read through their strides) and, when `bias`,
/// `db` `[n]`, the column sums of `dy` in row order.
pub(super) fn backward<E: HostFloat>(
    x: &[E],
    w: &[E],
    dy: &[E],
    bias: bool,
    [m, k, n]: [usize; 3],
) -> (Vec<E>, Vec<E>, Option<Vec<E>>) {
    let threads = rayon::current_num_threads();
    let dy_mat = Mat::rows(dy, 0, [m, n], n);
    let mut dx = vec![E::ZERO; m * k];
    matmul_on(
        MatMut::rows(&mut dx, 0, [m, k], k),
        dy_mat,
        Mat::rows(w, 0, [k, n], n).t(),
        false,
        threads,
    );
    let mut dw = vec![E::ZERO; k * n];
    matmul_on(
        MatMut::rows(&mut dw, 0, [k, n], n),
        Mat::rows(x, 0, [m, k], k).t(),
        dy_mat,
        false,
        threads,
    );
    let db = bias.then(|| {
        let mut db = vec![E::ZERO; n];
        for row in dy.chunks(n.max(1)) {
            for (total, &v) in db.iter_mut().zip(row) {
                *total += v;
            }
        }
        db
    });
    (dx, dw, db)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both passes against their definitions in f64, with shapes that leave partial blocks and
    /// empty dimensions.
    #[test]
    fn products_match_the_definition() {
        for [m, k, n] in [
            [70, 5, 3],
            [1, 40, 33],
            [65, 1, 1],
            [0, 4, 3],
            [3, 0, 2],
            [4, 3, 0],
        ] {
            let x: Vec<f64> = (0..m * k).map(|i| (i as f64 * 0.37).sin()).collect();
            let w: Vec<f64> = (0..k * n).map(|i| (i as f64 * 0.11).cos()).collect();
            let b: Vec<f64> = (0..n).map(|i| i as f64 - 1.5).collect();
            let dy: Vec<f64> = (0..m * n).map(|i| (i as f64 * 0.23).sin()).collect();
            let y = forward(&x, &w, Some(&b), [m, k, n]);
            let (dx, dw, db) = backward(&x, &w, &dy, true, [m, k, n]);
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * (1.0 + b.abs());
            for i in 0..m {
                for j in 0..n {
                    let want = b[j] + (0..k).map(|t| x[i * k + t] * w[t * n + j]).sum::<f64>();
                    assert!(close(y[i * n + j], want), "y[{i}, {j}] of {m}×{k}×{n}");
                }
                for t in 0..k {
                    let want: f64 = (0..n).map(|j| dy[i * n + j] * w[t * n + j]).sum();
                    assert!(close(dx[i * k + t], want), "dx[{i}, {t}] of {m}×{k}×{n}");
                }
            }
            for t in 0..k {
                for j in 0..n {
                    let want: f64 = (0..m).map(|i| x[i * k + t] * dy[i * n + j]).sum();
                    assert!(close(dw[t * n + j], want), "dw[{t}, {j}] of {m}×{k}×{n}");
                }
            }
            let db = db.expect("a bias gradient");
            for j in 0..n {
                let want: f64 = (0..m).map(|i| dy[i * n + j]).sum();
                assert!(close(db[j], want), "db[{j}] of {m}×{k}×{n}");
            }
            assert_eq!((y.len(), dx.len(), dw.len()), (m * n, m * k, k * n));
        }
    }
}
