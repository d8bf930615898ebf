//! Strided matrix views over slices and their product through the `gemm` crate: the scan's
//! operands are rows of the model's tensors (`x` with a row stride of `h·p`, `B` and `C` of
//! `g·n`) and their transposes, which `gemm` reads in place through its strides. The views
//! check their extent against the slice once, so the one `unsafe` call below only ever reads and
//! writes inside the slices it was given.

use std::iter::Sum;
use std::ops::{Add, AddAssign, Mul, MulAssign, Sub};

/// The element types of the scan: `f32` and `f64`, the float types of burn-ndarray.
pub(crate) trait Real:
    Copy
    + Send
    + Sync
    + PartialEq
    + Default
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + AddAssign
    + MulAssign
    + Sum
    + 'static
{
    /// 0.
    const ZERO: Self;
    /// 1.
    const ONE: Self;
    /// `eˣ`.
    fn exp(self) -> Self;
    /// The nearest value of this type.
    fn of(value: f64) -> Self;
}

impl Real for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    fn exp(self) -> Self {
        f32::exp(self)
    }
    fn of(value: f64) -> Self {
        value as f32
    }
}

impl Real for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    fn exp(self) -> Self {
        f64::exp(self)
    }
    fn of(value: f64) -> Self {
        value
    }
}

/// A `rows × cols` matrix read from a slice: element `(i, j)` at `offset + i·rs + j·cs`.
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a, E> {
    data: &'a [E],
    offset: usize,
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

/// Whether a `rows × cols` matrix at `offset` with strides `rs`, `cs` lies in `len` elements.
fn fits(len: usize, offset: usize, rows: usize, cols: usize, rs: usize, cs: usize) -> bool {
    if rows == 0 || cols == 0 {
        return offset <= len;
    }
    let last = (rows - 1)
        .checked_mul(rs)
        .and_then(|r| (cols - 1).checked_mul(cs).and_then(|c| r.checked_add(c)))
        .and_then(|e| e.checked_add(offset));
    matches!(last, Some(last) if last < len)
}

impl<'a, E> Mat<'a, E> {
    /// The matrix at `offset` of `data`; panics if it does not lie within `data` (a bug of the
    /// scan, never of its input: the shapes are checked before).
    pub(crate) fn new(
        data: &'a [E],
        offset: usize,
        [rows, cols]: [usize; 2],
        [rs, cs]: [usize; 2],
    ) -> Self {
        assert!(
            fits(data.len(), offset, rows, cols, rs, cs),
            "a {rows}×{cols} view at {offset} (strides {rs}, {cs}) past {} elements",
            data.len()
        );
        Self {
            data,
            offset,
            rows,
            cols,
            rs,
            cs,
        }
    }

    /// A row-major `rows × cols` matrix with row stride `rs`.
    pub(crate) fn rows(data: &'a [E], offset: usize, shape: [usize; 2], rs: usize) -> Self {
        Self::new(data, offset, shape, [rs, 1])
    }

    /// The transpose (a view).
    pub(crate) fn t(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }
}

/// A `rows × cols` matrix written into a slice, element `(i, j)` at `offset + i·rs + j`.
pub(crate) struct MatMut<'a, E> {
    data: &'a mut [E],
    offset: usize,
    rows: usize,
    cols: usize,
    rs: usize,
}

impl<'a, E> MatMut<'a, E> {
    /// The row-major matrix at `offset` of `data` with row stride `rs`; panics if it does not
    /// lie within `data`.
    pub(crate) fn rows(
        data: &'a mut [E],
        offset: usize,
        [rows, cols]: [usize; 2],
        rs: usize,
    ) -> Self {
        assert!(
            fits(data.len(), offset, rows, cols, rs, 1),
            "a {rows}×{cols} output at {offset} (row stride {rs}) past {} elements",
            data.len()
        );
        Self {
            data,
            offset,
            rows,
            cols,
            rs,
        }
    }
}

/// `dst = lhs · rhs`, or `dst += lhs · rhs` when `accumulate`, on one thread (the scan runs
/// its tasks in parallel, not its products).
pub(crate) fn matmul<E: Real>(
    dst: MatMut<'_, E>,
    lhs: Mat<'_, E>,
    rhs: Mat<'_, E>,
    accumulate: bool,
) {
    matmul_on(dst, lhs, rhs, accumulate, 1);
}

/// [`matmul`] on up to `threads` of rayon's threads (`gemm` splits the product and packs each
/// operand once); one thread below about 2 million multiply-adds, where splitting costs more
/// than it saves.
pub(crate) fn matmul_on<E: Real>(
    dst: MatMut<'_, E>,
    lhs: Mat<'_, E>,
    rhs: Mat<'_, E>,
    accumulate: bool,
    threads: usize,
) {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    assert!(
        rhs.rows == k && dst.rows == m && dst.cols == n,
        "a product of {m}×{k} and {}×{n} into {}×{}",
        rhs.rows,
        dst.rows,
        dst.cols
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                let row = dst.offset + i * dst.rs;
                dst.data[row..row + n].fill(E::ZERO);
            }
        }
        return;
    }
    let stride = |s: usize| isize::try_from(s).expect("a stride below isize::MAX");
    let parallelism = if threads > 1 && m.saturating_mul(n).saturating_mul(k) >= 1 << 21 {
        ::gemm::Parallelism::Rayon(threads)
    } else {
        ::gemm::Parallelism::None
    };
    // SAFETY: the three views were checked to lie within their slices (`Mat::new`,
    // `MatMut::rows`) with the extents and strides passed here; `dst` is borrowed mutably, so it
    // overlaps neither operand; gemm reads `lhs` and `rhs` and writes only `dst`'s m × n
    // elements. `E` is f32 or f64 (`Real`), both of which gemm implements.
    unsafe {
        ::gemm::gemm(
            m,
            n,
            k,
            dst.data.as_mut_ptr().add(dst.offset),
            1,
            stride(dst.rs),
            accumulate,
            lhs.data.as_ptr().add(lhs.offset),
            stride(lhs.cs),
            stride(lhs.rs),
            rhs.data.as_ptr().add(rhs.offset),
            stride(rhs.cs),
            stride(rhs.rs),
            E::ONE,
            E::ONE,
            false,
            false,
            false,
            parallelism,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Products of strided and transposed views against the triple loop, fresh and accumulated.
    #[test]
    fn strided_products_match_the_definition() {
        let (m, k, n) = (5, 7, 3);
        let a: Vec<f64> = (0..40).map(|i| f64::from(i) * 0.25 - 3.0).collect();
        let b: Vec<f64> = (0..60).map(|i| 1.5 - f64::from(i) * 0.125).collect();
        // lhs: a m×k view with row stride 8 at offset 1; rhs: the transpose of a n×k matrix
        let lhs = Mat::rows(&a, 1, [m, k], 8);
        let rhs = Mat::rows(&b, 2, [n, k], 9).t();
        for accumulate in [false, true] {
            let mut dst = vec![0.5; 4 + m * 6];
            let before = dst.clone();
            matmul(MatMut::rows(&mut dst, 4, [m, n], 6), lhs, rhs, accumulate);
            for i in 0..m {
                for j in 0..n {
                    let dot: f64 = (0..k).map(|t| a[1 + i * 8 + t] * b[2 + j * 9 + t]).sum();
                    let at = 4 + i * 6 + j;
                    let want = if accumulate { before[at] + dot } else { dot };
                    assert!(
                        (dst[at] - want).abs() < 1e-12,
                        "({i}, {j}): {} {want}",
                        dst[at]
                    );
                }
            }
            // nothing outside the view is written
            assert_eq!(dst[..4], before[..4]);
            assert_eq!(dst[4 + n..4 + 6], before[4 + n..4 + 6]);
        }
    }

    #[test]
    #[should_panic(expected = "past")]
    fn a_view_past_its_slice_panics() {
        let a = [0.0f32; 10];
        let _ = Mat::rows(&a, 0, [3, 4], 4);
    }
}
