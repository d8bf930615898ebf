//! The scan's inputs as slices in their tensors' row-major layouts, the positions of their rows,
//! and the tasks the scan is cut into.

use std::ops::Range;

use super::matmul::{Mat, Real};

/// The sizes of one scan (letters as in [`crate::ssd`]): `c = ⌈l / q⌉` chunks, the last one
/// possibly shorter (no padding: each chunk is processed at its own length).
#[derive(Clone, Copy, Debug)]
pub(super) struct Dims {
    pub(super) b: usize,
    pub(super) l: usize,
    pub(super) h: usize,
    pub(super) g: usize,
    pub(super) r: usize,
    pub(super) p: usize,
    pub(super) n: usize,
    pub(super) q: usize,
    pub(super) c: usize,
}

impl Dims {
    /// The sizes of a scan of `x` `[b, l, h, p]` and `B` `[b, l, g, n]` in chunks of `q`.
    pub(super) fn new([b, l, h, p]: [usize; 4], g: usize, n: usize, q: usize) -> Self {
        Self {
            b,
            l,
            h,
            g,
            r: h / g,
            p,
            n,
            q,
            c: l.div_ceil(q),
        }
    }

    /// Where position `t` of head `hh` in row `bi` starts in a tensor of `x`'s layout
    /// `[b, l, h, p]`.
    pub(super) fn head_row(&self, bi: usize, t: usize, hh: usize) -> usize {
        ((bi * self.l + t) * self.h + hh) * self.p
    }

    /// The first position of chunk `j` and its length.
    pub(super) fn chunk(&self, j: usize) -> (usize, usize) {
        let t0 = j * self.q;
        (t0, self.q.min(self.l - t0))
    }
}

/// The inputs, row-major and contiguous: x `[b, l, h, p]`, dt `[b, l, h]`, a `[h]`, B and C
/// `[b, l, g, n]`, the initial state `[b, h, p, n]`, the starts `[b, l]` (nonzero at a
/// document's first token).
pub(super) struct Inputs<'a, E> {
    pub(super) x: &'a [E],
    pub(super) dt: &'a [E],
    pub(super) a: &'a [E],
    pub(super) b_mat: &'a [E],
    pub(super) c_mat: &'a [E],
    pub(super) initial: Option<&'a [E]>,
    pub(super) starts: Option<&'a [E]>,
}

/// One task: batch row `bi`, group `gi` and some of its heads.
#[derive(Clone, Debug)]
pub(super) struct Task {
    pub(super) bi: usize,
    pub(super) gi: usize,
    pub(super) heads: Range<usize>,
}

impl Task {
    /// The tasks of a scan on `threads` threads: one per batch row and group, each group's
    /// heads cut further where there are fewer rows and groups than threads (each part then
    /// computes its group's scores `C·Bᵀ` itself).
    pub(super) fn all(d: &Dims, threads: usize) -> Vec<Task> {
        let splits = threads.div_ceil((d.b * d.g).max(1)).clamp(1, d.r.max(1));
        let mut tasks = Vec::with_capacity(d.b * d.g * splits);
        for bi in 0..d.b {
            for gi in 0..d.g {
                let first = gi * d.r;
                for s in 0..splits {
                    let heads = first + s * d.r / splits..first + (s + 1) * d.r / splits;
                    if !heads.is_empty() {
                        tasks.push(Task { bi, gi, heads });
                    }
                }
            }
        }
        tasks
    }
}

impl<E: Real> Inputs<'_, E> {
    /// `dt` at position `t` of head `hh` in row `bi`.
    pub(super) fn dt(&self, d: &Dims, bi: usize, t: usize, hh: usize) -> E {
        self.dt[(bi * d.l + t) * d.h + hh]
    }

    /// Whether a document starts at position `t` of row `bi`.
    pub(super) fn starts_at(&self, d: &Dims, bi: usize, t: usize) -> bool {
        self.starts.is_some_and(|s| s[bi * d.l + t] != E::ZERO)
    }

    /// Head `hh`'s initial state in row `bi` (`p × n`), zeros when there is none.
    pub(super) fn initial_into(&self, d: &Dims, bi: usize, hh: usize, state: &mut [E]) {
        let size = d.p * d.n;
        match self.initial {
            Some(init) => {
                let at = (bi * d.h + hh) * size;
                state.copy_from_slice(&init[at..at + size]);
            }
            None => state.fill(E::ZERO),
        }
    }
}

/// Rows `t0..t0 + len` of head `hh` in row `bi` of `x` or of a tensor of its layout
/// (`len × p`).
pub(super) fn head_rows<'a, E>(
    data: &'a [E],
    d: &Dims,
    bi: usize,
    hh: usize,
    t0: usize,
    len: usize,
) -> Mat<'a, E> {
    Mat::rows(data, d.head_row(bi, t0, hh), [len, d.p], d.h * d.p)
}

/// Rows `t0..t0 + len` of group `gi` in row `bi` of `B` or `C` (`len × n`).
pub(super) fn group_rows<'a, E>(
    data: &'a [E],
    d: &Dims,
    bi: usize,
    gi: usize,
    t0: usize,
    len: usize,
) -> Mat<'a, E> {
    Mat::rows(
        data,
        ((bi * d.l + t0) * d.g + gi) * d.n,
        [len, d.n],
        d.g * d.n,
    )
}

/// The scores `C·Bᵀ` of every chunk of group `gi` in row `bi`: chunk `j`'s `len × len` matrix
/// at `j·q²`, row-major.
pub(super) fn scores<E: Real>(f: &Inputs<'_, E>, d: &Dims, bi: usize, gi: usize) -> Vec<E> {
    use super::matmul::{matmul, MatMut};
    let mut cb = vec![E::ZERO; d.c * d.q * d.q];
    for j in 0..d.c {
        let (t0, len) = d.chunk(j);
        let c_rows = group_rows(f.c_mat, d, bi, gi, t0, len);
        let b_rows = group_rows(f.b_mat, d, bi, gi, t0, len);
        matmul(
            MatMut::rows(&mut cb, j * d.q * d.q, [len, len], len),
            c_rows,
            b_rows.t(),
            false,
        );
    }
    cb
}

/// `out[i·p + k] = x[i, k] · dt[i]` for the rows of head `hh` from `t0` (`len × p`).
pub(super) fn scaled_rows<E: Real>(
    f: &Inputs<'_, E>,
    d: &Dims,
    bi: usize,
    hh: usize,
    t0: usize,
    len: usize,
    out: &mut [E],
) {
    let p = d.p;
    for i in 0..len {
        let at = d.head_row(bi, t0 + i, hh);
        let w = f.dt(d, bi, t0 + i, hh);
        for (o, &v) in out[i * p..(i + 1) * p].iter_mut().zip(&f.x[at..at + p]) {
            *o = v * w;
        }
    }
}

/// `out[i·w + k] = m[i·w + k] · s[i]`: the rows of a `len × w` matrix, each scaled.
pub(super) fn scale_rows<E: Real>(m: &[E], s: &[E], len: usize, w: usize, out: &mut [E]) {
    for i in 0..len {
        for (o, &v) in out[i * w..(i + 1) * w]
            .iter_mut()
            .zip(&m[i * w..(i + 1) * w])
        {
            *o = v * s[i];
        }
    }
}

/// `Σ_k a[k]·b[k]`.
pub(super) fn dot<E: Real>(a: &[E], b: &[E]) -> E {
    a.iter().zip(b).map(|(&x, &y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On any number of threads, the tasks hold each head of each row once, with its group.
    #[test]
    fn tasks_cover_every_head_once() {
        for (b, h, g) in [(1, 1, 1), (1, 8, 1), (2, 6, 3), (3, 4, 2), (8, 24, 1)] {
            let d = Dims::new([b, 10, h, 2], g, 2, 4);
            for threads in 1..=9 {
                let mut seen = vec![0; b * h];
                for task in Task::all(&d, threads) {
                    assert!(!task.heads.is_empty());
                    for hh in task.heads.clone() {
                        assert_eq!(hh / d.r, task.gi, "head {hh} outside its group");
                        seen[task.bi * h + hh] += 1;
                    }
                }
                assert!(
                    seen.iter().all(|&s| s == 1),
                    "{b} {h} {g} on {threads}: {seen:?}"
                );
            }
        }
    }
}
