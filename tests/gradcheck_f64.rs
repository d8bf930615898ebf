//! Gradient checks in f64 (`Autodiff<NdArray<f64>>`): autodiff gradients of the chunked SSD and
//! of the whole mixer against central differences, a training step spread over threads
//! against the whole batch's, and the hybrid models' packed documents against each document
//! alone.
//!
//! Tolerance of the finite differences: |autodiff - finite difference| <= 1e-6 x the largest
//! autodiff gradient of that tensor (central differences with step 1e-6 are accurate to about
//! 1e-9 here). The spread step: see [`REORDERED_SUM_TOL`].
//!
//! This file is its own test binary: the float type of the NdArray device is process-wide, and
//! it must be f64 before the first tensor exists.

mod common;

use std::sync::Once;

use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Int, Tensor, TensorData};
use common::golden::{case_dirs, collect_grads, Report, Tolerance};
use mamba2_burn::checkpoint::load_hybrid;
use mamba2_burn::hybrid::HybridLm;
use mamba2_burn::ssd::{ssd_chunked, ssd_chunked_tensor_ops, SsdInput};
use mamba2_burn::{Documents, Mamba2, Mamba2Config, Mamba2State};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type B = Autodiff<NdArray<f64>>;
const EPS: f64 = 1e-6;
const TOL: f64 = 1e-6;

fn dev() -> <B as burn::tensor::backend::BackendTypes>::Device {
    static INIT: Once = Once::new();
    let device = Default::default();
    INIT.call_once(|| {
        burn::tensor::set_default_dtypes::<NdArray<f64>>(&device, DType::F64, DType::I64)
            .expect("f64 must be set before any tensor exists");
    });
    device
}

fn tensor<const D: usize>(
    rng: &mut StdRng,
    shape: [usize; D],
    f: impl Fn(f64) -> f64,
) -> Tensor<B, D> {
    let n = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|_| f(rng.random::<f64>() * 2.0 - 1.0)).collect();
    Tensor::from_data(TensorData::new(v, shape), &dev())
}

fn scalar(t: Tensor<B, 1>) -> f64 {
    t.into_data().to_vec::<f64>().unwrap()[0]
}

fn values<const D: usize>(t: Tensor<NdArray<f64>, D>) -> Vec<f64> {
    t.into_data().to_vec::<f64>().unwrap()
}

fn perturbed<const D: usize>(t: &Tensor<B, D>, index: usize, delta: f64) -> Tensor<B, D> {
    let shape = t.dims();
    let mut v = vec![0.0; shape.iter().product()];
    v[index] = delta;
    t.clone() + Tensor::from_data(TensorData::new(v, shape), &dev())
}

/// Checks `grad` against central differences of `loss` at a few coordinates of a tensor.
fn check(
    what: &str,
    grad: &[f64],
    coords: &[usize],
    mut loss_at: impl FnMut(usize, f64) -> f64,
) -> f64 {
    let scale = grad.iter().fold(0.0f64, |m, g| m.max(g.abs()));
    let mut worst = 0.0f64;
    for &i in coords {
        let fd = (loss_at(i, EPS) - loss_at(i, -EPS)) / (2.0 * EPS);
        let err = (fd - grad[i]).abs() / scale.max(1e-12);
        assert!(
            err <= TOL,
            "{what}[{i}]: autodiff {} vs finite difference {fd} (relative {err:.2e})",
            grad[i]
        );
        worst = worst.max(err);
    }
    worst
}

fn coords(rng: &mut StdRng, len: usize, k: usize) -> Vec<usize> {
    (0..k).map(|_| rng.random_range(0..len)).collect()
}

#[test]
fn ssd_gradients_match_finite_differences() {
    let mut rng = StdRng::seed_from_u64(7);
    let (b, l, h, p, n, g, q) = (2, 11, 4, 3, 5, 2, 4);
    let x = tensor(&mut rng, [b, l, h, p], |u| u);
    let dt = tensor(&mut rng, [b, l, h], |u| 0.3 + 0.25 * u);
    let a = tensor(&mut rng, [h], |u| -(2.0 + u));
    let bm = tensor(&mut rng, [b, l, g, n], |u| u);
    let cm = tensor(&mut rng, [b, l, g, n], |u| u);
    let init = tensor(&mut rng, [b, h, p, n], |u| u);
    let wy = tensor(&mut rng, [b, l, h, p], |u| u);
    let ws = tensor(&mut rng, [b, h, p, n], |u| u);
    let loss = |x: Tensor<B, 4>,
                dt: Tensor<B, 3>,
                a: Tensor<B, 1>,
                bm: Tensor<B, 4>,
                cm: Tensor<B, 4>,
                s: Tensor<B, 4>| {
        let (y, fin) = ssd_chunked(SsdInput::new(x, dt, a, bm, cm, q).initial_state(s));
        (y * wy.clone()).sum() + (fin * ws.clone()).sum()
    };
    let [xg, bg, cg, sg] =
        [x.clone(), bm.clone(), cm.clone(), init.clone()].map(|t| t.require_grad());
    let (dtg, ag) = (dt.clone().require_grad(), a.clone().require_grad());
    let grads = loss(
        xg.clone(),
        dtg.clone(),
        ag.clone(),
        bg.clone(),
        cg.clone(),
        sg.clone(),
    )
    .backward();
    let grad4 = |t: &Tensor<B, 4>| values(t.grad(&grads).unwrap());
    let mut worst = 0.0f64;
    let f = |x, dt, a, bm, cm, s| scalar(loss(x, dt, a, bm, cm, s));
    let cx = coords(&mut rng, b * l * h * p, 8);
    worst = worst.max(check("x", &grad4(&xg), &cx, |i, d| {
        f(
            perturbed(&x, i, d),
            dt.clone(),
            a.clone(),
            bm.clone(),
            cm.clone(),
            init.clone(),
        )
    }));
    let cdt = coords(&mut rng, b * l * h, 8);
    worst = worst.max(check(
        "dt",
        &values(dtg.grad(&grads).unwrap()),
        &cdt,
        |i, d| {
            f(
                x.clone(),
                perturbed(&dt, i, d),
                a.clone(),
                bm.clone(),
                cm.clone(),
                init.clone(),
            )
        },
    ));
    worst = worst.max(check(
        "A",
        &values(ag.grad(&grads).unwrap()),
        &[0, 1, 2, 3],
        |i, d| {
            f(
                x.clone(),
                dt.clone(),
                perturbed(&a, i, d),
                bm.clone(),
                cm.clone(),
                init.clone(),
            )
        },
    ));
    let cb = coords(&mut rng, b * l * g * n, 8);
    worst = worst.max(check("B", &grad4(&bg), &cb, |i, d| {
        f(
            x.clone(),
            dt.clone(),
            a.clone(),
            perturbed(&bm, i, d),
            cm.clone(),
            init.clone(),
        )
    }));
    worst = worst.max(check("C", &grad4(&cg), &cb, |i, d| {
        f(
            x.clone(),
            dt.clone(),
            a.clone(),
            bm.clone(),
            perturbed(&cm, i, d),
            init.clone(),
        )
    }));
    let cs = coords(&mut rng, b * h * p * n, 8);
    worst = worst.max(check("initial state", &grad4(&sg), &cs, |i, d| {
        f(
            x.clone(),
            dt.clone(),
            a.clone(),
            bm.clone(),
            cm.clone(),
            perturbed(&init, i, d),
        )
    }));
    eprintln!("SSD finite-difference check: worst relative error {worst:.2e}");
}

/// Gradients of every float parameter, by path.
struct Grads<'a> {
    grads: &'a <B as AutodiffBackend>::Gradients,
    path: Vec<String>,
    out: Vec<(String, Vec<f64>)>,
}

impl ModuleVisitor<B> for Grads<'_> {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.push(name.into());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let g = param
            .grad(self.grads)
            .expect("every parameter has a gradient");
        self.out
            .push((self.path.join("."), g.into_data().to_vec::<f64>().unwrap()));
    }
}

/// Adds `delta` to element `index` of the parameter at `target`.
struct Perturb {
    target: String,
    index: usize,
    delta: f64,
    path: Vec<String>,
}

impl ModuleMapper<B> for Perturb {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.push(name.into());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.pop();
    }
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if self.path.join(".") == self.target {
            let (index, delta) = (self.index, self.delta);
            param.map(|t| perturbed(&t, index, delta))
        } else {
            param
        }
    }
}

/// The fused CPU scan (what `ssd_chunked` runs on NdArray) against the tensor operations in
/// f64: outputs, final states and every gradient within 1e-12 of the largest entry, over ragged
/// chunks, packed documents, initial states, several groups and strong decays.
#[test]
fn fused_scan_equals_the_tensor_operations_in_f64() {
    const EXACT: f64 = 1e-12;
    let mut rng = StdRng::seed_from_u64(11);
    // (b, l, h, p, n, g, q, dt scale, A scale, with starts)
    let cases = [
        (2, 11, 4, 3, 5, 2, 4, 0.3, 2.0, false),
        (1, 37, 3, 2, 4, 1, 8, 0.3, 2.0, true),
        (2, 40, 2, 3, 4, 1, 16, 2.0, 8.0, true),
        (1, 9, 2, 2, 3, 2, 1, 0.3, 2.0, true),
    ];
    for (k, &(b, l, h, p, n, g, q, dt_scale, a_scale, with_starts)) in cases.iter().enumerate() {
        let x = tensor(&mut rng, [b, l, h, p], |u| u);
        let dt = tensor(&mut rng, [b, l, h], |u| dt_scale * (0.51 + 0.49 * u));
        let a = tensor(&mut rng, [h], |u| -a_scale * (0.55 + 0.45 * u));
        let bm = tensor(&mut rng, [b, l, g, n], |u| u);
        let cm = tensor(&mut rng, [b, l, g, n], |u| u);
        let init = tensor(&mut rng, [b, h, p, n], |u| u);
        let starts = with_starts.then(|| {
            let v: Vec<f64> = (0..b * l)
                .map(|i| f64::from(u8::from(i % l == 0 || rng.random_bool(0.2))))
                .collect();
            Tensor::<B, 2>::from_data(TensorData::new(v, [b, l]), &dev())
        });
        let wy = tensor(&mut rng, [b, l, h, p], |u| u);
        let ws = tensor(&mut rng, [b, h, p, n], |u| u);
        let run = |fused: bool| {
            let leaves =
                [x.clone(), bm.clone(), cm.clone(), init.clone()].map(|t| t.require_grad());
            let (dtg, ag) = (dt.clone().require_grad(), a.clone().require_grad());
            let input = SsdInput::new(
                leaves[0].clone(),
                dtg.clone(),
                ag.clone(),
                leaves[1].clone(),
                leaves[2].clone(),
                q,
            )
            .initial_state(leaves[3].clone())
            .document_starts(starts.clone());
            let (y, fin) = if fused {
                ssd_chunked(input)
            } else {
                ssd_chunked_tensor_ops(input)
            };
            let grads =
                ((y.clone() * wy.clone()).sum() + (fin.clone() * ws.clone()).sum()).backward();
            let mut out = vec![values(y.inner()), values(fin.inner())];
            out.extend(leaves.iter().map(|t| values(t.grad(&grads).unwrap())));
            out.push(values(dtg.grad(&grads).unwrap()));
            out.push(values(ag.grad(&grads).unwrap()));
            out
        };
        let (fused, reference) = (run(true), run(false));
        let names = [
            "y",
            "final state",
            "dx",
            "dB",
            "dC",
            "d initial",
            "ddt",
            "dA",
        ];
        for ((name, f), r) in names.iter().zip(&fused).zip(&reference) {
            let scale = r.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let err = f
                .iter()
                .zip(r)
                .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                err <= EXACT * scale.max(1e-300),
                "case {k}: {name}: error {err:.3e} against a largest entry of {scale:.3e}"
            );
        }
    }
}

#[test]
fn mixer_gradients_match_finite_differences() {
    let mut rng = StdRng::seed_from_u64(11);
    let device = dev();
    let _rng = common::seeded(11);
    let config = Mamba2Config::new(8)
        .with_d_state(4)
        .with_headdim(4)
        .with_ngroups(2)
        .with_chunk_size(3)
        .with_bias(true);
    let mixer: Mamba2<B> = config.init(&device).unwrap();
    let (b, l) = (2, 7);
    let x = tensor(&mut rng, [b, l, 8], |u| u);
    let state = Mamba2State {
        conv: tensor(&mut rng, [b, mixer.conv_dim(), 4], |u| u),
        ssm: tensor(&mut rng, [b, mixer.nheads(), 4, 4], |u| u),
    };
    let wy = tensor(&mut rng, [b, l, 8], |u| u);
    let ws = tensor(&mut rng, [b, mixer.nheads(), 4, 4], |u| u);
    let loss = |m: &Mamba2<B>, x: Tensor<B, 3>| {
        let (y, s) = m.forward(x, Some(state.clone())).unwrap();
        (y * wy.clone()).sum() + (s.ssm * ws.clone()).sum()
    };

    let xg = x.clone().require_grad();
    let grads = loss(&mixer, xg.clone()).backward();
    let mut worst = check(
        "x",
        &values(xg.grad(&grads).unwrap()),
        &coords(&mut rng, b * l * 8, 8),
        |i, d| scalar(loss(&mixer, perturbed(&x, i, d))),
    );
    let mut visitor = Grads {
        grads: &grads,
        path: vec![],
        out: vec![],
    };
    mixer.visit(&mut visitor);
    let names: Vec<&str> = visitor.out.iter().map(|(n, _)| n.as_str()).collect();
    for expected in [
        "in_proj.weight",
        "in_proj.bias",
        "conv1d.weight",
        "conv1d.bias",
        "dt_bias",
        "a_log",
        "d",
        "norm.weight",
        "out_proj.weight",
        "out_proj.bias",
    ] {
        assert!(
            names.contains(&expected),
            "no gradient for {expected}: {names:?}"
        );
    }
    for (name, grad) in &visitor.out {
        let cs = coords(&mut rng, grad.len(), 6);
        worst = worst.max(check(name, grad, &cs, |i, d| {
            let m = mixer.clone().map(&mut Perturb {
                target: name.clone(),
                index: i,
                delta: d,
                path: vec![],
            });
            scalar(loss(&m, x.clone()))
        }));
    }
    eprintln!("mixer finite-difference check: worst relative error {worst:.2e}");
}

/// Collects every parameter's gradient in `grads`.
struct StepGrads<'a>(&'a GradientsParams, Vec<f64>);

impl ModuleVisitor<B> for StepGrads<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let grad = self
            .0
            .get::<NdArray<f64>, D>(param.id)
            .expect("a gradient for every parameter");
        self.1.extend(grad.into_data().to_vec::<f64>().unwrap());
    }
}

/// Every parameter's gradient of `model` in `grads`, in visiting order.
fn grads_of<M: Module<B>>(model: &M, grads: &GradientsParams) -> Vec<f64> {
    let mut visitor = StepGrads(grads, Vec::new());
    model.visit(&mut visitor);
    visitor.1
}

/// The whole batch and its slices compute the same sums in another order (the slices' losses
/// weighted and added, every weight gradient summed over fewer rows at a time), so in `f64`
/// they differ by rounding alone. A reordered sum of `k` terms moves by at most `k·u·Σ|terms|`
/// (`u = 2⁻⁵³`); with sums of at most 2¹² terms (batch · length · width here) and gradients
/// whose terms add up to at most 2¹⁰ times the largest gradient, that is below `2⁻³¹ ≈ 5e-10`
/// of the largest gradient. A slice weighted wrongly, or a lost row, is off by 1e-2 or more.
const REORDERED_SUM_TOL: f64 = 5e-10;

fn assert_close(a: &[f64], b: &[f64], what: &str) {
    assert_eq!(a.len(), b.len());
    let scale = a.iter().fold(0f64, |m, v| m.max(v.abs()));
    let worst = a.iter().zip(b).fold(0f64, |m, (x, y)| m.max((x - y).abs()));
    assert!(scale > 0.0, "{what}: all-zero gradients");
    eprintln!(
        "{what}: worst difference {:.2e} of the largest gradient",
        worst / scale
    );
    assert!(
        worst <= REORDERED_SUM_TOL * scale,
        "{what}: worst difference {worst:e} against largest gradient {scale}"
    );
}

#[test]
fn a_step_spread_over_threads_has_the_whole_batch_gradient() {
    use burn::data::dataloader::batcher::Batcher;
    use burn::tensor::{Distribution, Int, TensorData};
    use burn::train::TrainStep;
    use mamba2_burn::data::copy::{self, CopyConfig};
    use mamba2_burn::train::RegressionBatch;
    use mamba2_burn::{Mamba2BackboneConfig, Mamba2LmConfig, Mamba2RegressorConfig};

    let _rng = common::seeded(13);
    let copy_task = CopyConfig {
        vocab_size: 10,
        seq_len: 32,
        n_data: 4,
    };
    let mixer = Mamba2Config::new(32)
        .with_d_state(16)
        .with_headdim(16)
        .with_chunk_size(8);
    let lm = Mamba2LmConfig::new(Mamba2BackboneConfig::new(2, mixer), 10)
        .with_pad_vocab_size_multiple(8);
    // LM: 5 rows (slices of 2, 2 and 1 rows) with different numbers of scored positions
    let model = lm.init::<B>(&dev()).unwrap();
    let mut batch = mamba2_burn::train::SequenceBatcher {
        ignore_index: Some(copy::NOISE as usize),
    }
    .batch((0..5).map(|i| copy_task.example(3, i)).collect(), &dev());
    let [b, l] = batch.targets.dims();
    let mut targets = batch
        .targets
        .to_data()
        .convert::<i64>()
        .to_vec::<i64>()
        .unwrap();
    for t in targets.iter_mut().take(l + l / 2) {
        *t = copy::NOISE; // row 0 unscored, row 1 half scored
    }
    batch.targets = Tensor::<B, 2, Int>::from_data(TensorData::new(targets, [b, l]), &dev());
    // the step over 3 threads against the whole batch's: gradients, loss and logits
    let spread_equals_whole = |batch: mamba2_burn::train::LmBatch<B>, what: &str| {
        let whole = TrainStep::step(&model, batch.clone());
        let spread = TrainStep::step(&mamba2_burn::train::Threaded::new(model.clone(), 3), batch);
        assert_close(
            &grads_of(&model, &spread.grads),
            &grads_of(&model, &whole.grads),
            what,
        );
        let (spread_loss, whole_loss) = (
            spread.item.loss.clone().into_scalar(),
            whole.item.loss.clone().into_scalar(),
        );
        assert!((spread_loss - whole_loss).abs() <= REORDERED_SUM_TOL * whole_loss);
        assert_eq!(spread.item.logits.dims(), whole.item.logits.dims());
    };
    spread_equals_whole(batch, "LM gradients");

    // packed rows: each slice carries its own rows' documents
    let documents = [
        vec![10, 22],
        vec![32],
        vec![5, 5, 22],
        vec![32],
        vec![16, 16],
    ];
    let items = (0..5)
        .map(|i| {
            let mut item = copy_task.example(3, i);
            item.documents = documents[i as usize].clone();
            item
        })
        .collect();
    let packed = mamba2_burn::train::SequenceBatcher {
        ignore_index: Some(copy::NOISE as usize),
    }
    .batch(items, &dev());
    assert!(packed.documents.is_some());
    spread_equals_whole(packed, "packed LM gradients");

    // regressor: 4 rows over 2 threads
    let mixer = Mamba2Config::new(16).with_d_state(8).with_headdim(8);
    let model = Mamba2RegressorConfig::new(3, 2, Mamba2BackboneConfig::new(1, mixer))
        .init::<B>(&dev())
        .unwrap();
    let batch = RegressionBatch {
        inputs: Tensor::random([4, 12, 3], Distribution::Normal(0.0, 1.0), &dev()),
        targets: Tensor::random([4, 2], Distribution::Normal(0.0, 1.0), &dev()),
    };
    let whole = TrainStep::step(&model, batch.clone());
    let spread = TrainStep::step(&mamba2_burn::train::Threaded::new(model.clone(), 2), batch);
    assert_close(
        &grads_of(&model, &spread.grads),
        &grads_of(&model, &whole.grads),
        "regressor gradients",
    );
}

/// Packed documents (`forward_documents`) give each document the logits it has alone and, for
/// a loss over all of them, the gradients of every weight that the documents one by one give:
/// no Mamba state, convolution window or attention crosses a boundary, and rotary positions
/// restart. Every hybrid case (Mamba, attention, parallel, MLP and expert layers;
/// `MAMBA2_HYBRID_REFERENCE_DIR` replaces them), in f64: in f32 the packed and the one-by-one
/// sums round differently, and Nemotron-H's router gradient (its weights are normalised to a
/// constant sum, so the gradient is a difference of nearly equal terms) differed by 1.4e-5 of
/// its largest value on an AVX-512 machine and by 1.3e-4 on an AVX2-only AMD EPYC, whose matrix
/// products block their sums otherwise; a boundary crossed misses by 0.6 and more in either.
#[test]
fn packed_documents_equal_each_document_alone() {
    let dev = dev();
    let rows = [vec![7, 1, 12], vec![20]];
    let root = match std::env::var_os("MAMBA2_HYBRID_REFERENCE_DIR") {
        Some(dir) => std::path::PathBuf::from(dir),
        None => std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hybrid"),
    };
    let dirs = case_dirs(&root);
    assert!(!dirs.is_empty(), "no hybrid case in {}", root.display());
    for dir in dirs {
        let model: HybridLm<B> = load_hybrid(&dir, &dev).unwrap();
        let vocab = model.vocab_size() as i64;
        let ids: Vec<Vec<i64>> = (0..rows.len() as i64)
            .map(|r| (0..20).map(|t| (r * 31 + t * 7 + 3) % vocab).collect())
            .collect();
        let flat: Vec<i64> = ids.concat();
        let tensor = |v: Vec<i64>, len: usize| {
            let rows = v.len() / len;
            Tensor::<B, 2, Int>::from_data(TensorData::new(v, [rows, len]), &dev)
        };
        let documents = Documents::from_lengths(&rows, &dev).unwrap();
        let packed = model
            .forward_documents(tensor(flat, 20), Some(&documents))
            .unwrap();
        // a fixed weighting of every logit, so that the loss reaches every weight
        let weights = |n: usize| {
            let v: Vec<f64> = (0..n).map(|i| ((i * 13) % 7) as f64 - 3.0).collect();
            Tensor::<B, 1>::from_data(TensorData::new(v, [n]), &dev)
        };
        let n = packed.shape().num_elements();
        let w = weights(n).reshape(packed.dims());
        let packed_grads = (packed.clone() * w.clone()).sum().backward();
        let mut alone = Vec::new();
        let mut loss = Tensor::<B, 1>::zeros([1], &dev);
        for (r, lengths) in rows.iter().enumerate() {
            let mut start = 0;
            for &len in lengths {
                let doc = ids[r][start..start + len].to_vec();
                let logits = model.forward(tensor(doc, len), None).unwrap().0;
                let w_doc = w.clone().narrow(0, r, 1).narrow(1, start, len);
                loss = loss + (logits.clone() * w_doc).sum();
                alone.push((r, start, logits));
                start += len;
            }
        }
        let alone_grads = loss.backward();
        // the same values summed in other orders (the experts' batches, the matmuls' shapes)
        let mut report = Report::new(Tolerance {
            forward: 1e-5,
            grad: 1e-4,
        });
        for (r, start, logits) in alone {
            let len = logits.dims()[1];
            let got = packed.clone().narrow(0, r, 1).narrow(1, start, len);
            let what = format!("logits of row {r} from {start}");
            report.compare(&what, got.into_data(), &logits.into_data(), false);
        }
        let expected = collect_grads(&model, &alone_grads);
        for (name, grad) in collect_grads(&model, &packed_grads) {
            report.compare(&format!("grad {name}"), grad, &expected[&name], true);
        }
        assert!(
            report.failures.is_empty(),
            "{}: {:?}",
            dir.display(),
            report.failures
        );
    }
}
