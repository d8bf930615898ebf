//! Mixed precision, the way mamba_ssm's users train: the weights and the optimizer's state stay
//! in `f32`, the forward and backward compute in a half type.
//!
//! Each step casts the parameters to the half type through the autodiff graph, runs the model
//! on those copies and differentiates: the cast's backward brings each gradient back to the
//! `f32` weight it came from, which the optimizer updates. A small update that a half-type
//! weight would round away accumulates in the `f32` one. The SSD computes its decays and
//! states in `f32` whatever the inputs' type (`ssd`), and the LM's loss is taken in `f32`.

use std::borrow::Cow;

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};
use serde::{Deserialize, Serialize};

use crate::precision::cast_to;

/// The half type of a mixed-precision step ([`RunConfig::mixed_precision`](
/// super::RunConfig::mixed_precision), [`Threaded::with_mixed_precision`](
/// super::Threaded::with_mixed_precision)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MixedPrecision {
    /// `bf16`: `f32`'s range with an 8-bit mantissa; on Cuda (tensor cores), not on lavapipe.
    Bf16,
    /// `f16`: a 10-bit mantissa and a range up to 65,504; on Cuda and on Wgpu adapters that
    /// have it (lavapipe does).
    F16,
}

impl MixedPrecision {
    /// The tensor type of the step's computation.
    pub fn dtype(self) -> DType {
        match self {
            MixedPrecision::Bf16 => DType::BF16,
            MixedPrecision::F16 => DType::F16,
        }
    }

    /// What a mixed-precision step computes on, for a training loop of one's own: `model` with
    /// every float parameter cast to this type, each keeping its id. Under autodiff the
    /// gradients of a loss of the copy land on `model`'s parameters in their own type
    /// (`GradientsParams::from_grads(loss.backward(), &model)`), for the optimizer to update.
    pub fn compute_copy<B: Backend, M: Module<B>>(self, model: &M) -> M {
        cast_params(model, self.dtype())
    }
}

/// What a step computes on: `model` itself without mixed precision (no copy on the plain
/// path), else its [`MixedPrecision::compute_copy`].
pub(crate) fn compute_model<B: Backend, M: Module<B>>(
    model: &M,
    mixed: Option<MixedPrecision>,
) -> Cow<'_, M> {
    match mixed {
        Some(mixed) => Cow::Owned(mixed.compute_copy(model)),
        None => Cow::Borrowed(model),
    }
}

/// A copy of `model` with every float parameter cast to `dtype`, each keeping its id; under
/// autodiff each copy is a node whose parent is the original, so the gradients of a loss of the
/// copy land on the original parameters in their own type.
fn cast_params<B: Backend, M: Module<B>>(model: &M, dtype: DType) -> M {
    model.clone().map(&mut CastParams(dtype))
}

/// Casts every float parameter to its type, keeping the parameters' ids.
struct CastParams(DType);

impl<B: Backend> ModuleMapper<B> for CastParams {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        Param::initialized(param.id, cast_to(param.val(), self.0))
    }
}

#[cfg(all(test, feature = "ndarray"))]
mod tests {
    use burn::backend::{Autodiff, NdArray};
    use burn::module::{AutodiffModule, ModuleVisitor, Param};
    use burn::optim::GradientsParams;
    use burn::tensor::{DType, Distribution, Int, Tensor, TensorData};

    use super::cast_params;
    use crate::layers::backbone::Mamba2BackboneConfig;
    use crate::layers::mixer::Mamba2Config;
    use crate::models::forecaster::Mamba2ForecasterConfig;
    use crate::models::lm::Mamba2LmConfig;
    use crate::models::regressor::Mamba2RegressorConfig;
    use crate::train::{
        ForecastBatch, ForecastLoss, LmBatch, RegressionBatch, StepOutput, SupervisedModel,
    };

    type B = Autodiff<NdArray>;

    /// Every float parameter's gradient, in its type.
    struct Grads<'a> {
        grads: &'a GradientsParams,
        out: Vec<(DType, Vec<f64>)>,
    }

    impl ModuleVisitor<B> for Grads<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let g = self
                .grads
                .get::<NdArray, D>(param.id)
                .expect("a gradient per parameter");
            let values = g.to_data().convert::<f64>().to_vec::<f64>().unwrap();
            self.out.push((g.dtype(), values));
        }
    }

    /// The mechanism, on the CPU (NdArray has no half type, so the copy is `f64` here): the
    /// gradients of a step computed on the cast copies land on the `f32` parameters, in `f32`,
    /// and equal the plain `f32` step's within 1e-4 of each gradient's largest element; the
    /// copy computed in its own type (the two differ). Returns the worst difference.
    fn check<M>(model: &M, batch: &M::Batch) -> f64
    where
        M: SupervisedModel<B> + AutodiffModule<B>,
    {
        let grads_of = |dtype: Option<DType>| {
            let copy = dtype.map(|dtype| cast_params(model, dtype));
            let loss = copy.as_ref().unwrap_or(model).batch_output(batch).loss();
            let grads = GradientsParams::from_grads(loss.backward(), model);
            let mut visitor = Grads {
                grads: &grads,
                out: Vec::new(),
            };
            model.visit(&mut visitor);
            visitor.out
        };
        let (plain, mixed) = (grads_of(None), grads_of(Some(DType::F64)));
        assert_eq!(plain.len(), mixed.len());
        let mut worst = 0.0f64;
        for ((t0, g0), (t1, g1)) in plain.iter().zip(&mixed) {
            assert_eq!((*t0, *t1), (DType::F32, DType::F32), "gradients in f32");
            let scale = g0.iter().fold(1e-6f64, |m, v| m.max(v.abs()));
            for (a, b) in g0.iter().zip(g1) {
                worst = worst.max((a - b).abs() / scale);
            }
        }
        assert!(
            worst < 1e-4,
            "worst relative gradient difference {worst:.2e}"
        );
        assert!(worst > 0.0, "the f64 copy computed nothing of its own");
        worst
    }

    fn backbone() -> Mamba2BackboneConfig {
        let mixer = Mamba2Config::new(16)
            .with_d_state(8)
            .with_headdim(8)
            .with_chunk_size(4);
        Mamba2BackboneConfig::new(2, mixer)
    }

    #[test]
    fn gradients_of_the_cast_copy_land_on_the_f32_weights() {
        let device = Default::default();

        let lm = Mamba2LmConfig::new(backbone(), 12)
            .init::<B>(&device)
            .unwrap();
        let ids: Vec<i64> = (0..2 * 9).map(|i| (i * 5 % 12) as i64).collect();
        let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [2, 9]), &device);
        let batch = LmBatch {
            inputs: ids.clone().narrow(1, 0, 8),
            targets: ids.narrow(1, 1, 8),
            documents: None,
            ignore_index: None,
        };
        assert_eq!(
            cast_params(&lm, DType::F64).embedding.weight.val().dtype(),
            DType::F64
        );
        check(&lm, &batch);

        // RevIN and the input's projection in the input's type and the weights' in turn
        let normal = Distribution::Normal(0.0, 1.0);
        let forecaster = Mamba2ForecasterConfig::new(2, 2, 3, backbone())
            .with_patch_len(2)
            .init::<B>(&device)
            .unwrap();
        let batch = ForecastBatch {
            inputs: Tensor::random([3, 8, 2], normal, &device),
            targets: Tensor::random([3, 3, 2], normal, &device),
            loss: ForecastLoss::Mse,
        };
        check(&forecaster, &batch);

        let regressor = Mamba2RegressorConfig::new(3, 2, backbone())
            .init::<B>(&device)
            .unwrap();
        let batch = RegressionBatch {
            inputs: Tensor::random([2, 7, 3], normal, &device),
            targets: Tensor::random([2, 2], normal, &device),
        };
        check(&regressor, &batch);
    }
}
