//! The forward of one task (a batch row, a group, some of its heads), chunk by chunk in time
//! order, each head's state carried from chunk to chunk (letters as in [`crate::ssd`]; per
//! chunk of `len` positions, `x̃ = x·dt`):
//!
//! 1. the decays of the chunk ([`ChunkDecays`]);
//! 2. `y = exp(cs) ⊙ (C · S_inᵀ) + M · x̃`, with `M = (C·Bᵀ) ⊙ L` the intra-chunk matrix and the
//!    scores `C·Bᵀ` computed once per group and chunk ([`scores`]);
//! 3. `S_out = exp(Σ dA) · S_in + (x̃ ⊙ to_end)ᵀ · B`.

use super::decay::ChunkDecays;
use super::layout::{group_rows, scale_rows, scaled_rows, scores, Dims, Inputs, Task};
use super::matmul::{matmul, Mat, MatMut, Real};

/// The buffers of one head's chunk, reused from chunk to chunk.
pub(super) struct Chunk<E> {
    pub(super) decays: ChunkDecays<E>,
    /// `x̃ = x·dt` (`len × p`)
    pub(super) xdt: Vec<E>,
    /// `x̃ ⊙ to_end` (`len × p`)
    pub(super) xw: Vec<E>,
    /// `M = (C·Bᵀ) ⊙ L` (`len × len`)
    pub(super) m: Vec<E>,
}

impl<E: Real> Chunk<E> {
    pub(super) fn new(d: &Dims) -> Self {
        Self {
            decays: ChunkDecays::new(d.q),
            xdt: vec![E::ZERO; d.q * d.p],
            xw: vec![E::ZERO; d.q * d.p],
            m: vec![E::ZERO; d.q * d.q],
        }
    }

    /// Chunk `j` of head `hh` (in row `bi`): its decays, `x̃`, `x̃ ⊙ to_end` and, given the
    /// chunk's scores `cb` (`len × len`), `M`.
    pub(super) fn fill(
        &mut self,
        f: &Inputs<'_, E>,
        d: &Dims,
        (bi, hh, j): (usize, usize, usize),
        cb: Option<&[E]>,
    ) {
        let (t0, len) = d.chunk(j);
        let a = f.a[hh];
        self.decays.fill(
            len,
            a,
            |i| f.dt(d, bi, t0 + i, hh),
            |i| f.starts_at(d, bi, t0 + i),
        );
        scaled_rows(f, d, bi, hh, t0, len, &mut self.xdt);
        scale_rows(&self.xdt, &self.decays.to_end, len, d.p, &mut self.xw);
        if let Some(cb) = cb {
            for ((m, &s), &l) in self.m[..len * len]
                .iter_mut()
                .zip(&cb[..len * len])
                .zip(&self.decays.matrix[..len * len])
            {
                *m = s * l;
            }
        }
    }

    /// `state = exp(Σ dA) · state + (x̃ ⊙ to_end)ᵀ · B` for this chunk (`j`, of group `gi` in
    /// row `bi`).
    pub(super) fn advance(
        &self,
        f: &Inputs<'_, E>,
        d: &Dims,
        (bi, gi, j): (usize, usize, usize),
        state: &mut [E],
    ) {
        let (t0, len) = d.chunk(j);
        let total = self.decays.total();
        for s in state.iter_mut() {
            *s *= total;
        }
        matmul(
            MatMut::rows(state, 0, [d.p, d.n], d.n),
            Mat::rows(&self.xw, 0, [len, d.p], d.p).t(),
            group_rows(f.b_mat, d, bi, gi, t0, len),
            true,
        );
    }
}

/// What a task computes: `y` of its heads (head by head, `[heads, l, p]`) and their final
/// states (`[heads, p, n]`).
pub(super) struct TaskOutput<E> {
    pub(super) y: Vec<E>,
    pub(super) last: Vec<E>,
}

/// The forward of one task.
pub(super) fn forward<E: Real>(f: &Inputs<'_, E>, d: &Dims, task: &Task) -> TaskOutput<E> {
    let Task { bi, gi, ref heads } = *task;
    let (l, p, n, q) = (d.l, d.p, d.n, d.q);
    let cb = scores(f, d, bi, gi);
    let mut chunk = Chunk::new(d);
    let mut y = vec![E::ZERO; heads.len() * l * p];
    let mut last = vec![E::ZERO; heads.len() * p * n];
    for (hl, hh) in heads.clone().enumerate() {
        let state = &mut last[hl * p * n..(hl + 1) * p * n];
        f.initial_into(d, bi, hh, state);
        for j in 0..d.c {
            let (t0, len) = d.chunk(j);
            chunk.fill(f, d, (bi, hh, j), Some(&cb[j * q * q..]));
            let at = (hl * l + t0) * p;
            // the entering state's part, then the chunk's own
            matmul(
                MatMut::rows(&mut y, at, [len, p], p),
                group_rows(f.c_mat, d, bi, gi, t0, len),
                Mat::rows(state, 0, [p, n], n).t(),
                false,
            );
            for (i, &w) in chunk.decays.from_start[..len].iter().enumerate() {
                for v in &mut y[at + i * p..at + (i + 1) * p] {
                    *v *= w;
                }
            }
            matmul(
                MatMut::rows(&mut y, at, [len, p], p),
                Mat::rows(&chunk.m, 0, [len, len], len),
                Mat::rows(&chunk.xdt, 0, [len, p], p),
                true,
            );
            chunk.advance(f, d, (bi, gi, j), state);
        }
    }
    TaskOutput { y, last }
}
