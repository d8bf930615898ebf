// The backend-neutral path tests, included once per backend by `tests/paths.rs`, in a module
// that defines `B` (the backend), `NAME`, `dev()`, `TOL` (the largest relative error of a
// comparison of outputs or states, `max |a - b| <= TOL · max |b|`), `GRAD_TOL` (that of a
// comparison of gradients) and `case!` (a test on that backend: `#[test]`,
// and ignored unless asked for where the backend needs a device driver). Random inputs are drawn on NdArray from a
// seeded generator and copied to `B`, so every backend sees the same numbers; models are
// initialised on `B` after seeding it.

use burn::backend::Autodiff;
use burn::module::AutodiffModule;
use burn::tensor::activation::softplus;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Int, Tensor, TensorData};
use mamba2_burn::ssd::{ssd_chunked, ssd_sequential, ssd_step, SsdInput};
use mamba2_burn::{
    DtLimit, Mamba2BackboneConfig, Mamba2Config, Mamba2LmConfig, Mamba2RegressorConfig, Mamba2State,
};

/// Seeds NdArray's generator (the inputs) and `B`'s (the weights), held for the test.
fn seeded(seed: u64) -> std::sync::MutexGuard<'static, ()> {
    let guard = crate::common::seeded(seed);
    B::seed(&dev(), seed);
    guard
}

/// A random tensor drawn on NdArray, on `B`.
fn random<const D: usize>(shape: [usize; D], distribution: Distribution) -> Tensor<B, D> {
    let t = Tensor::<burn::backend::NdArray<f32>, D>::random(shape, distribution, &Default::default());
    Tensor::from_data(t.into_data(), &dev())
}

/// Random token ids in `0..vocab`, drawn on NdArray, on `B`.
fn random_ids(shape: [usize; 2], vocab: usize) -> Tensor<B, 2, Int> {
    let ids: Vec<i32> = random(shape, Distribution::Uniform(0.0, vocab as f64))
        .into_data()
        .to_vec::<f32>()
        .unwrap()
        .into_iter()
        .map(|v| (v as i32).min(vocab as i32 - 1))
        .collect();
    Tensor::from_data(TensorData::new(ids, shape), &dev())
}

/// max |a - b| / max |b|
fn rel_err<const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> f64 {
    assert_eq!(a.dims(), b.dims(), "shapes differ");
    let scale: f32 = b.clone().abs().max().into_scalar();
    let err: f32 = (a - b).abs().max().into_scalar();
    err as f64 / (scale as f64).max(1e-30)
}

fn assert_close<const D: usize>(what: &str, a: Tensor<B, D>, b: Tensor<B, D>) -> f64 {
    assert_within(what, a, b, TOL)
}

/// [`assert_close`] for gradients, within `GRAD_TOL`.
fn assert_grad_close<const D: usize>(what: &str, a: Tensor<B, D>, b: Tensor<B, D>) -> f64 {
    assert_within(what, a, b, GRAD_TOL)
}

fn assert_within<const D: usize>(what: &str, a: Tensor<B, D>, b: Tensor<B, D>, tol: f64) -> f64 {
    let e = rel_err(a, b);
    assert!(e <= tol, "{what}: relative error {e:.3e} > {tol:e}");
    e
}

fn randn<const D: usize>(shape: [usize; D]) -> Tensor<B, D> {
    random(shape, Distribution::Normal(0.0, 1.0))
}

struct SsdDraws {
    x: Tensor<B, 4>,
    dt: Tensor<B, 3>,
    a: Tensor<B, 1>,
    b: Tensor<B, 4>,
    c: Tensor<B, 4>,
    init: Option<Tensor<B, 4>>,
}

/// (b, l, h, p, n, g) with dt = softplus(N(0,1) - 1) and A = -U(1, 16).
fn ssd_inputs(b: usize, l: usize, h: usize, p: usize, n: usize, g: usize, init: bool) -> SsdDraws {
    SsdDraws {
        x: randn([b, l, h, p]),
        dt: softplus(randn([b, l, h]) - 1.0, 1.0),
        a: random([h], Distribution::Uniform(1.0, 16.0)).neg(),
        b: randn([b, l, g, n]),
        c: randn([b, l, g, n]),
        init: init.then(|| randn([b, h, p, n])),
    }
}

impl SsdDraws {
    /// These inputs, from their initial state, in chunks of `q`.
    fn input(&self, q: usize) -> SsdInput<B> {
        let (x, dt, a) = (self.x.clone(), self.dt.clone(), self.a.clone());
        SsdInput::new(x, dt, a, self.b.clone(), self.c.clone(), q)
            .initial_state(self.init.clone())
    }

    /// The tokens `[start, start + len)`, with the same initial state.
    fn slice(&self, start: usize, len: usize) -> SsdDraws {
        SsdDraws {
            x: slice_time(&self.x, start, len),
            dt: slice_time(&self.dt, start, len),
            a: self.a.clone(),
            b: slice_time(&self.b, start, len),
            c: slice_time(&self.c, start, len),
            init: self.init.clone(),
        }
    }
}

fn slice_time<const D: usize>(t: &Tensor<B, D>, start: usize, len: usize) -> Tensor<B, D> {
    t.clone().narrow(1, start, len)
}

case! {
    fn chunked_ssd_matches_sequential_recurrence() {
        let _rng = seeded(1);
        // (b, l, h, p, n, g, q, initial state)
        let cases = [
            (2, 37, 4, 8, 16, 2, 8, true), // l not a multiple of q, g > 1, initial state
            (1, 5, 2, 4, 8, 1, 16, false), // l < q
            (2, 1, 2, 4, 8, 1, 8, true),   // l = 1
            (1, 64, 4, 8, 8, 4, 16, true), // l a multiple of q, g = h
            (1, 19, 3, 4, 4, 1, 1, true),  // q = 1
            (2, 130, 4, 16, 32, 2, 32, true), // several chunks
            (2, 23, 1, 16, 8, 1, 4, true),    // one head
        ];
        let mut worst: f64 = 0.0;
        for (b, l, h, p, n, g, q, init) in cases {
            let i = ssd_inputs(b, l, h, p, n, g, init);
            let (y_seq, s_seq) = ssd_sequential(i.input(q));
            let (y_chk, s_chk) = ssd_chunked(i.input(q));
            let tag = format!("b={b} l={l} h={h} p={p} n={n} g={g} q={q} init={init}");
            worst = worst.max(assert_close(&format!("y, {tag}"), y_chk, y_seq.clone()));
            worst = worst.max(assert_close(&format!("final state, {tag}"), s_chk, s_seq));

            // chunk size does not change the result
            let (y_other, _) = ssd_chunked(i.input(q + 3));
            worst = worst.max(assert_close(&format!("y with q+3, {tag}"), y_other, y_seq));
        }
        eprintln!("chunked vs sequential: worst relative error {worst:.2e}");
    }
}

case! {
    fn chunked_ssd_continues_from_its_own_state() {
        let _rng = seeded(2);
        let (l, q) = (45, 8);
        let i = ssd_inputs(2, l, 4, 8, 16, 2, true);
        let (y_full, s_full) = ssd_chunked(i.input(q));
        for a in [1, 7, 8, 20] {
            let (y1, s1) = ssd_chunked(i.slice(0, a).input(q));
            let rest = l - a;
            let (y2, s2) = ssd_chunked(i.slice(a, rest).input(q).initial_state(s1));
            assert_close(
                &format!("y, split at {a}"),
                Tensor::cat(vec![y1, y2], 1),
                y_full.clone(),
            );
            assert_close(&format!("state, split at {a}"), s2, s_full.clone());
        }
        // one step after the chunked prefix equals the chunked output at that position
        let a = 30;
        let (_, s1) = ssd_chunked(i.slice(0, a).input(q));
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

case! {
    fn mixer_forward_pieces_and_steps_agree() {
        let _rng = seeded(3);
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
}

case! {
    fn lm_prefill_then_steps_equals_full_forward() {
        let _rng = seeded(4);
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
            let ids: Tensor<B, 2, Int> = random_ids([2, 11], 30);
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
}

case! {
    fn regressor_steps_equal_forward() {
        let _rng = seeded(5);
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
}

case! {
    /// The chunked SSD past the chunk limit of the inter-chunk recurrence's matrix form (where it
    /// switches to the loop) still equals the sequential recurrence.
    fn chunked_ssd_past_the_state_passing_matrix_limit() {
        let _rng = seeded(17);
        let q = 2;
        // 128 chunks: `ssd::STATE_PASSING_MATRIX_MAX_CHUNKS`
        let l = 2 * 128 + 3;
        let i = ssd_inputs(1, l, 4, 3, 5, 2, true);
        let (y1, s1) = ssd_chunked(i.input(q));
        let (y2, s2) = ssd_sequential(i.input(q));
        assert_close("long chunked vs sequential: y", y1, y2);
        assert_close("long chunked vs sequential: state", s1, s2);
    }
}

case! {
    /// The gradients of the chunked SSD (loss: a fixed random weighting of `y` and of the final
    /// state) equal those of the sequential recurrence, for x, dt, A, B, C and the initial state,
    /// with one and with several heads per group, `l` not a multiple of `q`.
    fn chunked_ssd_gradients_equal_the_sequential_recurrence() {
        type A = Autodiff<B>;
        let _rng = seeded(29);
        // (b, l, h, p, n, g, q): r = 1 with b > 1 is the layout a view reshape got wrong on
        // burn-cubecl (see `ssd_chunked`'s chunk totals)
        let cases = [(2, 21, 4, 8, 8, 4, 8), (2, 30, 4, 4, 8, 2, 8), (1, 9, 2, 4, 4, 1, 4)];
        let mut worst: f64 = 0.0;
        for (b, l, h, p, n, g, q) in cases {
            let i = ssd_inputs(b, l, h, p, n, g, true);
            let w_y: Tensor<A, 4> = Tensor::from_inner(randn([b, l, h, p]));
            let w_s: Tensor<A, 4> = Tensor::from_inner(randn([b, h, p, n]));
            let grads = |chunked: bool| {
                let track = |t: Tensor<B, 4>| Tensor::<A, 4>::from_inner(t).require_grad();
                let x = track(i.x.clone());
                let dt = Tensor::<A, 3>::from_inner(i.dt.clone()).require_grad();
                let a = Tensor::<A, 1>::from_inner(i.a.clone()).require_grad();
                let (bm, cm) = (track(i.b.clone()), track(i.c.clone()));
                let init = track(i.init.clone().unwrap());
                let input = SsdInput::new(x.clone(), dt.clone(), a.clone(), bm.clone(), cm.clone(), q)
                    .initial_state(init.clone());
                let (y, s) = if chunked {
                    ssd_chunked(input)
                } else {
                    ssd_sequential(input)
                };
                let g = ((y * w_y.clone()).sum() + (s * w_s.clone()).sum()).backward();
                let flat = |t: Option<Tensor<B, 4>>| t.unwrap().reshape([-1]);
                vec![
                    ("x", flat(x.grad(&g))),
                    ("dt", dt.grad(&g).unwrap().reshape([-1])),
                    ("A", a.grad(&g).unwrap()),
                    ("B", flat(bm.grad(&g))),
                    ("C", flat(cm.grad(&g))),
                    ("initial state", flat(init.grad(&g))),
                ]
            };
            let tag = format!("b={b} l={l} h={h} g={g} q={q}");
            for ((name, got), (_, want)) in grads(true).into_iter().zip(grads(false)) {
                worst = worst.max(assert_grad_close(&format!("grad {name}, {tag}"), got, want));
            }
        }
        eprintln!("{NAME}: chunked vs sequential gradients: worst relative error {worst:.2e}");
    }
}

case! {
    /// After every observation, the streaming forecast (the CPU stream built from this backend's
    /// model) equals the batch forward over the whole history so far, in both channel modes.
    fn streaming_forecaster_equals_batch_forward_at_every_step() {
        use mamba2_burn::{Mamba2Forecaster, Mamba2ForecasterConfig, StreamingForecaster};
        let _rng = seeded(5);
        let mut worst: f64 = 0.0;
        for (ci, n_out) in [(true, 3), (false, 2)] {
            let mixer = Mamba2Config::new(16)
                .with_d_state(8)
                .with_headdim(8)
                .with_chunk_size(8);
            let model: Mamba2Forecaster<B> =
                Mamba2ForecasterConfig::new(3, n_out, 6, Mamba2BackboneConfig::new(1, mixer))
                    .with_channel_independent(ci)
                    .with_revin(false)
                    .init(&dev())
                    .unwrap();
            let mut stream = StreamingForecaster::new(&model).unwrap();
            let t_len = 21; // beyond two chunks of 8
            let x = randn([1, t_len, 3]);
            let rows: Vec<f32> = x.clone().into_data().to_vec().unwrap();
            for t in 0..t_len {
                let got = stream.push(&rows[t * 3..(t + 1) * 3]).unwrap().to_vec();
                let n = got.len();
                let got = Tensor::<B, 1>::from_data(TensorData::new(got, [n]), &dev());
                let expected = model
                    .forward(x.clone().narrow(1, 0, t + 1))
                    .unwrap()
                    .reshape([-1]);
                worst = worst.max(assert_close(
                    &format!("channel_independent={ci}, step {t}"),
                    got,
                    expected,
                ));
            }
        }
        eprintln!("{NAME}: streaming forecaster: worst relative error {worst:.2e}");
    }
}

case! {
    /// A short `train_lm` run with Burn's Learner on this backend (selective copying, 2 epochs of
    /// 4 steps) lowers the held-out loss by more than 0.1 nat and writes a model that loads back.
    fn learner_run_lowers_the_loss() {
        use crate::common::{copy_data as data, copy_lm_config};
        use mamba2_burn::train::{evaluate_lm, train_lm, ProgressMode};
        let config = copy_lm_config(2, 5e-3);
        let dir = tempfile::tempdir().unwrap();
        let _rng = seeded(config.run.seed);
        let initial = config.model.init::<B>(&dev()).unwrap();
        let before = evaluate_lm(&initial, &data(3, 64), 32, Some(0), 1, &dev()).unwrap();
        let trained = train_lm::<Autodiff<B>, _, _, _>(
            &config,
            data(1, 64),
            data(2, 32),
            dir.path(),
            false,
            ProgressMode::Plain,
            &dev(),
        )
        .unwrap();
        let after = evaluate_lm(&trained, &data(3, 64), 32, Some(0), 1, &dev()).unwrap();
        eprintln!("{NAME}: learner run: held-out loss {:.4} -> {:.4}", before.loss, after.loss);
        assert!(
            after.loss < before.loss - 0.1,
            "{NAME}: loss did not fall: {} -> {}",
            before.loss,
            after.loss
        );
        let loaded = mamba2_burn::load_lm::<B>(dir.path().join("model"), &dev()).unwrap();
        let reloaded = evaluate_lm(&loaded, &data(3, 64), 32, Some(0), 1, &dev()).unwrap();
        assert_eq!(reloaded.loss, after.loss, "{NAME}: the saved model scores differently");
    }
}

/// The documents of the packed tests: row 0 holds a document shorter than the convolution
/// window, one of a single token and boundaries inside and on the edges of chunks; row 1 one
/// document.
fn packed_rows(l: usize) -> Vec<Vec<usize>> {
    assert!(l >= 9);
    vec![vec![5, 1, l - 9, 3], vec![l]]
}

case! {
    /// Packed rows through the chunked SSD equal the sequential recurrence, whose state is
    /// dropped at every document start.
    fn packed_ssd_chunked_matches_sequential() {
        use mamba2_burn::Documents;
        let _rng = seeded(41);
        let mut worst: f64 = 0.0;
        // (l, h, p, n, g, q)
        for (l, h, p, n, g, q) in [(29, 4, 8, 8, 2, 8), (14, 2, 4, 4, 1, 3), (40, 3, 4, 8, 1, 16)] {
            let i = ssd_inputs(2, l, h, p, n, g, true);
            let starts = Documents::<B>::from_lengths(&packed_rows(l), &dev()).unwrap().starts();
            let (y_seq, s_seq) = ssd_sequential(i.input(q).document_starts(starts.clone()));
            let (y, s) = ssd_chunked(i.input(q).document_starts(starts));
            let tag = format!("l={l} h={h} g={g} q={q}");
            worst = worst.max(assert_close(&format!("packed y, {tag}"), y, y_seq));
            worst = worst.max(assert_close(&format!("packed final state, {tag}"), s, s_seq));
        }
        eprintln!("{NAME}: packed chunked vs sequential: worst relative error {worst:.2e}");
    }
}

case! {
    /// A packed batch through the mixer gives every document the outputs, final state and
    /// gradients (inputs and every parameter) it gets when run alone; the state passed in
    /// continues each row's first document. The recurrent step with `start_documents` gives the
    /// same outputs token by token.
    fn packed_mixer_equals_documents_one_by_one() {
        use mamba2_burn::Documents;
        type A = Autodiff<B>;
        let _rng = seeded(43);
        let mut worst: f64 = 0.0;
        let configs = mixer_configs();
        for (k, config) in [0, 1, 2].map(|k| (k, configs[k].clone())) {
            let mixer = config.init::<A>(&dev()).unwrap();
            let (b, l, d) = (2, 23, config.d_model);
            let rows = packed_rows(l);
            let documents = Documents::<A>::from_lengths(&rows, &dev()).unwrap();
            let x: Tensor<A, 3> = Tensor::from_inner(randn([b, l, d]));
            let w: Tensor<A, 3> = Tensor::from_inner(randn([b, l, d]));
            let zero = mixer.zero_state(b, &dev());
            let initial = Mamba2State {
                conv: Tensor::from_inner(randn(zero.conv.dims())),
                ssm: Tensor::from_inner(randn(zero.ssm.dims())),
            };
            let row_state = |s: &Mamba2State<A>, r: usize| Mamba2State {
                conv: s.conv.clone().narrow(0, r, 1),
                ssm: s.ssm.clone().narrow(0, r, 1),
            };

            // packed
            let x_packed = x.clone().require_grad();
            let (y, s) = mixer
                .forward_documents(x_packed.clone(), Some(&documents), Some(initial.clone()))
                .unwrap();
            let grads_packed = (y.clone() * w.clone()).sum().backward();

            // one by one
            let x_alone = x.clone().require_grad();
            let mut loss = Tensor::<A, 1>::zeros([1], &dev());
            for (r, lengths) in rows.iter().enumerate() {
                let mut start = 0;
                for (j, &len) in lengths.iter().enumerate() {
                    let piece = x_alone.clone().narrow(0, r, 1).narrow(1, start, len);
                    let state = (j == 0).then(|| row_state(&initial, r));
                    let (y_doc, s_doc) = mixer.forward(piece, state).unwrap();
                    let tag = format!("config {k}, row {r}, document {j}");
                    let packed = y.clone().narrow(0, r, 1).narrow(1, start, len);
                    worst = worst.max(assert_close(
                        &format!("y, {tag}"),
                        packed.inner(),
                        y_doc.clone().inner(),
                    ));
                    if j + 1 == lengths.len() {
                        let s_row = row_state(&s, r);
                        worst = worst.max(assert_close(
                            &format!("final ssm state, {tag}"),
                            s_row.ssm.inner(),
                            s_doc.ssm.inner(),
                        ));
                        worst = worst.max(assert_close(
                            &format!("final conv window, {tag}"),
                            s_row.conv.inner(),
                            s_doc.conv.inner(),
                        ));
                    }
                    let w_doc = w.clone().narrow(0, r, 1).narrow(1, start, len);
                    loss = loss + (y_doc * w_doc).sum();
                    start += len;
                }
            }
            let grads_alone = loss.backward();
            let flat = |t: Tensor<B, 1>| t;
            let pairs = vec![
                (
                    "x",
                    x_packed.grad(&grads_packed).unwrap().reshape([-1]),
                    x_alone.grad(&grads_alone).unwrap().reshape([-1]),
                ),
                (
                    "in_proj",
                    mixer.in_proj.weight.grad(&grads_packed).unwrap().reshape([-1]),
                    mixer.in_proj.weight.grad(&grads_alone).unwrap().reshape([-1]),
                ),
                (
                    "conv1d",
                    mixer.conv1d.weight.grad(&grads_packed).unwrap().reshape([-1]),
                    mixer.conv1d.weight.grad(&grads_alone).unwrap().reshape([-1]),
                ),
                (
                    "dt_bias",
                    flat(mixer.dt_bias.grad(&grads_packed).unwrap()),
                    flat(mixer.dt_bias.grad(&grads_alone).unwrap()),
                ),
                (
                    "A_log",
                    flat(mixer.a_log.grad(&grads_packed).unwrap()),
                    flat(mixer.a_log.grad(&grads_alone).unwrap()),
                ),
                (
                    "D",
                    flat(mixer.d.grad(&grads_packed).unwrap()),
                    flat(mixer.d.grad(&grads_alone).unwrap()),
                ),
                (
                    "out_proj",
                    mixer.out_proj.weight.grad(&grads_packed).unwrap().reshape([-1]),
                    mixer.out_proj.weight.grad(&grads_alone).unwrap().reshape([-1]),
                ),
            ];
            for (name, got, want) in pairs {
                worst = worst.max(assert_grad_close(&format!("grad {name}, config {k}"), got, want));
            }

            // token by token, a new document started in the rows where one begins
            let inner = mixer.valid();
            let starts = documents.starts().inner();
            let mut state = Mamba2State {
                conv: initial.conv.clone().inner(),
                ssm: initial.ssm.clone().inner(),
            };
            let mut ys = Vec::new();
            for t in 0..l {
                state = state.start_documents(starts.clone().narrow(1, t, 1).reshape([b]));
                let (y_t, next) = inner
                    .step(x.clone().inner().narrow(1, t, 1).squeeze_dim::<2>(1), state)
                    .unwrap();
                ys.push(y_t);
                state = next;
            }
            let tag = format!("config {k}");
            worst = worst.max(assert_close(
                &format!("steps, {tag}"),
                Tensor::stack(ys, 1),
                y.inner(),
            ));
            worst = worst.max(assert_close(&format!("steps' final state, {tag}"), state.ssm, s.ssm.inner()));
        }
        eprintln!("{NAME}: packed mixer vs documents one by one: worst relative error {worst:.2e}");
    }
}
