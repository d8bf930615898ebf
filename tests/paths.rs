//! Agreement of the three SSD paths (chunked, sequential, step) and of the streaming API
//! (whole sequence, pieces, prefill + steps) on random configs, in f32.
//!
//! Tolerance: max abs error <= 1e-5 x the reference tensor's max magnitude.

mod common;

use burn::backend::NdArray;
use burn::tensor::activation::softplus;
use burn::tensor::{Distribution, Int, Tensor};
use mamba2_burn::ssd::{ssd_chunked, ssd_sequential, ssd_step};
use mamba2_burn::{
    DtLimit, Mamba2BackboneConfig, Mamba2Config, Mamba2LmConfig, Mamba2RegressorConfig, Mamba2State,
};

type B = NdArray<f32>;
const TOL: f64 = 1e-5;

fn dev() -> <B as burn::tensor::backend::BackendTypes>::Device {
    Default::default()
}

/// max |a - b| / max |b|
fn rel_err<const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> f64 {
    assert_eq!(a.dims(), b.dims(), "shapes differ");
    let scale: f32 = b.clone().abs().max().into_scalar();
    let err: f32 = (a - b).abs().max().into_scalar();
    err as f64 / (scale as f64).max(1e-30)
}

fn assert_close<const D: usize>(what: &str, a: Tensor<B, D>, b: Tensor<B, D>) -> f64 {
    let e = rel_err(a, b);
    assert!(e <= TOL, "{what}: relative error {e:.3e} > {TOL:e}");
    e
}

fn randn<const D: usize>(shape: [usize; D]) -> Tensor<B, D> {
    Tensor::random(shape, Distribution::Normal(0.0, 1.0), &dev())
}

struct SsdInputs {
    x: Tensor<B, 4>,
    dt: Tensor<B, 3>,
    a: Tensor<B, 1>,
    b: Tensor<B, 4>,
    c: Tensor<B, 4>,
    init: Option<Tensor<B, 4>>,
}

/// (b, l, h, p, n, g) with dt = softplus(N(0,1) - 1) and A = -U(1, 16).
fn ssd_inputs(b: usize, l: usize, h: usize, p: usize, n: usize, g: usize, init: bool) -> SsdInputs {
    SsdInputs {
        x: randn([b, l, h, p]),
        dt: softplus(randn([b, l, h]) - 1.0, 1.0),
        a: Tensor::random([h], Distribution::Uniform(1.0, 16.0), &dev()).neg(),
        b: randn([b, l, g, n]),
        c: randn([b, l, g, n]),
        init: init.then(|| randn([b, h, p, n])),
    }
}

fn slice_time<const D: usize>(t: &Tensor<B, D>, start: usize, len: usize) -> Tensor<B, D> {
    t.clone().narrow(1, start, len)
}

#[test]
fn chunked_ssd_matches_sequential_recurrence() {
    let _rng = common::seeded(1);
    // (b, l, h, p, n, g, q, initial state)
    let cases = [
        (2, 37, 4, 8, 16, 2, 8, true), // l not a multiple of q, g > 1, initial state
        (1, 5, 2, 4, 8, 1, 16, false), // l < q
        (2, 1, 2, 4, 8, 1, 8, true),   // l = 1
        (1, 64, 4, 8, 8, 4, 16, true), // l a multiple of q, g = h
        (1, 19, 3, 4, 4, 1, 1, true),  // q = 1
        (2, 130, 4, 16, 32, 2, 32, true), // several chunks
    ];
    let mut worst: f64 = 0.0;
    for (b, l, h, p, n, g, q, init) in cases {
        let i = ssd_inputs(b, l, h, p, n, g, init);
        let (y_seq, s_seq) = ssd_sequential(
            i.x.clone(),
            i.dt.clone(),
            i.a.clone(),
            i.b.clone(),
            i.c.clone(),
            i.init.clone(),
        );
        let (y_chk, s_chk) = ssd_chunked(
            i.x.clone(),
            i.dt.clone(),
            i.a.clone(),
            i.b.clone(),
            i.c.clone(),
            q,
            i.init.clone(),
        );
        let tag = format!("b={b} l={l} h={h} p={p} n={n} g={g} q={q} init={init}");
        worst = worst.max(assert_close(&format!("y, {tag}"), y_chk, y_seq.clone()));
        worst = worst.max(assert_close(&format!("final state, {tag}"), s_chk, s_seq));

        // chunk size does not change the result
        let (y_other, _) = ssd_chunked(i.x, i.dt, i.a, i.b, i.c, q + 3, i.init);
        worst = worst.max(assert_close(&format!("y with q+3, {tag}"), y_other, y_seq));
    }
    eprintln!("chunked vs sequential: worst relative error {worst:.2e}");
}

#[test]
fn chunked_ssd_continues_from_its_own_state() {
    let _rng = common::seeded(2);
    let (l, q) = (45, 8);
    let i = ssd_inputs(2, l, 4, 8, 16, 2, true);
    let (y_full, s_full) = ssd_chunked(
        i.x.clone(),
        i.dt.clone(),
        i.a.clone(),
        i.b.clone(),
        i.c.clone(),
        q,
        i.init.clone(),
    );
    for a in [1, 7, 8, 20] {
        let (y1, s1) = ssd_chunked(
            slice_time(&i.x, 0, a),
            slice_time(&i.dt, 0, a),
            i.a.clone(),
            slice_time(&i.b, 0, a),
            slice_time(&i.c, 0, a),
            q,
            i.init.clone(),
        );
        let rest = l - a;
        let (y2, s2) = ssd_chunked(
            slice_time(&i.x, a, rest),
            slice_time(&i.dt, a, rest),
            i.a.clone(),
            slice_time(&i.b, a, rest),
            slice_time(&i.c, a, rest),
            q,
            Some(s1),
        );
        assert_close(
            &format!("y, split at {a}"),
            Tensor::cat(vec![y1, y2], 1),
            y_full.clone(),
        );
        assert_close(&format!("state, split at {a}"), s2, s_full.clone());
    }
    // one step after the chunked prefix equals the chunked output at that position
    let a = 30;
    let (_, s1) = ssd_chunked(
        slice_time(&i.x, 0, a),
        slice_time(&i.dt, 0, a),
        i.a.clone(),
        slice_time(&i.b, 0, a),
        slice_time(&i.c, 0, a),
        q,
        i.init.clone(),
    );
    let at = |t: &Tensor<B, 4>| t.clone().narrow(1, a, 1).squeeze_dim::<3>(1);
    let (y_step, _) = ssd_step(
        at(&i.x),
        i.dt.clone().narrow(1, a, 1).squeeze_dim::<2>(1),
        i.a.clone(),
        at(&i.b),
        at(&i.c),
        s1,
    );
    assert_close(
        "step after chunked prefix",
        y_step,
        y_full.narrow(1, a, 1).squeeze_dim::<3>(1),
    );
}

/// Small mixer configs covering the options.
fn mixer_configs() -> Vec<Mamba2Config> {
    vec![
        Mamba2Config::new(16)
            .with_d_state(8)
            .with_headdim(8)
            .with_chunk_size(8),
        Mamba2Config::new(24)
            .with_d_state(16)
            .with_headdim(8)
            .with_ngroups(3)
            .with_chunk_size(5)
            .with_bias(true)
            .with_dt_limit(DtLimit {
                min: 0.01,
                max: 0.05,
            }),
        Mamba2Config::new(16)
            .with_d_state(4)
            .with_headdim(4)
            .with_ngroups(2)
            .with_d_conv(3)
            .with_chunk_size(16)
            .with_conv_bias(false)
            .with_d_has_hdim(true)
            .with_norm_before_gate(true),
        Mamba2Config::new(8)
            .with_d_state(8)
            .with_headdim(16)
            .with_chunk_size(4)
            .with_rmsnorm(false),
    ]
}

fn steps_of(
    mixer: &mamba2_burn::Mamba2<B>,
    x: &Tensor<B, 3>,
    mut state: Mamba2State<B>,
    from: usize,
) -> (Tensor<B, 3>, Mamba2State<B>) {
    let [_, l, _] = x.dims();
    let mut ys = Vec::new();
    for t in from..l {
        let (y, s) = mixer
            .step(x.clone().narrow(1, t, 1).squeeze_dim::<2>(1), state)
            .unwrap();
        ys.push(y);
        state = s;
    }
    (Tensor::stack(ys, 1), state)
}

#[test]
fn mixer_forward_pieces_and_steps_agree() {
    let _rng = common::seeded(3);
    let mut worst: f64 = 0.0;
    for (k, config) in mixer_configs().into_iter().enumerate() {
        let mixer = config.init::<B>(&dev()).unwrap();
        let (b, l) = (2, 23);
        let x = randn([b, l, config.d_model]);
        let (y_full, s_full) = mixer.forward(x.clone(), None).unwrap();

        // token by token from the zero state
        let (y_steps, s_steps) = steps_of(&mixer, &x, mixer.zero_state(b, &dev()), 0);
        worst = worst.max(assert_close(
            &format!("config {k}: steps vs forward"),
            y_steps,
            y_full.clone(),
        ));
        worst = worst.max(assert_close(
            &format!("config {k}: step ssm state"),
            s_steps.ssm,
            s_full.ssm.clone(),
        ));
        assert_close(
            &format!("config {k}: step conv state"),
            s_steps.conv,
            s_full.conv.clone(),
        );

        // forward(x[..a]) then forward(x[a..], state); and prefill then steps
        for a in [1, 2, config.chunk_size, config.chunk_size + 3, l - 1] {
            let (y1, s1) = mixer.forward(x.clone().narrow(1, 0, a), None).unwrap();
            let (y2, s2) = mixer
                .forward(x.clone().narrow(1, a, l - a), Some(s1.clone()))
                .unwrap();
            worst = worst.max(assert_close(
                &format!("config {k}: split at {a}"),
                Tensor::cat(vec![y1.clone(), y2], 1),
                y_full.clone(),
            ));
            assert_close(
                &format!("config {k}: split at {a}, ssm state"),
                s2.ssm,
                s_full.ssm.clone(),
            );
            assert_close(
                &format!("config {k}: split at {a}, conv state"),
                s2.conv,
                s_full.conv.clone(),
            );
            let (y_rest, _) = steps_of(&mixer, &x, s1, a);
            worst = worst.max(assert_close(
                &format!("config {k}: prefill {a} then steps"),
                Tensor::cat(vec![y1, y_rest], 1),
                y_full.clone(),
            ));
        }

        // a non-zero initial state: chunked forward vs steps from it
        let init = Mamba2State {
            conv: randn([b, mixer.conv_dim(), config.d_conv]),
            ssm: randn([b, mixer.nheads(), config.headdim, config.d_state]),
        };
        let (y_init, _) = mixer.forward(x.clone(), Some(init.clone())).unwrap();
        let (y_init_steps, _) = steps_of(&mixer, &x, init, 0);
        worst = worst.max(assert_close(
            &format!("config {k}: from a random state"),
            y_init_steps,
            y_init,
        ));
    }
    eprintln!("mixer paths: worst relative error {worst:.2e}");
}

#[test]
fn lm_prefill_then_steps_equals_full_forward() {
    let _rng = common::seeded(4);
    let mixer = Mamba2Config::new(16)
        .with_d_state(8)
        .with_headdim(8)
        .with_ngroups(2)
        .with_chunk_size(4);
    for tie in [true, false] {
        let config = Mamba2LmConfig::new(Mamba2BackboneConfig::new(2, mixer.clone()), 30)
            .with_pad_vocab_size_multiple(8)
            .with_tie_embeddings(tie);
        let lm = config.init::<B>(&dev()).unwrap();
        assert_eq!(lm.vocab_size(), 32);
        let ids: Tensor<B, 2, Int> =
            Tensor::random([2, 11], Distribution::Uniform(0.0, 30.0), &dev());
        let (full, _) = lm.forward(ids.clone(), None).unwrap();
        let a = 6;
        let (prefix, mut state) = lm.forward(ids.clone().narrow(1, 0, a), None).unwrap();
        let mut logits = vec![prefix];
        for t in a..11 {
            let (lt, s) = lm
                .step(ids.clone().narrow(1, t, 1).reshape([2]), state)
                .unwrap();
            logits.push(lt.unsqueeze_dim(1));
            state = s;
        }
        assert_close(
            &format!("LM tie={tie}: prefill + steps"),
            Tensor::cat(logits, 1),
            full,
        );
    }
}

#[test]
fn regressor_steps_equal_forward() {
    let _rng = common::seeded(5);
    let mixer = Mamba2Config::new(16)
        .with_d_state(8)
        .with_headdim(8)
        .with_chunk_size(8);
    let config = Mamba2RegressorConfig::new(5, 2, Mamba2BackboneConfig::new(2, mixer));
    let model = config.init::<B>(&dev()).unwrap();
    let x = randn([3, 20, 5]);
    let (y, _) = model.forward(x.clone(), None).unwrap();
    assert_eq!(y.dims(), [3, 20, 2]);
    let mut state = model.backbone.zero_state(3, &dev());
    let mut ys = Vec::new();
    for t in 0..20 {
        let (yt, s) = model
            .step(x.clone().narrow(1, t, 1).squeeze_dim::<2>(1), state)
            .unwrap();
        ys.push(yt);
        state = s;
    }
    assert_close("regressor steps", Tensor::stack(ys, 1), y);
}

/// The dedicated CPU step (`cpu::CpuBackbone`) equals the chunked forward token by token,
/// from the zero state and after a chunked prefill, on every mixer config (2 layers each).
#[test]
fn cpu_step_equals_forward() {
    use mamba2_burn::cpu::CpuBackbone;
    let _rng = common::seeded(11);
    let mut worst: f64 = 0.0;
    for (k, config) in mixer_configs().into_iter().enumerate() {
        let backbone = Mamba2BackboneConfig::new(2, config.clone())
            .init::<B>(&dev())
            .unwrap();
        let cpu = CpuBackbone::from_backbone(&backbone);
        let (b, l, d) = (2, 19, config.d_model);
        let x = randn([b, l, d]);
        let (y_full, _) = backbone.forward(x.clone(), None).unwrap();
        let prefill = config.chunk_size.min(l - 2) + 1;
        let (_, s_pre) = backbone
            .forward(x.clone().narrow(1, 0, prefill), None)
            .unwrap();
        for i in 0..b {
            let xs: Vec<f32> = x.clone().narrow(0, i, 1).into_data().to_vec().unwrap();
            let expected = y_full.clone().narrow(0, i, 1);
            for start in [0, prefill] {
                let mut state = if start == 0 {
                    cpu.zero_state()
                } else {
                    cpu.state_from(&backbone, &s_pre, i).unwrap()
                };
                let mut ys = vec![0.0f32; (l - start) * d];
                for t in start..l {
                    cpu.step(
                        &xs[t * d..(t + 1) * d],
                        &mut state,
                        &mut ys[(t - start) * d..(t - start + 1) * d],
                    )
                    .unwrap();
                }
                let got = Tensor::<B, 3>::from_data(
                    burn::tensor::TensorData::new(ys, [1, l - start, d]),
                    &dev(),
                );
                worst = worst.max(assert_close(
                    &format!("config {k}, sequence {i}: cpu steps from {start}"),
                    got,
                    expected.clone().narrow(1, start, l - start),
                ));
            }
        }
        // wrong sizes are errors, not panics
        let mut state = cpu.zero_state();
        let mut out = vec![0.0f32; d];
        assert!(cpu.step(&vec![0.0; d + 1], &mut state, &mut out).is_err());
        assert!(cpu.state_from(&backbone, &s_pre, b).is_err());
    }
    eprintln!("cpu step: worst relative error {worst:.2e}");
}

/// The two forms of the inter-chunk recurrence agree, and the chunked SSD past the matrix
/// form's chunk limit (the loop) still equals the sequential recurrence.
#[test]
fn state_passing_forms_agree() {
    use mamba2_burn::ssd::{
        state_passing_loop, state_passing_matrix, STATE_PASSING_MATRIX_MAX_CHUNKS,
    };
    let _rng = common::seeded(17);
    for c in [1, 5, 40] {
        let (b, g, r, p, n) = (2, 2, 3, 4, 5);
        let states = randn([b, c, g, r, p, n]);
        let decay = softplus(randn([b, g, r, c]), 1.0).neg();
        let init = randn([b, g, r, p, n]);
        let (e1, f1) = state_passing_matrix(states.clone(), decay.clone(), init.clone());
        let (e2, f2) = state_passing_loop(states, decay, init);
        assert_close(&format!("c = {c}: entering states"), e1, e2);
        assert_close(&format!("c = {c}: final state"), f1, f2);
    }
    let q = 2;
    let l = 2 * STATE_PASSING_MATRIX_MAX_CHUNKS + 3;
    let i = ssd_inputs(1, l, 4, 3, 5, 2, true);
    let (y1, s1) = ssd_chunked(
        i.x.clone(),
        i.dt.clone(),
        i.a.clone(),
        i.b.clone(),
        i.c.clone(),
        q,
        i.init.clone(),
    );
    let (y2, s2) = ssd_sequential(i.x, i.dt, i.a, i.b, i.c, i.init);
    assert_close("long chunked vs sequential: y", y1, y2);
    assert_close("long chunked vs sequential: state", s1, s2);
}

/// The intra-chunk decay matrix (`exp` of the stable segment sums, one product with a
/// triangular matrix), on a plain backend and under autodiff, against `exp(Σ a)` summed in f64,
/// on strongly decaying rows (segment sums down to about -250, so entries span the whole f32
/// range and underflow).
///
/// Tolerance: on every entry of the lower triangle above 1e-30 (segment sums `s` above -69),
/// relative error <= 1e-6 · (1 + |s|): `exp` turns an absolute error of the sum into a relative
/// one, and f32 rounds `s` to about 6e-8 · |s|, so this allows some 16 roundings of the sum (a
/// difference of two prefix sums, off by 6e-8 of the prefix, fails it at t = 256).
/// Entries below 1e-30 must stay below 2e-30; the upper triangle is exactly 1.
#[test]
fn decay_matrix_forms_match_f64_on_strong_decays() {
    use burn::backend::Autodiff;
    use mamba2_burn::ssd::decay_matrix;
    let _rng = common::seeded(23);
    for t in [64, 256] {
        let m = 6;
        let a: Tensor<B, 2> = Tensor::random([m, t], Distribution::Uniform(-2.0, 0.0), &dev());
        let a_host: Vec<f32> = a.to_data().to_vec().unwrap();
        let direct: Vec<f32> = decay_matrix(a.clone()).into_data().to_vec().unwrap();
        let tracked = Tensor::<Autodiff<B>, 2>::from_inner(a).require_grad();
        let stable: Vec<f32> = decay_matrix(tracked).inner().into_data().to_vec().unwrap();
        for (form, got) in [
            ("plain backend", &direct),
            ("autodiff backend", &stable),
        ] {
            let mut worst: f64 = 0.0;
            for row in 0..m {
                let a_row = &a_host[row * t..(row + 1) * t];
                for i in 0..t {
                    let mut sum = 0.0f64; // Σ_{k=j+1}^{i} a_k, growing as j goes down
                    for j in (0..t).rev() {
                        let v = got[(row * t + i) * t + j] as f64;
                        if j > i {
                            assert_eq!(v, 1.0, "{form}, t = {t}: [{i}, {j}] above the diagonal");
                            continue;
                        }
                        if j < i {
                            sum += a_row[j + 1] as f64;
                        }
                        let want = sum.exp();
                        if want > 1e-30 {
                            worst = worst.max((v - want).abs() / want / (1.0 + sum.abs()));
                        } else {
                            assert!(
                                v < 2e-30,
                                "{form}, t = {t}: [{i}, {j}] = {v:e}, want {want:e}"
                            );
                        }
                    }
                }
            }
            eprintln!(
                "decay matrix, {form}, t = {t}: worst relative error / (1 + |s|) {worst:.2e}"
            );
            assert!(
                worst <= 1e-6,
                "{form}, t = {t}: relative error / (1 + |s|) {worst:.3e} > 1e-6"
            );
        }
    }
}
