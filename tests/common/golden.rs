//! Golden tests' machinery, shared by the Mamba-2 and the hybrid cases: the expected tensors
//! of a case, the comparisons and their report, the gradients by module path.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::module::{ModuleVisitor, Param};
use burn::store::{ModuleStore, SafetensorsStore};
use burn::tensor::{Int, Tensor, TensorData};
use mamba2_burn::{SsdAutodiffBackend, SsdBackend};

/// The largest relative errors a case may have.
#[derive(Clone, Copy)]
pub struct Tolerance {
    pub forward: f64,
    pub grad: f64,
}

/// In `f32` (and wider).
pub const F32_TOL: Tolerance = Tolerance {
    forward: 1e-4,
    grad: 1e-3,
};

/// Expected tensors of one case, by name.
pub struct Expected(pub BTreeMap<String, TensorData>);

impl Expected {
    pub fn read(path: &Path) -> Expected {
        let mut store = SafetensorsStore::from_file(path);
        let all = store
            .get_all_snapshots()
            .expect("readable expected.safetensors");
        Expected(
            all.iter()
                .map(|(k, v)| (k.clone(), v.to_data().expect("tensor data")))
                .collect(),
        )
    }

    pub fn get(&self, name: &str) -> Option<&TensorData> {
        self.0.get(name)
    }

    pub fn float<B: SsdBackend, const D: usize>(
        &self,
        name: &str,
        dev: &B::Device,
    ) -> Tensor<B, D> {
        let data = self
            .0
            .get(name)
            .unwrap_or_else(|| panic!("expected tensor {name}"));
        Tensor::from_data(data.clone().convert::<f32>(), dev)
    }

    pub fn int<B: SsdBackend, const D: usize>(
        &self,
        name: &str,
        dev: &B::Device,
    ) -> Tensor<B, D, Int> {
        let data = self
            .0
            .get(name)
            .unwrap_or_else(|| panic!("expected tensor {name}"));
        Tensor::from_data(data.clone().convert::<i64>(), dev)
    }
}

/// Records each comparison of a case and its relative error.
pub struct Report {
    pub tol: Tolerance,
    pub worst_forward: (f64, String),
    pub worst_grad: (f64, String),
    pub failures: Vec<String>,
    pub checked: usize,
}

pub fn values(data: TensorData) -> (Vec<usize>, Vec<f64>) {
    let shape = data.shape.to_vec();
    (
        shape,
        data.convert::<f64>().to_vec::<f64>().expect("f64 values"),
    )
}

impl Report {
    pub fn new(tol: Tolerance) -> Report {
        Report {
            tol,
            worst_forward: (0.0, String::new()),
            worst_grad: (0.0, String::new()),
            failures: Vec::new(),
            checked: 0,
        }
    }

    /// max |actual - expected| / max |expected|
    pub fn compare(&mut self, what: &str, actual: TensorData, expected: &TensorData, grad: bool) {
        let (shape_a, a) = values(actual);
        let (shape_e, e) = values(expected.clone());
        self.checked += 1;
        if shape_a != shape_e {
            self.failures
                .push(format!("{what}: shape {shape_a:?}, expected {shape_e:?}"));
            return;
        }
        let scale = e
            .iter()
            .fold(0.0f64, |m, v| m.max(v.abs()))
            .max(f64::MIN_POSITIVE);
        let err = a
            .iter()
            .zip(&e)
            .map(|(x, y)| {
                if x.is_finite() {
                    (x - y).abs()
                } else {
                    f64::INFINITY
                }
            })
            .fold(0.0f64, f64::max)
            / scale;
        let (tol, worst) = if grad {
            (self.tol.grad, &mut self.worst_grad)
        } else {
            (self.tol.forward, &mut self.worst_forward)
        };
        if err > worst.0 || worst.1.is_empty() {
            *worst = (err, what.to_string());
        }
        if !(err <= tol) {
            self.failures
                .push(format!("{what}: relative error {err:.3e} > {tol:e}"));
        }
    }
}

/// Collects the gradient of every float parameter, by module path.
pub struct GradCollector<'a, B: SsdAutodiffBackend> {
    pub grads: &'a B::Gradients,
    pub path: Vec<String>,
    pub out: BTreeMap<String, TensorData>,
}

impl<B: SsdAutodiffBackend> ModuleVisitor<B> for GradCollector<'_, B> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = param.grad(self.grads) {
            self.out.insert(self.path.join("."), g.into_data());
        }
    }
}

pub fn transpose(data: TensorData) -> TensorData {
    let (shape, v) = values(data);
    let (r, c) = (shape[0], shape[1]);
    let mut out = vec![0.0f64; v.len()];
    for i in 0..r {
        for j in 0..c {
            out[j * r + i] = v[i * c + j];
        }
    }
    TensorData::new(out, [c, r])
}

/// The gradient of every float parameter of `model`, by module path.
pub fn collect_grads<B: SsdAutodiffBackend, M: burn::module::Module<B>>(
    model: &M,
    grads: &B::Gradients,
) -> BTreeMap<String, TensorData> {
    let mut collector = GradCollector {
        grads,
        path: Vec::new(),
        out: BTreeMap::new(),
    };
    model.visit(&mut collector);
    collector.out
}

/// The case folders of `root` (each with config.json and expected.safetensors), sorted.
pub fn case_dirs(root: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap_or_else(|e| panic!("cannot read reference dir {}: {e}", root.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("expected.safetensors").is_file() && p.join("config.json").is_file())
        .collect();
    dirs.sort();
    dirs
}

/// Checks each case folder of `dirs` with `check`, printing its worst errors (to the real
/// stderr, so that the summary shows without `--nocapture`) as `{kind} case {case} on
/// {backend}`, and each failure; the names of the failed cases.
pub fn check_each(
    kind: &str,
    backend: &str,
    dirs: &[PathBuf],
    tol: Tolerance,
    mut check: impl FnMut(&Path, &Expected, &mut Report),
) -> Vec<String> {
    use std::io::Write;
    let mut failed = Vec::new();
    let mut stderr = std::io::stderr();
    for dir in dirs {
        let case = dir.file_name().unwrap().to_string_lossy().to_string();
        let expected = Expected::read(&dir.join("expected.safetensors"));
        let mut report = Report::new(tol);
        check(dir, &expected, &mut report);
        writeln!(
            stderr,
            "{kind} case {case} on {backend}: {} tensors; worst forward {:.2e} ({}), worst gradient {:.2e} ({})",
            report.checked, report.worst_forward.0, report.worst_forward.1, report.worst_grad.0, report.worst_grad.1
        )
        .unwrap();
        for f in &report.failures {
            writeln!(stderr, "  FAIL {case} on {backend}: {f}").unwrap();
        }
        if !report.failures.is_empty() {
            failed.push(case);
        }
    }
    failed
}
