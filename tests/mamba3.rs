//! Mamba-3's golden cases (tests/fixtures/mamba3, copied from ../shared/reference/mamba3 and
//! made by its generator from mamba_ssm 2.3.2 in float64; its README defines the format). The
//! op-level SISO cases run through `trapezoidal_scan` on NdArray: the output, the state after the
//! last token (angles compared modulo 2π) and the gradient of `sum(y · w)` with respect to every
//! input, initial states included, at the case's chunk length and at two others (results do not
//! depend on it), within the Mamba-2 cases' `f32` tolerances (1e-4 of the largest value forward,
//! 1e-3 for gradients).
//!
//! The op-level MIMO cases likewise, with the ranks' projections and the norm before the gate;
//! the layer cases are in `mamba3_layer`.
//!
//! `MAMBA3_REFERENCE_DIR=DIR cargo test --release --test suite mamba3` checks the case folders in
//! DIR instead.

use std::f64::consts::PI;
use std::path::{Path, PathBuf};

use burn::backend::{Autodiff, NdArray};
use burn::tensor::{Tensor, TensorData};
use mamba2_burn::ssd::{
    trapezoidal_scan, Mimo, SsdAutodiffBackend, TrapezoidalInput, TrapezoidalState,
};

use crate::common::golden::{values, Expected, Report, F32_TOL};

pub(crate) type B = Autodiff<NdArray<f32>>;

pub(crate) fn mamba3_root() -> PathBuf {
    match std::env::var_os("MAMBA3_REFERENCE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mamba3"),
    }
}

/// `case.json` of a case folder.
pub(crate) fn case_json(dir: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("case.json")).expect("case.json");
    serde_json::from_str(&text).expect("case.json parses")
}

/// The case folders of `level` and `variant` (`op` / `layer`, `siso` / `mimo`), in name order.
pub(crate) fn cases(level: &str, variant: &str) -> Vec<PathBuf> {
    let root = mamba3_root();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", root.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|d| d.join("case.json").is_file() && d.join("expected.safetensors").is_file())
        .filter(|d| {
            let case = case_json(d);
            case["level"] == level && case["variant"] == variant
        })
        .collect();
    dirs.sort();
    assert!(
        !dirs.is_empty(),
        "no {level} {variant} case in {}",
        mamba3_root().display()
    );
    dirs
}

/// A leaf tensor of the case on `dev` that takes gradients.
pub(crate) fn leaf<A: SsdAutodiffBackend, const D: usize>(
    e: &Expected,
    name: &str,
    dev: &A::Device,
) -> Tensor<A, D> {
    e.float::<A, D>(name, dev).require_grad()
}

/// A leaf of the case that takes gradients, where the case has it (an optional input).
fn optional_leaf<A: SsdAutodiffBackend, const D: usize>(
    e: &Expected,
    name: &str,
    dev: &A::Device,
) -> Option<Tensor<A, D>> {
    e.get(name).map(|_| leaf::<A, D>(e, name, dev))
}

/// `actual` against `expected` modulo 2π: the wrapped difference, relative to 2π.
pub(crate) fn compare_angles(
    report: &mut Report,
    what: &str,
    actual: TensorData,
    expected: &TensorData,
) {
    let (_, a) = values(actual);
    let (_, e) = values(expected.clone());
    let err = a
        .iter()
        .zip(&e)
        .map(|(x, y)| ((x - y + PI).rem_euclid(2.0 * PI) - PI).abs())
        .fold(0.0f64, f64::max)
        / (2.0 * PI);
    report.checked += 1;
    if err > report.worst_forward.0 {
        report.worst_forward = (err, what.to_string());
    }
    if !(err <= report.tol.forward) {
        report
            .failures
            .push(format!("{what}: relative error {err:.3e} modulo 2π"));
    }
}

/// The chunk lengths an op case runs at: its own (`case.json`), 5 (chunks that do not divide
/// the sequence) and its whole length (one chunk).
fn op_lengths(dir: &Path) -> Vec<usize> {
    let case = case_json(dir);
    let chunk = case["chunk_size"].as_u64().unwrap() as usize;
    vec![chunk, 5, case["sizes"]["L"].as_u64().unwrap() as usize]
}

/// Runs `check` on each case folder at each chunk length `lengths` gives it; prints each case's
/// worst errors and fails naming every case with an error off its tolerance.
pub(crate) fn check_cases(
    dirs: Vec<PathBuf>,
    lengths: impl Fn(&Path) -> Vec<usize>,
    check: impl Fn(&Path, usize, &mut Report),
) {
    let mut failed = Vec::new();
    for dir in dirs {
        let mut report = Report::new(F32_TOL);
        for c in lengths(&dir) {
            check(&dir, c, &mut report);
        }
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        println!(
            "{name}: {} checks, worst forward {:.2e} ({}), worst gradient {:.2e} ({})",
            report.checked,
            report.worst_forward.0,
            report.worst_forward.1,
            report.worst_grad.0,
            report.worst_grad.1
        );
        if !report.failures.is_empty() {
            failed.push(format!("{name}: {}", report.failures.join("; ")));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// One op-level SISO case at chunk length `chunk`: every comparison into `report`.
pub(crate) fn check_siso_op<A: SsdAutodiffBackend>(
    dir: &Path,
    chunk: usize,
    report: &mut Report,
    dev: &A::Device,
) {
    let e = Expected::read(&dir.join("expected.safetensors"));
    let init_names = ["init.angle", "init.ssm", "init.k", "init.v"];
    let has_init = e.get("init.ssm").is_some();
    // [b, h, l] in the files, [b, l, h] in the scan
    let (adt, dt, trap) = (
        leaf::<A, 3>(&e, "ADT", dev),
        leaf::<A, 3>(&e, "DT", dev),
        leaf::<A, 3>(&e, "Trap", dev),
    );
    let (q, k, v, z) = (
        leaf::<A, 4>(&e, "Q", dev),
        leaf::<A, 4>(&e, "K", dev),
        leaf::<A, 4>(&e, "V", dev),
        optional_leaf::<A, 4>(&e, "Z", dev),
    );
    let (q_bias, k_bias, angles, d) = (
        leaf::<A, 2>(&e, "Q_bias", dev),
        leaf::<A, 2>(&e, "K_bias", dev),
        leaf::<A, 4>(&e, "Angles", dev),
        optional_leaf::<A, 1>(&e, "D", dev),
    );
    // a rank of 1 in the scan's layouts: biases [h, 1, n], the key state [b, 1, h, n]
    let rank_one = |t: Tensor<A, 2>| t.unsqueeze_dim::<3>(1);
    let init_k = has_init.then(|| leaf::<A, 3>(&e, "init.k", dev));
    let initial = has_init.then(|| TrapezoidalState {
        angle: leaf::<A, 3>(&e, "init.angle", dev),
        ssm: leaf::<A, 4>(&e, "init.ssm", dev),
        k: init_k.clone().unwrap().unsqueeze_dim::<4>(1),
        v: leaf::<A, 3>(&e, "init.v", dev),
    });
    let (y, state) = trapezoidal_scan(TrapezoidalInput {
        q: q.clone(),
        k: k.clone(),
        v: v.clone(),
        adt: adt.clone().swap_dims(1, 2),
        dt: dt.clone().swap_dims(1, 2),
        trap: trap.clone().swap_dims(1, 2),
        q_bias: rank_one(q_bias.clone()),
        k_bias: rank_one(k_bias.clone()),
        angles: angles.clone(),
        d: d.clone(),
        z: z.clone(),
        mimo: None,
        chunk_size: chunk,
        initial: initial.clone(),
    })
    .unwrap();
    let at = |what: &str| format!("chunk {chunk}: {what}");
    let expect = |name: &str| e.get(name).unwrap_or_else(|| panic!("{name}"));
    report.compare(&at("y"), y.clone().into_data(), expect("y"), false);
    compare_angles(
        report,
        &at("final.angle"),
        state.angle.into_data(),
        expect("final.angle"),
    );
    let [b, _, h, n] = state.k.dims();
    for (name, t) in [
        ("final.ssm", state.ssm.into_data()),
        ("final.k", state.k.reshape([b, h, n]).into_data()),
        ("final.v", state.v.into_data()),
    ] {
        report.compare(&at(name), t, expect(name), false);
    }

    let w = e.float::<A, 4>("w", dev);
    let loss = (y * w).sum();
    report.compare(&at("loss"), loss.clone().into_data(), expect("loss"), false);
    let grads = loss.backward();
    let mut leaves: Vec<(&str, TensorData)> = vec![
        ("Q", q.grad(&grads).unwrap().into_data()),
        ("K", k.grad(&grads).unwrap().into_data()),
        ("V", v.grad(&grads).unwrap().into_data()),
        ("ADT", adt.grad(&grads).unwrap().into_data()),
        ("DT", dt.grad(&grads).unwrap().into_data()),
        ("Trap", trap.grad(&grads).unwrap().into_data()),
        ("Q_bias", q_bias.grad(&grads).unwrap().into_data()),
        ("K_bias", k_bias.grad(&grads).unwrap().into_data()),
        ("Angles", angles.grad(&grads).unwrap().into_data()),
    ];
    leaves.extend(z.map(|z| ("Z", z.grad(&grads).unwrap().into_data())));
    leaves.extend(d.map(|d| ("D", d.grad(&grads).unwrap().into_data())));
    if let Some(init) = initial {
        let tensors = [
            init.angle.grad(&grads).map(|g| g.into_data()),
            init.ssm.grad(&grads).map(|g| g.into_data()),
            init_k.unwrap().grad(&grads).map(|g| g.into_data()),
            init.v.grad(&grads).map(|g| g.into_data()),
        ];
        for (name, g) in init_names.into_iter().zip(tensors) {
            leaves.push((name, g.expect("a gradient for each initial state")));
        }
    }
    for (name, g) in leaves {
        let expected = format!("grad.{name}");
        report.compare(&at(&expected), g, expect(&expected), true);
    }
}

/// Every op-level SISO case, at its chunk length, at 5 (chunks that do not divide the
/// sequence) and at its whole length (one chunk).
#[test]
fn siso_scan_cases() {
    check_cases(cases("op", "siso"), op_lengths, |dir, chunk, report| {
        check_siso_op::<B>(dir, chunk, report, &Default::default())
    });
}

/// One op-level MIMO case at chunk length `chunk`: every comparison into `report`.
pub(crate) fn check_mimo_op<A: SsdAutodiffBackend>(
    dir: &Path,
    chunk: usize,
    report: &mut Report,
    dev: &A::Device,
) {
    let e = Expected::read(&dir.join("expected.safetensors"));
    let case = case_json(dir);
    let (adt, dt, trap) = (
        leaf::<A, 3>(&e, "ADT", dev),
        leaf::<A, 3>(&e, "DT", dev),
        leaf::<A, 3>(&e, "Trap", dev),
    );
    // [b, l, r, g, n] in the files, [b, l, r·g, n] in the scan
    let (q, k) = (leaf::<A, 5>(&e, "Q", dev), leaf::<A, 5>(&e, "K", dev));
    let [b, l, r, g, n] = q.dims();
    let (v, z, angles, d) = (
        leaf::<A, 4>(&e, "V", dev),
        optional_leaf::<A, 4>(&e, "Z", dev),
        leaf::<A, 4>(&e, "Angles", dev),
        optional_leaf::<A, 1>(&e, "D", dev),
    );
    let (q_bias, k_bias) = (
        leaf::<A, 3>(&e, "Q_bias", dev),
        leaf::<A, 3>(&e, "K_bias", dev),
    );
    let (mimo_v, mimo_z, mimo_out) = (
        leaf::<A, 3>(&e, "MIMO_V", dev),
        optional_leaf::<A, 3>(&e, "MIMO_Z", dev),
        leaf::<A, 3>(&e, "MIMO_Out", dev),
    );
    let norm_weight = optional_leaf::<A, 2>(&e, "norm_weight", dev);
    let eps = case["norm_eps"].as_f64().unwrap_or(1e-5);
    let (y, state) = trapezoidal_scan(TrapezoidalInput {
        q: q.clone().reshape([b, l, r * g, n]),
        k: k.clone().reshape([b, l, r * g, n]),
        v: v.clone(),
        adt: adt.clone().swap_dims(1, 2),
        dt: dt.clone().swap_dims(1, 2),
        trap: trap.clone().swap_dims(1, 2),
        q_bias: q_bias.clone(),
        k_bias: k_bias.clone(),
        angles: angles.clone(),
        d: d.clone(),
        z: z.clone(),
        mimo: Some(Mimo {
            x: mimo_v.clone(),
            // without a gate there is no gate's projection
            z: mimo_z.clone().unwrap_or_else(|| mimo_v.ones_like()),
            out: mimo_out.clone(),
            norm: norm_weight.clone().map(|w| (w, eps)),
        }),
        chunk_size: chunk,
        initial: None,
    })
    .unwrap();
    let at = |what: &str| format!("chunk {chunk}: {what}");
    let expect = |name: &str| e.get(name).unwrap_or_else(|| panic!("{name}"));
    report.compare(&at("y"), y.clone().into_data(), expect("y"), false);
    compare_angles(
        report,
        &at("final.angle"),
        state.angle.into_data(),
        expect("final.angle"),
    );
    for (name, t) in [
        ("final.ssm", state.ssm.into_data()),
        ("final.k", state.k.into_data()),
        ("final.v", state.v.into_data()),
    ] {
        report.compare(&at(name), t, expect(name), false);
    }
    let w = e.float::<A, 4>("w", dev);
    let loss = (y * w).sum();
    report.compare(&at("loss"), loss.clone().into_data(), expect("loss"), false);
    let grads = loss.backward();
    let mut leaves: Vec<(&str, TensorData)> = vec![
        ("Q", q.grad(&grads).unwrap().into_data()),
        ("K", k.grad(&grads).unwrap().into_data()),
        ("V", v.grad(&grads).unwrap().into_data()),
        ("ADT", adt.grad(&grads).unwrap().into_data()),
        ("DT", dt.grad(&grads).unwrap().into_data()),
        ("Trap", trap.grad(&grads).unwrap().into_data()),
        ("Q_bias", q_bias.grad(&grads).unwrap().into_data()),
        ("K_bias", k_bias.grad(&grads).unwrap().into_data()),
        ("Angles", angles.grad(&grads).unwrap().into_data()),
        ("MIMO_V", mimo_v.grad(&grads).unwrap().into_data()),
        ("MIMO_Out", mimo_out.grad(&grads).unwrap().into_data()),
    ];
    leaves.extend(z.map(|z| ("Z", z.grad(&grads).unwrap().into_data())));
    leaves.extend(d.map(|d| ("D", d.grad(&grads).unwrap().into_data())));
    leaves.extend(mimo_z.map(|m| ("MIMO_Z", m.grad(&grads).unwrap().into_data())));
    if let Some(w) = norm_weight {
        leaves.push(("norm_weight", w.grad(&grads).unwrap().into_data()));
    }
    for (name, g) in leaves {
        let expected = format!("grad.{name}");
        report.compare(&at(&expected), g, expect(&expected), true);
    }
}

/// Every op-level MIMO case (ranks 2 and 4, the half-split rotation, the per-rank gate and
/// output, the fused norm), at its chunk length, at 5 and at its whole length.
#[test]
fn mimo_scan_cases() {
    check_cases(cases("op", "mimo"), op_lengths, |dir, chunk, report| {
        check_mimo_op::<B>(dir, chunk, report, &Default::default())
    });
}
