//! The gradient of one task (a batch row, a group, some of its heads) from the inputs and the
//! outputs' gradients. Each head first runs its states forward again (only the `c + 1` states
//! `p × n` are kept, never a decay matrix of another chunk), then walks the chunks backward
//! with `G`, the gradient of the state leaving the chunk (`dS_final` for the last one). Per
//! chunk (`x̃ = x·dt`, `w` the decay to the chunk's end, `e = exp(cs)` from its start):
//!
//! - the entering state: `G_in = exp(Σ dA) · G + (e ⊙ dy)ᵀ · C`;
//! - `x̃`: `dx̃ = Mᵀ · dy + w ⊙ (B · Gᵀ)`, then `dx = dt · dx̃`;
//! - `C`: `(e ⊙ dy) · S_in`, and `B`: `(x̃ ⊙ w) · G`; the scores' gradient `(dy · x̃ᵀ) ⊙ L`
//!   summed over the task's heads, and from it `dC += d(C·Bᵀ) · B`, `dB += d(C·Bᵀ)ᵀ · C` once
//!   per chunk;
//! - the log-decays ([`log_decay_grads`]): from `L` the pairs `(dy · x̃ᵀ) ⊙ M`, from `e` the
//!   rows of `dy ⊙ (C · S_inᵀ)`, from `w` those of `x̃ ⊙ (B · Gᵀ)`, from the total `⟨G, S_in⟩`;
//!   then `ddt = ⟨x, dx̃⟩ + A · d(dA)` and `dA = Σ dt · d(dA)`.

use super::decay::log_decay_grads;
use super::forward::Chunk;
use super::layout::{dot, group_rows, head_rows, scores, Dims, Inputs, Task};
use super::matmul::{matmul, Mat, MatMut, Real};

/// The gradients a task computes: those of `x` (`[heads, l, p]`), `dt` (`[heads, l]`), `A`
/// (`[heads]`) and the initial state (`[heads, p, n]`) of its heads, and its heads' parts of the
/// gradients of its group's `B` and `C` (`[l, n]` each).
pub(super) struct TaskGrads<E> {
    pub(super) x: Vec<E>,
    pub(super) dt: Vec<E>,
    pub(super) a: Vec<E>,
    pub(super) initial: Vec<E>,
    pub(super) b_mat: Vec<E>,
    pub(super) c_mat: Vec<E>,
}

/// The scratch of one chunk's gradient.
struct Scratch<E> {
    /// `e ⊙ dy` (`len × p`)
    dyw: Vec<E>,
    /// `C · S_inᵀ`, then `B · Gᵀ` (`len × p`)
    rows: Vec<E>,
    /// `dx̃` (`len × p`)
    dxdt: Vec<E>,
    /// `dy · x̃ᵀ`, then the pairs' terms (`len × len`)
    dm: Vec<E>,
    grad_from_start: Vec<E>,
    grad_to_end: Vec<E>,
    grad_da: Vec<E>,
    column: Vec<E>,
}

/// The gradients of one task from `dy` (`[b, l, h, p]`) and `dlast` (`[b, h, p, n]`).
pub(super) fn backward<E: Real>(
    f: &Inputs<'_, E>,
    dy: &[E],
    dlast: &[E],
    d: &Dims,
    task: &Task,
) -> TaskGrads<E> {
    let Task { bi, gi, ref heads } = *task;
    let (l, p, n, q, c) = (d.l, d.p, d.n, d.q, d.c);
    let size = p * n;
    let cb = scores(f, d, bi, gi);
    let mut grad_cb = vec![E::ZERO; c * q * q];
    let mut out = TaskGrads {
        x: vec![E::ZERO; heads.len() * l * p],
        dt: vec![E::ZERO; heads.len() * l],
        a: vec![E::ZERO; heads.len()],
        initial: vec![E::ZERO; heads.len() * size],
        b_mat: vec![E::ZERO; l * n],
        c_mat: vec![E::ZERO; l * n],
    };
    let mut chunk = Chunk::new(d);
    let mut states = vec![E::ZERO; (c + 1) * size];
    let (mut g, mut g_in) = (vec![E::ZERO; size], vec![E::ZERO; size]);
    let mut s = Scratch {
        dyw: vec![E::ZERO; q * p],
        rows: vec![E::ZERO; q * p],
        dxdt: vec![E::ZERO; q * p],
        dm: vec![E::ZERO; q * q],
        grad_from_start: vec![E::ZERO; q],
        grad_to_end: vec![E::ZERO; q],
        grad_da: vec![E::ZERO; q],
        column: vec![E::ZERO; q],
    };
    for (hl, hh) in heads.clone().enumerate() {
        // the states entering each chunk, and the final one
        f.initial_into(d, bi, hh, &mut states[..size]);
        for j in 0..c {
            chunk.fill(f, d, (bi, hh, j), None);
            let (done, next) = states.split_at_mut((j + 1) * size);
            next[..size].copy_from_slice(&done[j * size..]);
            chunk.advance(f, d, (bi, gi, j), &mut next[..size]);
        }
        g.copy_from_slice(&dlast[(bi * d.h + hh) * size..(bi * d.h + hh + 1) * size]);
        let mut grad_a = E::ZERO;
        for j in (0..c).rev() {
            let (t0, len) = d.chunk(j);
            let cb_j = &cb[j * q * q..j * q * q + len * len];
            chunk.fill(f, d, (bi, hh, j), Some(cb_j));
            let s_in = &states[j * size..(j + 1) * size];
            let dy_rows = head_rows(dy, d, bi, hh, t0, len);
            let c_rows = group_rows(f.c_mat, d, bi, gi, t0, len);
            let b_rows = group_rows(f.b_mat, d, bi, gi, t0, len);
            let dec = &chunk.decays;

            // e ⊙ dy, contiguous
            for i in 0..len {
                let at = d.head_row(bi, t0 + i, hh);
                let e = dec.from_start[i];
                for (o, &v) in s.dyw[i * p..(i + 1) * p].iter_mut().zip(&dy[at..at + p]) {
                    *o = v * e;
                }
            }
            let dyw = Mat::rows(&s.dyw, 0, [len, p], p);
            // the entering state's gradient
            let total = dec.total();
            for (o, &v) in g_in.iter_mut().zip(&g) {
                *o = v * total;
            }
            matmul(MatMut::rows(&mut g_in, 0, [p, n], n), dyw.t(), c_rows, true);
            // C through the entering state
            matmul(
                MatMut::rows(&mut out.c_mat, t0 * n, [len, n], n),
                dyw,
                Mat::rows(s_in, 0, [p, n], n),
                true,
            );
            // e: the rows of dy ⊙ (C · S_inᵀ)
            matmul(
                MatMut::rows(&mut s.rows, 0, [len, p], p),
                c_rows,
                Mat::rows(s_in, 0, [p, n], n).t(),
                false,
            );
            for i in 0..len {
                let at = d.head_row(bi, t0 + i, hh);
                s.grad_from_start[i] =
                    dot(&dy[at..at + p], &s.rows[i * p..(i + 1) * p]) * dec.from_start[i];
            }
            // x̃ through the chunk's outputs, and the intra-chunk pairs
            let xdt = Mat::rows(&chunk.xdt, 0, [len, p], p);
            matmul(
                MatMut::rows(&mut s.dxdt, 0, [len, p], p),
                Mat::rows(&chunk.m, 0, [len, len], len).t(),
                dy_rows,
                false,
            );
            matmul(
                MatMut::rows(&mut s.dm, 0, [len, len], len),
                dy_rows,
                xdt.t(),
                false,
            );
            // x̃ and B through the leaving state
            matmul(
                MatMut::rows(&mut s.rows, 0, [len, p], p),
                b_rows,
                Mat::rows(&g, 0, [p, n], n).t(),
                false,
            );
            for k in 0..len {
                let (u, w) = (&s.rows[k * p..(k + 1) * p], dec.to_end[k]);
                s.grad_to_end[k] = dot(&chunk.xdt[k * p..(k + 1) * p], u) * w;
                for (o, &v) in s.dxdt[k * p..(k + 1) * p].iter_mut().zip(u) {
                    *o += v * w;
                }
            }
            matmul(
                MatMut::rows(&mut out.b_mat, t0 * n, [len, n], n),
                Mat::rows(&chunk.xw, 0, [len, p], p),
                Mat::rows(&g, 0, [p, n], n),
                true,
            );
            let grad_total = dot(&g, s_in) * total;
            // the scores' gradient, then the pairs' terms in place of dy · x̃ᵀ
            let grad_cb_j = &mut grad_cb[j * q * q..j * q * q + len * len];
            for i in 0..len {
                let row = i * len;
                for k in 0..=i {
                    let dm = s.dm[row + k];
                    grad_cb_j[row + k] += dm * dec.matrix[row + k];
                    s.dm[row + k] = dm * chunk.m[row + k];
                }
            }
            log_decay_grads(
                len,
                &s.dm,
                &s.grad_from_start,
                &s.grad_to_end,
                grad_total,
                &mut s.column,
                &mut s.grad_da,
            );
            let a = f.a[hh];
            for i in 0..len {
                let t = t0 + i;
                let dt = f.dt(d, bi, t, hh);
                let at = d.head_row(bi, t, hh);
                let dxdt = &s.dxdt[i * p..(i + 1) * p];
                let grad_da = s.grad_da[i];
                out.dt[hl * l + t] = dot(&f.x[at..at + p], dxdt) + a * grad_da;
                grad_a += dt * grad_da;
                for (o, &v) in out.x[(hl * l + t) * p..(hl * l + t + 1) * p]
                    .iter_mut()
                    .zip(dxdt)
                {
                    *o = v * dt;
                }
            }
            std::mem::swap(&mut g, &mut g_in);
        }
        out.initial[hl * size..(hl + 1) * size].copy_from_slice(&g);
        out.a[hl] = grad_a;
    }
    // B and C through the scores, once per chunk for all the task's heads
    for j in 0..c {
        let (t0, len) = d.chunk(j);
        let grad_cb_j = Mat::rows(&grad_cb, j * q * q, [len, len], len);
        let c_rows = group_rows(f.c_mat, d, bi, gi, t0, len);
        let b_rows = group_rows(f.b_mat, d, bi, gi, t0, len);
        matmul(
            MatMut::rows(&mut out.c_mat, t0 * n, [len, n], n),
            grad_cb_j,
            b_rows,
            true,
        );
        matmul(
            MatMut::rows(&mut out.b_mat, t0 * n, [len, n], n),
            grad_cb_j.t(),
            c_rows,
            true,
        );
    }
    out
}
