//! The mixture of experts' grouped computation (the tokens of each chosen expert gathered into
//! one batch row, padded to the busiest expert) against the plain one (every expert on every
//! token, weighted by a dense matrix zero off the choice): outputs and the gradients of the
//! input and of every parameter, for both routers, a token alone (decode) and more tokens than
//! experts, where the experts' loads differ and the padding is used. Tolerance: 1e-5 relative
//! to the largest magnitude (the two sum the same products in another order).

use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Tensor};
use mamba2_burn::{MlpActivation, MlpConfig, Moe, MoeConfig, RouterKind};

type B = Autodiff<NdArray<f32>>;

const TOL: f32 = 1e-5;

/// Max abs difference relative to the largest magnitude of `want`.
fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
    got.iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
        / scale
}

fn host<const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec().unwrap()
}

/// Every parameter's gradient, in visiting order.
struct Grads<'a> {
    grads: &'a <B as AutodiffBackend>::Gradients,
    out: Vec<Option<Vec<f32>>>,
}

impl ModuleVisitor<B> for Grads<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let g = param.grad(self.grads);
        self.out
            .push(g.map(|g| g.into_data().convert::<f32>().to_vec().unwrap()));
    }
}

/// The output and the gradients (input, then each parameter) of `run` under a fixed random
/// projection of the output.
fn run(
    moe: &Moe<B>,
    x: &Tensor<B, 2>,
    probe: &Tensor<B, 2>,
    dense: bool,
) -> (Vec<f32>, Vec<Option<Vec<f32>>>) {
    let x = x.clone().require_grad();
    let y = if dense {
        moe.forward_dense(x.clone())
    } else {
        moe.forward(x.clone())
    };
    let loss = (y.clone() * probe.clone()).sum();
    let grads = loss.backward();
    let mut visitor = Grads {
        grads: &grads,
        out: vec![x
            .grad(&grads)
            .map(|g| g.into_data().convert::<f32>().to_vec().unwrap())],
    };
    moe.visit(&mut visitor);
    (host(y), visitor.out)
}

fn check(config: &MoeConfig, tokens: usize, seed: u64) {
    <B as Backend>::seed(&Default::default(), seed);
    let device = Default::default();
    let mut moe: Moe<B> = config.init(&device).unwrap();
    // a correction bias of the sigmoid router's size, so that it changes the choice
    if let Some(b) = &moe.correction_bias {
        let bias = Tensor::random([b.dims()[0]], Distribution::Normal(0.0, 0.3), &device);
        moe.correction_bias = Some(Param::from_tensor(bias));
    }
    let d = config.d_model;
    let x = Tensor::<B, 2>::random([tokens, d], Distribution::Normal(0.0, 1.0), &device);
    let probe = Tensor::<B, 2>::random([tokens, d], Distribution::Normal(0.0, 1.0), &device);
    let (y, grads) = run(&moe, &x, &probe, false);
    let (y_ref, grads_ref) = run(&moe, &x, &probe, true);
    let what = format!("{:?} router, {tokens} tokens", config.router);
    let e = rel_err(&y, &y_ref);
    assert!(e <= TOL, "{what}: output differs by {e:e}");
    assert_eq!(grads.len(), grads_ref.len());
    for (i, (g, r)) in grads.iter().zip(&grads_ref).enumerate() {
        match (g, r) {
            (Some(g), Some(r)) => {
                let e = rel_err(g, r);
                assert!(e <= TOL, "{what}: gradient {i} differs by {e:e}");
                assert!(r.iter().any(|v| *v != 0.0), "{what}: gradient {i} is zero");
            }
            (None, None) => {}
            _ => panic!("{what}: gradient {i} in one computation only"),
        }
    }
}

#[test]
fn grouped_experts_match_the_dense_computation() {
    // Granite's: softmax over the top-k logits, gated SiLU experts
    let granite = MoeConfig::new(12, 10, 6, 2);
    // Nemotron-H's: sigmoid scores, 3 of 8 experts from the best 2 of 4 groups, normalised and
    // scaled, relu² experts without a gate, a shared expert
    let nemotron = MoeConfig::new(12, 10, 8, 3)
        .with_gated(false)
        .with_activation(MlpActivation::Relu2)
        .with_router(RouterKind::Sigmoid)
        .with_n_group(4)
        .with_topk_group(2)
        .with_routed_scaling(1.7)
        .with_shared(Some(
            MlpConfig::new(12, 14)
                .with_gated(false)
                .with_activation(MlpActivation::Relu2),
        ));
    for (config, seed) in [(&granite, 1), (&nemotron, 2)] {
        for tokens in [1, 5, 37] {
            check(config, tokens, seed + tokens as u64);
        }
    }
}

#[test]
fn bad_expert_configs_name_the_field() {
    use mamba2_burn::Mamba2Error;
    let field = |config: MoeConfig| match config.validate() {
        Err(Mamba2Error::InvalidConfig { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(field(MoeConfig::new(8, 4, 4, 5)), "num_experts_per_tok");
    assert_eq!(field(MoeConfig::new(8, 4, 4, 0)), "num_experts_per_tok");
    let sigmoid = |top_k| MoeConfig::new(8, 4, 6, top_k).with_router(RouterKind::Sigmoid);
    assert_eq!(field(sigmoid(2).with_n_group(4)), "n_group");
    assert_eq!(
        field(sigmoid(2).with_n_group(3).with_topk_group(4)),
        "topk_group"
    );
    // 3 experts from one group of 2
    assert_eq!(
        field(sigmoid(3).with_n_group(3).with_topk_group(1)),
        "num_experts_per_tok"
    );
}
