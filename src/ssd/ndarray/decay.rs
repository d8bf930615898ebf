//! The decays of one chunk of one head, from its log-decays `dA[i] = dt[i]·A` (plus
//! [`DOCUMENT_START_LOG_DECAY`] at a document's first token), and the log-decays' gradient.
//!
//! Every decay is a product of the per-step decays `e[m] = exp(dA[m])` over a segment:
//! the decay matrix `L[i, k] = Π_{k<m≤i} e[m]`, the decay from the chunk's start
//! `exp(cs[i]) = Π_{m≤i} e[m]`, the decay to its end `Π_{m>k} e[m]` and the chunk's total.
//! Products of the segment's own factors are the stable form of the tensor operations' segment
//! sums: no difference of prefix sums, so a document start (`e = 0` exactly) zeroes exactly the
//! decays that span it and nothing else, and each entry's relative error grows with its
//! segment's length only. They cost `q` exponentials per chunk where `exp` of the segment sums
//! costs `q²/2`.
//!
//! The gradient of a log-decay `dA[m]` is the sum, over every decay whose segment holds `m`, of
//! the decay times its gradient (`∂ Π e / ∂ dA[m] = Π e`).

use super::matmul::Real;
use crate::ssd::chunked::DOCUMENT_START_LOG_DECAY;

/// The decays of a chunk of `len ≤ q` positions (buffers sized for `q`, reused from chunk to
/// chunk).
pub(super) struct ChunkDecays<E> {
    /// The positions of this chunk.
    pub(super) len: usize,
    /// `exp(cs[i]) = Π_{m≤i} e[m]`, the decay from the chunk's start through `i`.
    pub(super) from_start: Vec<E>,
    /// `Π_{m>k} e[m]`, the decay from `k` to the chunk's end.
    pub(super) to_end: Vec<E>,
    /// `L[i, k]` at `i·len + k`, 0 above the diagonal (`len × len`).
    pub(super) matrix: Vec<E>,
    step: Vec<E>,
}

impl<E: Real> ChunkDecays<E> {
    /// Buffers for chunks of up to `q` positions.
    pub(super) fn new(q: usize) -> Self {
        Self {
            len: 0,
            from_start: vec![E::ZERO; q],
            to_end: vec![E::ZERO; q],
            matrix: vec![E::ZERO; q * q],
            step: vec![E::ZERO; q],
        }
    }

    /// `Π_m e[m]`, the decay over the whole chunk (1 over no position).
    pub(super) fn total(&self) -> E {
        self.len
            .checked_sub(1)
            .map_or(E::ONE, |last| self.from_start[last])
    }

    /// The decays of a chunk whose step sizes are `dt(i)` and document starts `start(i)`
    /// (`i < len`), for the head's rate `a`.
    pub(super) fn fill(
        &mut self,
        len: usize,
        a: E,
        dt: impl Fn(usize) -> E,
        start: impl Fn(usize) -> bool,
    ) {
        self.len = len;
        let start_decay = E::of(DOCUMENT_START_LOG_DECAY);
        for i in 0..len {
            let da = dt(i) * a;
            self.step[i] = if start(i) { da + start_decay } else { da }.exp();
        }
        let mut product = E::ONE;
        for i in 0..len {
            product *= self.step[i];
            self.from_start[i] = product;
        }
        // row i is row i-1 times e[i], then 1 on the diagonal
        let matrix = &mut self.matrix[..len * len];
        matrix.fill(E::ZERO);
        for i in 0..len {
            let (above, row) = matrix.split_at_mut(i * len);
            let e = self.step[i];
            if i > 0 {
                let previous = &above[(i - 1) * len..(i - 1) * len + i];
                for (out, &prev) in row[..i].iter_mut().zip(previous) {
                    *out = prev * e;
                }
            }
            row[i] = E::ONE;
        }
        if len > 0 {
            let last = (len - 1) * len;
            self.to_end[..len].copy_from_slice(&matrix[last..last + len]);
        }
    }
}

/// The log-decays' gradient of one chunk, `grad[m]` for `m < len`, from the gradients of its
/// decays:
/// - `pairs[i·len + k]` (`k < i`): the gradient of `L[i, k]` times `L[i, k]`, summed over the
///   pairs whose segment `(k, i]` holds `m`: `Σ_{i≥m} Σ_{k<m}`, each a sum of its own terms (the
///   rows' running sums from the bottom, no differences);
/// - `from_start[i]`: that of `exp(cs[i])` times the decay, summed over `i ≥ m`;
/// - `to_end[k]`: that of the decay to the end times it, summed over `k < m`;
/// - `total`: that of the chunk's total decay times it, in every position.
///
/// `column` is scratch of at least `len` elements.
pub(super) fn log_decay_grads<E: Real>(
    len: usize,
    pairs: &[E],
    from_start: &[E],
    to_end: &[E],
    total: E,
    column: &mut [E],
    grad: &mut [E],
) {
    let column = &mut column[..len];
    column.fill(E::ZERO);
    let grad = &mut grad[..len];
    grad.fill(E::ZERO);
    for m in (1..len).rev() {
        // column[k] = Σ_{i≥m} pairs[i, k] for k < m
        for (acc, &v) in column[..m].iter_mut().zip(&pairs[m * len..m * len + m]) {
            *acc += v;
        }
        grad[m] = column[..m].iter().copied().sum();
    }
    let mut suffix = E::ZERO;
    for m in (0..len).rev() {
        suffix += from_start[m];
        grad[m] += suffix + total;
    }
    let mut prefix = E::ZERO;
    for m in 0..len {
        grad[m] += prefix;
        prefix += to_end[m];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The decays equal `exp` of their segment sums, and a start zeroes exactly the decays that
    /// span it.
    #[test]
    fn decays_are_the_exponentials_of_their_segment_sums() {
        let dt = [0.3, 0.1, 0.7, 0.2, 0.05];
        let a = -1.3;
        let starts = [false, false, true, false, false];
        let len = dt.len();
        let mut d = ChunkDecays::<f64>::new(8);
        d.fill(len, a, |i| dt[i], |i| starts[i]);
        let da = |m: usize| {
            if starts[m] {
                f64::NEG_INFINITY
            } else {
                dt[m] * a
            }
        };
        let seg = |from: usize, to: usize| (from..to).map(da).sum::<f64>().exp();
        for i in 0..len {
            for k in 0..len {
                let want = if k <= i { seg(k + 1, i + 1) } else { 0.0 };
                let got = d.matrix[i * len + k];
                assert!((got - want).abs() <= 1e-15, "L[{i}, {k}] {got} {want}");
            }
            assert!((d.from_start[i] - seg(0, i + 1)).abs() <= 1e-15);
            assert!((d.to_end[i] - seg(i + 1, len)).abs() <= 1e-15);
        }
        assert_eq!(d.total(), 0.0);
        assert_eq!(d.matrix[4 * len + 1], 0.0);
        assert!(d.matrix[4 * len + 2] > 0.0);
    }

    /// The gradient against its definition, summed term by term over every decay.
    #[test]
    fn log_decay_grads_sum_every_decay_that_holds_the_step() {
        let len = 6;
        let value = |i: usize, k: usize| ((i * 7 + k * 3) % 5) as f64 - 1.7;
        let pairs: Vec<f64> = (0..len * len)
            .map(|at| {
                let (i, k) = (at / len, at % len);
                if k < i {
                    value(i, k)
                } else {
                    0.0
                }
            })
            .collect();
        let from_start: Vec<f64> = (0..len).map(|i| 0.3 * i as f64 - 0.4).collect();
        let to_end: Vec<f64> = (0..len).map(|i| 1.1 - 0.25 * i as f64).collect();
        let total = 0.6;
        let mut grad = vec![0.0; len];
        log_decay_grads(
            len,
            &pairs,
            &from_start,
            &to_end,
            total,
            &mut [0.0; 8],
            &mut grad,
        );
        for (m, got) in grad.iter().enumerate() {
            let mut want = total;
            for i in 0..len {
                for k in 0..i {
                    if k < m && m <= i {
                        want += pairs[i * len + k];
                    }
                }
                if m <= i {
                    want += from_start[i];
                }
                if i < m {
                    want += to_end[i];
                }
            }
            assert!((got - want).abs() < 1e-12, "m = {m}: {got} {want}");
        }
    }
}
