//! Mixed precision on a GPU code path (Wgpu on lavapipe, `f16`): a short training run whose
//! forward and backward compute in `f16` on copies of the `f32` weights follows the `f32` run's
//! loss curve, and its weights stay `f32`.

#[cfg(feature = "wgpu")]
mod wgpu {
    use burn::backend::{Autodiff, Wgpu};
    use burn::optim::Optimizer;
    use burn::tensor::backend::Backend;
    use burn::tensor::{DType, ElementConversion, Int, Tensor, TensorData};
    use burn::train::TrainStep;
    use mamba2_burn::train::{
        LmBatch, Mamba2OptimizerConfig, MixedPrecision, NonFiniteGuard, Threaded,
    };
    use mamba2_burn::{Mamba2BackboneConfig, Mamba2Config, Mamba2Lm, Mamba2LmConfig};

    type B = Autodiff<Wgpu<f32, i32>>;

    /// The largest relative difference of a mixed-precision step's loss from the `f32` run's at
    /// the same step, over 30 steps of AdamW at lr 3e-3 on one batch: three times the worst
    /// measured on lavapipe (2026-12-05: 2.2e-4 with this seed, the loss falling from 2.76 to
    /// 0.59 on both; 2.6e-4 and 3.3e-4 from two other draws of the weights).
    const CURVE_TOL: f64 = 1e-3;

    /// The per-step losses of 30 training steps of `model` on `batch`, with `mixed` or in `f32`,
    /// and the trained model.
    fn run(
        mut model: Mamba2Lm<B>,
        batch: &LmBatch<B>,
        mixed: Option<MixedPrecision>,
    ) -> (Vec<f64>, Mamba2Lm<B>) {
        let mut optim =
            Mamba2OptimizerConfig::new().init::<B, Mamba2Lm<B>>(NonFiniteGuard::default());
        let mut losses = Vec::new();
        for _ in 0..30 {
            let step = Threaded::new(model.clone(), 1).with_mixed_precision(mixed);
            let out = TrainStep::step(&step, batch.clone());
            losses.push(out.item.loss.clone().into_scalar().elem::<f64>());
            model = optim.step(3e-3, model, out.grads);
        }
        (losses, model)
    }

    #[test]
    #[ignore = "needs a device driver: run with -- --ignored"]
    fn mixed_precision_f16_follows_the_f32_loss_curve() {
        let device = Default::default();
        // the weights drawn from a fixed seed, the draws of other tests kept out meanwhile
        let _rng = crate::common::seeded(17);
        <B as Backend>::seed(&device, 17);
        let mixer = Mamba2Config::new(32)
            .with_d_state(16)
            .with_headdim(16)
            .with_chunk_size(16);
        let lm = Mamba2LmConfig::new(Mamba2BackboneConfig::new(2, mixer), 16)
            .init::<B>(&device)
            .unwrap();
        let ids: Vec<i64> = (0..4 * 33).map(|i| ((i * 7 + i / 5) % 16) as i64).collect();
        let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [4, 33]), &device);
        let batch = LmBatch {
            inputs: ids.clone().narrow(1, 0, 32),
            targets: ids.narrow(1, 1, 32),
            documents: None,
            ignore_index: None,
        };
        let (plain, _) = run(lm.clone(), &batch, None);
        let (mixed, trained) = run(lm, &batch, Some(MixedPrecision::F16));
        let worst = plain
            .iter()
            .zip(&mixed)
            .map(|(a, b)| (a - b).abs() / a.abs())
            .fold(0.0f64, f64::max);
        eprintln!(
            "mixed f16 on lavapipe: loss {:.4} -> {:.4} (f32 {:.4} -> {:.4}), worst relative \
             difference per step {worst:.2e}",
            mixed[0], mixed[29], plain[0], plain[29]
        );
        assert!(
            plain[29] < plain[0] - 0.5,
            "the f32 run did not learn: {plain:?}"
        );
        assert!(worst <= CURVE_TOL, "f16: {mixed:?}\nf32: {plain:?}");
        assert!(worst > 0.0, "the mixed run computed in f32");
        assert_eq!(trained.embedding.weight.val().dtype(), DType::F32);
    }
}
