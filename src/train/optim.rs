//! The optimizer the reference trains with: AdamW with no weight decay on `A_log`, `D`,
//! `dt_bias`, biases and norm weights (every 1-D parameter), clipping of the global gradient
//! norm, and a guard that skips and reports a step whose gradients are not finite.

use std::sync::{Arc, Mutex};

use burn::config::Config;
use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{
    AdamW, AdamWConfig, GradientsParams, LearningRate, MultiGradientsParams, Optimizer,
};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor};
use burn::train::Interrupter;

/// Configuration of a [`Mamba2Optimizer`].
#[derive(Config, Debug)]
pub struct Mamba2OptimizerConfig {
    /// Decoupled weight decay of the matrices (2-D and larger parameters). Default: 0.1.
    #[config(default = 0.1)]
    pub weight_decay: f32,
    /// AdamW β₁. Default: 0.9.
    #[config(default = 0.9)]
    pub beta_1: f32,
    /// AdamW β₂. Default: 0.95.
    #[config(default = 0.95)]
    pub beta_2: f32,
    /// AdamW ε. Default: 1e-8.
    #[config(default = 1e-8)]
    pub epsilon: f32,
    /// Scale the gradients down when their global L2 norm exceeds this. Default: 1.0.
    #[config(default = "Some(1.0)")]
    pub grad_clip_norm: Option<f32>,
}

impl Mamba2OptimizerConfig {
    /// Builds the optimizer; `guard` is told about non-finite steps.
    pub fn init<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        guard: NonFiniteGuard,
    ) -> Mamba2Optimizer<M, B> {
        let adamw = |wd: f32| {
            AdamWConfig::new()
                .with_beta_1(self.beta_1)
                .with_beta_2(self.beta_2)
                .with_epsilon(self.epsilon)
                .with_weight_decay(wd)
                .init::<B, M>()
        };
        Mamba2Optimizer {
            decay: adamw(self.weight_decay),
            no_decay: adamw(0.0),
            grad_clip_norm: self.grad_clip_norm.map(f64::from),
            steps: 0,
            guard,
        }
    }
}

/// Records the first optimizer step whose gradients were not finite, and stops the training
/// through its [`Interrupter`]. Clones share the record.
#[derive(Clone, Default)]
pub struct NonFiniteGuard {
    tripped: Arc<Mutex<Option<usize>>>,
    interrupter: Option<Interrupter>,
}

impl NonFiniteGuard {
    /// A guard that stops the training through `interrupter` (if any).
    pub fn new(interrupter: Option<Interrupter>) -> Self {
        Self {
            tripped: Arc::default(),
            interrupter,
        }
    }

    /// The optimizer step (counted from 1 over the whole run) at which a non-finite loss or
    /// gradient was seen, if any.
    pub fn tripped_at(&self) -> Option<usize> {
        *self.tripped.lock().expect("guard lock")
    }

    fn trip(&self, step: usize) {
        let mut tripped = self.tripped.lock().expect("guard lock");
        if tripped.is_none() {
            *tripped = Some(step);
        }
        if let Some(i) = &self.interrupter {
            i.stop(Some(&format!("non-finite loss or gradient at step {step}")));
        }
    }
}

/// AdamW in two groups (decayed matrices, undecayed vectors), with global-norm clipping.
///
/// A step whose gradient norm is NaN or infinite leaves the model unchanged, trips the
/// [`NonFiniteGuard`] and stops the training.
#[derive(Clone)]
pub struct Mamba2Optimizer<M: AutodiffModule<B>, B: AutodiffBackend> {
    decay: OptimizerAdaptor<AdamW, M, B>,
    no_decay: OptimizerAdaptor<AdamW, M, B>,
    grad_clip_norm: Option<f64>,
    steps: usize,
    guard: NonFiniteGuard,
}

/// Sum of squares of all gradients, on the device.
struct SquaredNorm<'a, B: AutodiffBackend> {
    grads: &'a GradientsParams,
    sum: Option<Tensor<B::InnerBackend, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for SquaredNorm<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
            let s = g.square().sum();
            self.sum = Some(match self.sum.take() {
                Some(acc) => acc + s,
                None => s,
            });
        }
    }
}

/// Scales every gradient and moves those of 1-D parameters into a second set.
struct ScaleAndSplit<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    vectors: GradientsParams,
    scale: Option<f64>,
    _backend: core::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for ScaleAndSplit<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(mut g) = self.grads.remove::<B::InnerBackend, D>(param.id) else {
            return;
        };
        if let Some(s) = self.scale {
            g = g.mul_scalar(s);
        }
        if D == 1 {
            self.vectors.register(param.id, g);
        } else {
            self.grads.register(param.id, g);
        }
    }
}

/// Sums per-device gradients into one set (on each parameter's accumulation device).
struct Merge<'a, B: AutodiffBackend> {
    multi: &'a mut MultiGradientsParams,
    out: GradientsParams,
    _backend: core::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Merge<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some((g, _)) = self.multi.remove::<B::InnerBackend, D>(param.id) {
            self.out
                .register(param.id, g.to_device(&param.val().device()));
        }
    }
}

impl<M: AutodiffModule<B>, B: AutodiffBackend> Mamba2Optimizer<M, B> {
    /// Optimizer steps taken so far.
    pub fn steps(&self) -> usize {
        self.steps
    }
}

impl<M: AutodiffModule<B>, B: AutodiffBackend> Optimizer<M, B> for Mamba2Optimizer<M, B> {
    type Record = Mamba2OptimizerRecord<M, B>;

    fn step(&mut self, lr: LearningRate, module: M, mut grads: GradientsParams) -> M {
        // the step gives up the last references to the old parameters and moments, which a
        // checkpoint may be reading on another thread (see `checkpoint::record`)
        let _reads = crate::checkpoint::record::exclusive_device_reads();
        self.steps += 1;
        let mut norm = SquaredNorm::<B> {
            grads: &grads,
            sum: None,
        };
        module.visit(&mut norm);
        let Some(sum) = norm.sum else {
            return module;
        };
        let total: f64 = sum.sqrt().into_scalar().elem();
        if !total.is_finite() {
            self.guard.trip(self.steps);
            return module;
        }
        let scale = self
            .grad_clip_norm
            .filter(|&max| total > max)
            .map(|max| max / (total + 1e-6));
        let mut split = ScaleAndSplit::<B> {
            grads: &mut grads,
            vectors: GradientsParams::new(),
            scale,
            _backend: core::marker::PhantomData,
        };
        module.visit(&mut split);
        let vectors = split.vectors;
        let module = self.decay.step(lr, module, grads);
        self.no_decay.step(lr, module, vectors)
    }

    fn step_multi(&mut self, lr: LearningRate, module: M, mut grads: MultiGradientsParams) -> M {
        let mut merge = Merge::<B> {
            multi: &mut grads,
            out: GradientsParams::new(),
            _backend: core::marker::PhantomData,
        };
        module.visit(&mut merge);
        let merged = merge.out;
        self.step(lr, module, merged)
    }

    fn to_record(&self) -> Self::Record {
        (
            self.decay.to_record(),
            self.no_decay.to_record(),
            self.steps,
        )
    }

    fn load_record(self, record: Self::Record) -> Self {
        let (decay, no_decay, steps) = record;
        Self {
            decay: self.decay.load_record(decay),
            no_decay: self.no_decay.load_record(no_decay),
            steps,
            ..self
        }
    }
}

/// The record of a [`Mamba2Optimizer`]: both AdamW states and the step count.
pub type Mamba2OptimizerRecord<M, B> = (
    <OptimizerAdaptor<AdamW, M, B> as Optimizer<M, B>>::Record,
    <OptimizerAdaptor<AdamW, M, B> as Optimizer<M, B>>::Record,
    usize,
);
