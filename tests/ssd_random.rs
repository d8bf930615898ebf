//! Randomized differential tests of the SSD: shapes nobody chose, each computed on every path
//! and compared.
//!
//! Each case draws `(b, l, h, p, g, n, q)`, with and without document starts and an initial
//! state, its edges drawn often (`l = 1`, `l < q`, `l` not a multiple of `q`, `h = 1`,
//! `g = h`, `n = 1`, `p = 1`, `q = 512`, a batch large against the rest), and runs on NdArray
//! in `f32`:
//! - the fused scan and the tensor operations, `y`, the final state and the gradients of x,
//!   dt, A, B, C and the initial state;
//! - the sequential recurrence;
//! - the fused scan in random pieces, each continuing from the last one's state;
//! - the fused scan of all but the last tokens, then the single step for those.
//!
//! Each is compared with the exact values in `f64` computed on the host (the recurrence and
//! its adjoint), each element's error relative to the larger of its tensor's largest magnitude
//! and the sum of its own terms' magnitudes: a gradient or an output much smaller than the
//! terms it sums (A's, or dt's at one token) is rounded at the scale of its terms, and two
//! correct `f32` paths may differ there by far more than 1e-5 of the result.
//!
//! A failing case shrinks (every dimension, the flags, while it still fails) and the test
//! prints the smallest as a one-line reproduction:
//!
//! ```text
//! MAMBA2_SSD_CASE="b=1 l=3 h=1 p=1 g=1 n=1 q=2 docs=0 init=0 seed=7" \
//!     cargo test --release --test suite ssd_random
//! ```
//!
//! CI runs a fixed seed and `CASES` cases; `MAMBA2_SSD_SEED` and `MAMBA2_SSD_CASES` change
//! them for a long run (`docs/testing.md`). With `--features wgpu`, an ignored test (CI's Wgpu
//! stage) runs a few drawn cases through the fused GPU kernels, each variant of their
//! intra-chunk products in turn.

use burn::backend::{Autodiff, NdArray};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use mamba2_burn::ssd::{ssd_chunked, ssd_chunked_tensor_ops, ssd_sequential, ssd_step, SsdInput};
use mamba2_burn::FusedKernels;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type B32 = Autodiff<NdArray<f32>>;

/// Cases per CI run, and the seed of their draws.
const CASES: usize = 300;
const SEED: u64 = 20_261_205;

/// The largest error of an `f32` path against the exact values in `f64` ([`compare_exact`]):
/// `y`, the final state and every gradient. The fixed cases' tolerance (`src/ssd/tests.rs`);
/// about six times the worst of 3,000 cases of each of two seeds (2026-12-05: 7.6e-7 for `y`
/// and the states, 1.6e-6 for the gradients).
const TOL: f64 = 1e-5;

/// The most multiply-adds of a case's host recurrence (`b·l·h·p·n`): a draw above it is cut
/// down, its batch first.
const MAX_WORK: usize = 4_000_000;

/// One drawn case: the sizes, whether it has document starts and an initial state, and the
/// seed of its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Case {
    b: usize,
    l: usize,
    h: usize,
    p: usize,
    g: usize,
    n: usize,
    q: usize,
    docs: bool,
    init: bool,
    seed: u64,
}

impl Case {
    /// A case with its edges drawn often.
    fn draw(rng: &mut StdRng) -> Self {
        let pick = |rng: &mut StdRng, edges: &[usize], lo: usize, hi: usize| {
            if rng.random_bool(0.35) {
                edges[rng.random_range(0..edges.len())]
            } else {
                rng.random_range(lo..=hi)
            }
        };
        let q = pick(rng, &[1, 2, 64, 512], 2, 40);
        let l = match rng.random_range(0..5) {
            0 => 1,
            1 => rng.random_range(1..=q.max(2)),
            2 => q * rng.random_range(1..=3).min(600 / q.max(1)).max(1),
            _ => rng.random_range(2..=(3 * q).clamp(8, 600)),
        };
        let h = pick(rng, &[1, 8], 1, 6);
        let divisors: Vec<usize> = (1..=h).filter(|d| h % d == 0).collect();
        let g = divisors[rng.random_range(0..divisors.len())];
        let b = if rng.random_bool(0.1) {
            rng.random_range(9..=16)
        } else {
            rng.random_range(1..=3)
        };
        let mut case = Case {
            b,
            l,
            h,
            p: pick(rng, &[1, 64], 1, 9),
            g,
            n: pick(rng, &[1, 64], 1, 9),
            q,
            docs: rng.random_bool(0.3),
            init: rng.random_bool(0.4),
            seed: rng.random(),
        };
        while case.b * case.l * case.h * case.p * case.n > MAX_WORK {
            if case.b > 1 {
                case.b = case.b.div_ceil(2);
            } else {
                case.l = case.l.div_ceil(2);
            }
        }
        case
    }

    /// The case as `MAMBA2_SSD_CASE` reads it.
    fn repro(&self) -> String {
        format!(
            "b={} l={} h={} p={} g={} n={} q={} docs={} init={} seed={}",
            self.b,
            self.l,
            self.h,
            self.p,
            self.g,
            self.n,
            self.q,
            u8::from(self.docs),
            u8::from(self.init),
            self.seed
        )
    }

    fn parse(text: &str) -> Self {
        let mut case = Case {
            b: 1,
            l: 1,
            h: 1,
            p: 1,
            g: 1,
            n: 1,
            q: 1,
            docs: false,
            init: false,
            seed: 0,
        };
        for part in text.split_whitespace() {
            let (key, value) = part
                .split_once('=')
                .unwrap_or_else(|| panic!("MAMBA2_SSD_CASE: `{part}` is not key=value"));
            let v: u64 = value
                .parse()
                .unwrap_or_else(|_| panic!("MAMBA2_SSD_CASE: `{part}` is not a number"));
            match key {
                "b" => case.b = v as usize,
                "l" => case.l = v as usize,
                "h" => case.h = v as usize,
                "p" => case.p = v as usize,
                "g" => case.g = v as usize,
                "n" => case.n = v as usize,
                "q" => case.q = v as usize,
                "docs" => case.docs = v != 0,
                "init" => case.init = v != 0,
                "seed" => case.seed = v,
                other => panic!("MAMBA2_SSD_CASE: unknown key `{other}`"),
            }
        }
        assert!(
            case.g > 0 && case.h.is_multiple_of(case.g),
            "MAMBA2_SSD_CASE: g must divide h"
        );
        case
    }

    /// Smaller cases to try when this one fails, smallest steps last.
    fn smaller(&self) -> Vec<Case> {
        let mut out = Vec::new();
        let mut push = |c: Case| {
            if c != *self && c.g > 0 && c.h.is_multiple_of(c.g) {
                out.push(c);
            }
        };
        for (get, set) in FIELDS {
            let v = get(self);
            for smaller in [1, v / 2, v.saturating_sub(1)] {
                if smaller >= 1 && smaller < v {
                    let mut c = *self;
                    set(&mut c, smaller);
                    if c.g > c.h || !c.h.is_multiple_of(c.g) {
                        c.g = 1;
                    }
                    push(c);
                }
            }
        }
        push(Case {
            docs: false,
            ..*self
        });
        push(Case {
            init: false,
            ..*self
        });
        out
    }
}

type Field = (fn(&Case) -> usize, fn(&mut Case, usize));

/// The sizes a shrink reduces, the batch first.
const FIELDS: [Field; 7] = [
    (|c| c.b, |c, v| c.b = v),
    (|c| c.l, |c, v| c.l = v),
    (|c| c.h, |c, v| c.h = v),
    (|c| c.p, |c, v| c.p = v),
    (|c| c.g, |c, v| c.g = v),
    (|c| c.n, |c, v| c.n = v),
    (|c| c.q, |c, v| c.q = v),
];

/// A case's values on the host, drawn from its seed.
#[derive(Clone)]
struct Values {
    x: Vec<f64>,
    dt: Vec<f64>,
    a: Vec<f64>,
    b: Vec<f64>,
    c: Vec<f64>,
    init: Option<Vec<f64>>,
    starts: Option<Vec<f64>>,
    w_y: Vec<f64>,
    w_s: Vec<f64>,
}

impl Values {
    fn draw(case: &Case) -> Self {
        let mut rng = StdRng::seed_from_u64(case.seed);
        let Case {
            b, l, h, p, g, n, ..
        } = *case;
        let mut uniform =
            |len: usize, lo: f64, hi: f64| (0..len).map(|_| rng.random_range(lo..hi)).collect();
        let dt_max = [0.1, 0.5, 2.0][case.seed as usize % 3];
        let a_max = [1.0, 8.0][(case.seed / 3) as usize % 2];
        let x = uniform(b * l * h * p, -1.0, 1.0);
        let dt = uniform(b * l * h, 0.001, dt_max);
        let a = uniform(h, -a_max, -0.1);
        let bm = uniform(b * l * g * n, -1.0, 1.0);
        let cm = uniform(b * l * g * n, -1.0, 1.0);
        let init = case.init.then(|| uniform(b * h * p * n, -1.0, 1.0));
        let w_y = uniform(b * l * h * p, -1.0, 1.0);
        let w_s = uniform(b * h * p * n, -1.0, 1.0);
        let starts = case.docs.then(|| {
            let draws: Vec<f64> = uniform(b * l, 0.0, 1.0);
            draws
                .iter()
                .map(|&u| f64::from(u8::from(u < 0.15)))
                .collect()
        });
        Values {
            x,
            dt,
            a,
            b: bm,
            c: cm,
            init,
            starts,
            w_y,
            w_s,
        }
    }
}

fn tensor<Bk: Backend, const D: usize>(values: &[f64], shape: [usize; D]) -> Tensor<Bk, D> {
    let data = TensorData::new(values.to_vec(), shape).convert::<Bk::FloatElem>();
    Tensor::from_data(data, &Default::default())
}

/// An exact tensor: its values in `f64` and, per element, the sum of its terms' magnitudes.
type Exact = Vec<(&'static str, Vec<f64>, Vec<f64>)>;

/// The recurrence on the host in `f64`: `y` `[b, l, h, p]` and the final state `[b, h, p, n]`
/// (the state dropped at each document start), each element with its terms' magnitudes
/// (`y` sums `S·C` over `n`, a state element its decayed past).
#[allow(clippy::needless_range_loop)]
fn recurrence_f64(case: &Case, v: &Values) -> Exact {
    let Case {
        b, l, h, p, g, n, ..
    } = *case;
    let r = h / g;
    let (mut y, mut y_scale) = (vec![0.0; b * l * h * p], vec![0.0; b * l * h * p]);
    let mut state = vec![0.0; b * h * p * n];
    if let Some(init) = &v.init {
        state.copy_from_slice(init);
    }
    let mut state_scale: Vec<f64> = state.iter().map(|s| s.abs()).collect();
    for bi in 0..b {
        for t in 0..l {
            let start = v.starts.as_ref().is_some_and(|s| s[bi * l + t] != 0.0);
            for hi in 0..h {
                let dt = v.dt[(bi * l + t) * h + hi];
                let decay = if start { 0.0 } else { (dt * v.a[hi]).exp() };
                let bc = ((bi * l + t) * g + hi / r) * n;
                for pi in 0..p {
                    let i = ((bi * l + t) * h + hi) * p + pi;
                    let k = ((bi * h + hi) * p + pi) * n;
                    for ni in 0..n {
                        let input = dt * v.x[i] * v.b[bc + ni];
                        state[k + ni] = decay * state[k + ni] + input;
                        state_scale[k + ni] = decay * state_scale[k + ni] + input.abs();
                        y[i] += state[k + ni] * v.c[bc + ni];
                        y_scale[i] += state_scale[k + ni] * v.c[bc + ni].abs();
                    }
                }
            }
        }
    }
    vec![("y", y, y_scale), ("state", state, state_scale)]
}

fn host<Bk: Backend, const D: usize>(t: Tensor<Bk, D>) -> Vec<f64> {
    t.into_data().convert::<f64>().to_vec().unwrap()
}

/// What a path gives: `y`, the final state and the gradients of x, dt, A, B, C and the initial
/// state of `Σ w_y·y + Σ w_s·S` (each on the host).
type Outputs = Vec<(&'static str, Vec<f64>)>;

/// The inputs of `case` on backend `Bk`, each a leaf that requires its gradient.
struct Leaves<Bk: Backend> {
    x: Tensor<Bk, 4>,
    dt: Tensor<Bk, 3>,
    a: Tensor<Bk, 1>,
    b: Tensor<Bk, 4>,
    c: Tensor<Bk, 4>,
    init: Option<Tensor<Bk, 4>>,
    starts: Option<Tensor<Bk, 2>>,
}

impl<Bk: Backend> Leaves<Bk> {
    fn input(&self, q: usize) -> SsdInput<Bk> {
        SsdInput::new(
            self.x.clone(),
            self.dt.clone(),
            self.a.clone(),
            self.b.clone(),
            self.c.clone(),
            q,
        )
        .initial_state(self.init.clone())
        .document_starts(self.starts.clone())
    }
}

impl<Bk: burn::tensor::backend::AutodiffBackend> Leaves<Bk> {
    fn new(case: &Case, v: &Values) -> Self {
        let Case {
            b, l, h, p, g, n, ..
        } = *case;
        Leaves {
            x: tensor(&v.x, [b, l, h, p]).require_grad(),
            dt: tensor(&v.dt, [b, l, h]).require_grad(),
            a: tensor(&v.a, [h]).require_grad(),
            b: tensor(&v.b, [b, l, g, n]).require_grad(),
            c: tensor(&v.c, [b, l, g, n]).require_grad(),
            init: v
                .init
                .as_ref()
                .map(|s| tensor(s, [b, h, p, n]).require_grad()),
            starts: v.starts.as_ref().map(|s| tensor(s, [b, l])),
        }
    }

    /// `y`, the state and the gradients of one path's result.
    fn outputs(&self, case: &Case, v: &Values, y: Tensor<Bk, 4>, s: Tensor<Bk, 4>) -> Outputs {
        let Case { b, l, h, p, n, .. } = *case;
        let loss = (y.clone() * tensor::<Bk, 4>(&v.w_y, [b, l, h, p])).sum()
            + (s.clone() * tensor::<Bk, 4>(&v.w_s, [b, h, p, n])).sum();
        let grads = loss.backward();
        let mut out = vec![
            ("y", host(y.inner())),
            ("state", host(s.inner())),
            ("dx", host(self.x.grad(&grads).expect("dx"))),
            ("ddt", host(self.dt.grad(&grads).expect("ddt"))),
            ("dA", host(self.a.grad(&grads).expect("dA"))),
            ("dB", host(self.b.grad(&grads).expect("dB"))),
            ("dC", host(self.c.grad(&grads).expect("dC"))),
        ];
        if let Some(init) = &self.init {
            out.push(("dinit", host(init.grad(&grads).expect("dinit"))));
        }
        out
    }
}

/// Every gradient of the loss `Σ w_y·y + Σ w_s·S` in `f64`, by the recurrence's adjoint
/// (`G_t = exp(dt_{t+1}·a)·G_{t+1} + w_y,t ⊗ C_t` per head, `G` after the last token `w_s`; at a
/// document start the decay and its derivative are 0), in the order of [`Leaves::outputs`]'
/// gradients, each element with the sum of its terms' magnitudes: a gradient is a sum over the
/// dimensions its input does not have, and its rounding error scales with those magnitudes,
/// not with the sum (which may be far smaller than its terms).
// the indices address several arrays of different layouts at once
#[allow(clippy::needless_range_loop)]
fn grads_f64(case: &Case, v: &Values) -> Exact {
    let Case {
        b, l, h, p, g, n, ..
    } = *case;
    let r = h / g;
    // the states after each token, forward
    let mut states = vec![0.0; b * (l + 1) * h * p * n];
    let at =
        |bi: usize, t: usize, hi: usize, pi: usize| (((bi * (l + 1) + t) * h + hi) * p + pi) * n;
    if let Some(init) = &v.init {
        for bi in 0..b {
            for hi in 0..h {
                for pi in 0..p {
                    let k = ((bi * h + hi) * p + pi) * n;
                    let to = at(bi, 0, hi, pi);
                    states[to..to + n].copy_from_slice(&init[k..k + n]);
                }
            }
        }
    }
    let start = |bi: usize, t: usize| v.starts.as_ref().is_some_and(|s| s[bi * l + t] != 0.0);
    let decay = |bi: usize, t: usize, hi: usize| {
        if start(bi, t) {
            0.0
        } else {
            (v.dt[(bi * l + t) * h + hi] * v.a[hi]).exp()
        }
    };
    for bi in 0..b {
        for t in 0..l {
            for hi in 0..h {
                let (d, dt) = (decay(bi, t, hi), v.dt[(bi * l + t) * h + hi]);
                let bc = ((bi * l + t) * g + hi / r) * n;
                for pi in 0..p {
                    let x = v.x[((bi * l + t) * h + hi) * p + pi];
                    let (from, to) = (at(bi, t, hi, pi), at(bi, t + 1, hi, pi));
                    for ni in 0..n {
                        states[to + ni] = d * states[from + ni] + dt * x * v.b[bc + ni];
                    }
                }
            }
        }
    }
    let zeros = |len| (vec![0.0; len], vec![0.0; len]);
    let ((mut dx, mut sx), (mut ddt, mut sdt), (mut da, mut sa)) =
        (zeros(b * l * h * p), zeros(b * l * h), zeros(h));
    let ((mut db, mut sb), (mut dc, mut sc), (mut dinit, mut sinit)) = (
        zeros(b * l * g * n),
        zeros(b * l * g * n),
        zeros(b * h * p * n),
    );
    let add = |value: &mut [f64], scale: &mut [f64], k: usize, term: f64| {
        value[k] += term;
        scale[k] += term.abs();
    };
    // the adjoint, backward
    let mut adj = vec![0.0; b * h * p * n];
    adj.copy_from_slice(&v.w_s);
    for bi in 0..b {
        for t in (0..l).rev() {
            for hi in 0..h {
                let (d, dt) = (decay(bi, t, hi), v.dt[(bi * l + t) * h + hi]);
                let bc = ((bi * l + t) * g + hi / r) * n;
                let ti = (bi * l + t) * h + hi;
                for pi in 0..p {
                    let xi = ti * p + pi;
                    let x = v.x[xi];
                    let gk = ((bi * h + hi) * p + pi) * n;
                    let (prev, now) = (at(bi, t, hi, pi), at(bi, t + 1, hi, pi));
                    for ni in 0..n {
                        // y_t's part of G_t, and C's gradient
                        add(&mut dc, &mut sc, bc + ni, v.w_y[xi] * states[now + ni]);
                        let gt = adj[gk + ni] + v.w_y[xi] * v.c[bc + ni];
                        add(&mut dx, &mut sx, xi, dt * gt * v.b[bc + ni]);
                        add(&mut db, &mut sb, bc + ni, dt * x * gt);
                        add(&mut ddt, &mut sdt, ti, gt * x * v.b[bc + ni]);
                        let through = gt * d * states[prev + ni];
                        add(&mut ddt, &mut sdt, ti, through * v.a[hi]);
                        add(&mut da, &mut sa, hi, through * dt);
                        adj[gk + ni] = gt * d;
                    }
                }
            }
        }
        if v.init.is_some() {
            for k in bi * h * p * n..(bi + 1) * h * p * n {
                add(&mut dinit, &mut sinit, k, adj[k]);
            }
        }
    }
    let mut out = vec![
        ("dx", dx, sx),
        ("ddt", ddt, sdt),
        ("dA", da, sa),
        ("dB", db, sb),
        ("dC", dc, sc),
    ];
    if v.init.is_some() {
        out.push(("dinit", dinit, sinit));
    }
    out
}

/// Compares a path's tensors with exact ones ([`recurrence_f64`], [`grads_f64`]): each
/// element's error relative to the larger of its tensor's largest magnitude and the sum of its
/// own terms' magnitudes.
fn compare_exact(what: &str, got: &Outputs, exact: &Exact, tol: f64) -> Result<f64, String> {
    let mut worst = 0.0f64;
    for (name, want, scale) in exact {
        let (_, g) = got
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("{name} missing"));
        let largest = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for ((a, w), s) in g.iter().zip(want).zip(scale) {
            let e = (a - w).abs() / largest.max(*s).max(1e-30);
            if e.is_nan() || e > tol {
                return Err(format!(
                    "{what}: {name} off by {e:.2e} of its scale (tolerance {tol:.0e})"
                ));
            }
            worst = worst.max(e);
        }
    }
    Ok(worst)
}

/// The part `[start, start + len)` of a `[b, l, ...]` tensor along `l`.
fn part<Bk: Backend, const D: usize>(t: &Tensor<Bk, D>, start: usize, len: usize) -> Tensor<Bk, D> {
    t.clone().narrow(1, start, len)
}

/// Every comparison of one case: each path against the exact values in `f64`; the worst
/// errors (of `y` and the states, of the gradients), or what failed.
fn check(case: &Case) -> Result<(f64, f64), String> {
    let v = Values::draw(case);
    let q = case.q;
    let exact = recurrence_f64(case, &v);
    let exact_grads = grads_f64(case, &v);
    let mut worst = 0.0f64;

    // the fused scan and the tensor operations, with gradients
    let leaves = Leaves::<B32>::new(case, &v);
    let (y, s) = ssd_chunked(leaves.input(q).fused_kernels(FusedKernels::Always));
    let fused = leaves.outputs(case, &v, y, s);
    worst = worst.max(compare_exact("fused", &fused, &exact, TOL)?);
    let mut worst_grads = compare_exact("fused gradients", &fused, &exact_grads, TOL)?;
    let leaves = Leaves::<B32>::new(case, &v);
    let (y, s) = ssd_chunked_tensor_ops(leaves.input(q));
    let ops = leaves.outputs(case, &v, y, s);
    worst = worst.max(compare_exact("tensor operations", &ops, &exact, TOL)?);
    let e = compare_exact("tensor operations' gradients", &ops, &exact_grads, TOL)?;
    worst_grads = worst_grads.max(e);

    // the sequential recurrence (forward only)
    let leaves = Leaves::<NdArray<f32>>::new_plain(case, &v);
    let (y, s) = ssd_sequential(leaves.input(q));
    let seq = vec![("y", host(y)), ("state", host(s))];
    worst = worst.max(compare_exact("sequential", &seq, &exact, TOL)?);

    // random pieces, each from the last one's state
    let mut rng = StdRng::seed_from_u64(case.seed ^ 0x5eed);
    let mut state = leaves.init.clone();
    let (mut ys, mut start) = (Vec::new(), 0);
    while start < case.l {
        let len = rng.random_range(1..=(case.l - start));
        let (y, s) = ssd_chunked(leaves.slice(start, len, state, q));
        ys.push(y);
        state = Some(s);
        start += len;
    }
    let pieces = vec![
        ("y", host(Tensor::cat(ys, 1))),
        ("state", host(state.expect("at least one piece"))),
    ];
    worst = worst.max(compare_exact("pieces", &pieces, &exact, TOL)?);

    // the chunked scan of all but the last k tokens, then k single steps
    let k = case.l.min(3);
    let head = case.l - k;
    let mut state = if head > 0 {
        ssd_chunked(leaves.slice(0, head, leaves.init.clone(), q)).1
    } else {
        let (b, h, p, n) = (case.b, case.h, case.p, case.n);
        (leaves.init.clone()).unwrap_or_else(|| Tensor::zeros([b, h, p, n], &Default::default()))
    };
    let mut ys = Vec::new();
    for t in head..case.l {
        let at = |x: &Tensor<NdArray<f32>, 4>| part(x, t, 1).squeeze_dim::<3>(1);
        if let Some(starts) = &leaves.starts {
            // no state flows across a document start
            let keep = part(starts, t, 1).neg().add_scalar(1.0);
            state = state * keep.reshape([case.b, 1, 1, 1]);
        }
        let dt = part(&leaves.dt, t, 1).squeeze_dim::<2>(1);
        let (y, s) = ssd_step(
            at(&leaves.x),
            dt,
            leaves.a.clone(),
            at(&leaves.b),
            at(&leaves.c),
            state,
        );
        ys.push(y.unsqueeze_dim::<4>(1));
        state = s;
    }
    let tail = vec![("y", host(Tensor::cat(ys, 1))), ("state", host(state))];
    // the exact values of the last k tokens of each row
    let per_row = |values: &[f64]| -> Vec<f64> {
        let width = case.h * case.p;
        (0..case.b)
            .flat_map(|bi| values[(bi * case.l + head) * width..(bi + 1) * case.l * width].to_vec())
            .collect()
    };
    let exact_tail: Exact = vec![
        ("y", per_row(&exact[0].1), per_row(&exact[0].2)),
        exact[1].clone(),
    ];
    worst = worst.max(compare_exact(
        "chunked then steps",
        &tail,
        &exact_tail,
        TOL,
    )?);
    Ok((worst, worst_grads))
}

impl Leaves<NdArray<f32>> {
    /// The fused scan's input of tokens `[start, start + len)`, from `state`.
    fn slice(
        &self,
        start: usize,
        len: usize,
        state: Option<Tensor<NdArray<f32>, 4>>,
        q: usize,
    ) -> SsdInput<NdArray<f32>> {
        SsdInput::new(
            part(&self.x, start, len),
            part(&self.dt, start, len),
            self.a.clone(),
            part(&self.b, start, len),
            part(&self.c, start, len),
            q,
        )
        .initial_state(state)
        .document_starts(self.starts.as_ref().map(|s| part(s, start, len)))
        .fused_kernels(FusedKernels::Always)
    }

    /// The inputs without autodiff.
    fn new_plain(case: &Case, v: &Values) -> Self {
        let Case {
            b, l, h, p, g, n, ..
        } = *case;
        Leaves {
            x: tensor(&v.x, [b, l, h, p]),
            dt: tensor(&v.dt, [b, l, h]),
            a: tensor(&v.a, [h]),
            b: tensor(&v.b, [b, l, g, n]),
            c: tensor(&v.c, [b, l, g, n]),
            init: v.init.as_ref().map(|s| tensor(s, [b, h, p, n])),
            starts: v.starts.as_ref().map(|s| tensor(s, [b, l])),
        }
    }
}

/// The smallest case that still fails `check`, from a failing one, and its failure.
fn shrink(
    mut case: Case,
    mut failure: String,
    check: impl Fn(&Case) -> Result<(f64, f64), String>,
) -> (Case, String) {
    'outer: loop {
        for smaller in case.smaller() {
            if let Err(e) = check(&smaller) {
                case = smaller;
                failure = e;
                continue 'outer;
            }
        }
        return (case, failure);
    }
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} must be a number, got {v:?}"))
        })
        .unwrap_or(default)
}

#[test]
fn random_ssd_cases_agree_on_every_path() {
    if let Ok(text) = std::env::var("MAMBA2_SSD_CASE") {
        let case = Case::parse(&text);
        match check(&case) {
            Ok((worst, worst64)) => {
                eprintln!(
                    "{}: worst {worst:.2e} (y, states), {worst64:.2e} (gradients)",
                    case.repro()
                )
            }
            Err(e) => panic!("{}: {e}", case.repro()),
        }
        return;
    }
    let seed = env_number("MAMBA2_SSD_SEED", SEED);
    let cases = env_number("MAMBA2_SSD_CASES", CASES as u64) as usize;
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut worst, mut worst64) = (0.0f64, 0.0f64);
    for i in 0..cases {
        let case = Case::draw(&mut rng);
        match check(&case) {
            Ok((w, w64)) => {
                worst = worst.max(w);
                worst64 = worst64.max(w64);
            }
            Err(e) => {
                let (small, e) = shrink(case, e, check);
                panic!(
                    "case {i} of seed {seed} failed ({}); smallest failing case: {e}\n\
                     reproduce: MAMBA2_SSD_CASE=\"{}\" cargo test --release --test suite ssd_random",
                    case.repro(),
                    small.repro()
                );
            }
        }
    }
    eprintln!(
        "{cases} random SSD cases (seed {seed}): worst errors against f64 {worst:.2e} (y, \
         states), {worst64:.2e} (gradients)"
    );
}

/// The fused scan on `Bk` with its intra-chunk products as `products`, `y`, the final state
/// and every gradient against the exact values in `f64`.
#[cfg(feature = "wgpu")]
fn check_fused<Bk: mamba2_burn::SsdAutodiffBackend>(
    case: &Case,
    products: mamba2_burn::ScanProducts,
) -> Result<(f64, f64), String> {
    let v = Values::draw(case);
    let leaves = Leaves::<Bk>::new(case, &v);
    let input = leaves
        .input(case.q)
        .fused_kernels(FusedKernels::Always)
        .scan_products(products);
    let (y, s) = ssd_chunked(input);
    let fused = leaves.outputs(case, &v, y, s);
    let what = format!("fused on Wgpu ({products:?} products)");
    Ok((
        compare_exact(&what, &fused, &recurrence_f64(case, &v), TOL)?,
        compare_exact(&what, &fused, &grads_f64(case, &v), TOL)?,
    ))
}

/// On Wgpu (lavapipe in CI's Wgpu stage): the fused scan's kernels with every gradient against
/// the exact values, for `WGPU_CASES` cases drawn as above (chunks of at most 256, the longest
/// the kernels take), each variant of the intra-chunk products in turn. Few, as each shape
/// compiles its own kernels there; `MAMBA2_SSD_WGPU_CASES` runs more.
#[cfg(feature = "wgpu")]
#[test]
#[ignore = "needs a device driver: run with -- --ignored"]
fn random_ssd_cases_agree_on_wgpu() {
    use mamba2_burn::ScanProducts;
    type W = Autodiff<burn::backend::Wgpu>;
    const WGPU_CASES: u64 = 6;
    let variants = [
        ScanProducts::Tiled,
        ScanProducts::Transient,
        ScanProducts::TensorCores,
    ];
    if let Ok(text) = std::env::var("MAMBA2_SSD_CASE") {
        // one case, every variant
        let case = Case::parse(&text);
        for products in variants {
            if let Err(e) = check_fused::<W>(&case, products) {
                panic!("{} ({products:?} products): {e}", case.repro());
            }
        }
        return;
    }
    let seed = env_number("MAMBA2_SSD_SEED", SEED);
    let cases = env_number("MAMBA2_SSD_WGPU_CASES", WGPU_CASES) as usize;
    let mut rng = StdRng::seed_from_u64(seed ^ 0x3c6e_f372);
    let (mut worst, mut worst64) = (0.0f64, 0.0f64);
    for i in 0..cases {
        let drawn = Case::draw(&mut rng);
        let case = Case {
            q: drawn.q.min(256),
            ..drawn
        };
        let products = variants[i % variants.len()];
        let check = |c: &Case| check_fused::<W>(c, products);
        match check(&case) {
            Ok((w, w64)) => {
                worst = worst.max(w);
                worst64 = worst64.max(w64);
            }
            Err(e) => {
                let (small, e) = shrink(case, e, check);
                panic!(
                    "Wgpu case {i} of seed {seed} ({products:?} products) failed ({}); smallest \
                     failing case: {e}\nreproduce: MAMBA2_SSD_CASE=\"{}\" cargo test --release \
                     --features wgpu --test suite ssd_random -- --ignored",
                    case.repro(),
                    small.repro()
                );
            }
        }
    }
    eprintln!(
        "{cases} random SSD cases on Wgpu (seed {seed}): worst errors against f64 {worst:.2e} \
         (y, states), {worst64:.2e} (gradients)"
    );
}
