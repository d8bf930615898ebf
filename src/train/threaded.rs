//! A model with its batches spread over threads, for Burn's `Learner` on CPU backends.

use core::marker::PhantomData;

use burn::module::{
    AutodiffModule, Content, Devices, DisplaySettings, Module, ModuleDisplay, ModuleDisplayDefault,
    ModuleMapper, ModuleVisitor,
};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::train::metric::ItemLazy;
use burn::train::{InferenceStep, TrainOutput, TrainStep};

use super::mixed::MixedPrecision;
use super::step::{mixed_inference_step, scaled_train_step, SupervisedModel};

/// A model whose training and validation steps spread each batch over `threads` threads:
/// the batch is cut into that many row slices that run forward (and backward) in parallel,
/// with the same loss and gradient as the whole batch ([`parallel_backward`]).
///
/// The thread count is a setting of the run, not of the model: wrap the model for Burn's
/// `Learner` and take it back out with [`into_inner`](Self::into_inner) (or the public
/// `model` field). The wrapper is transparent to everything else: its parameters, their
/// paths and its record are the model's, so a `Learner` checkpoint of a `Threaded` model
/// loads into the bare model and the other way round. Worth it on CPU backends, where
/// burn-ndarray runs most element-wise work on one thread; a GPU gains nothing from it.
///
/// ```
/// use burn::backend::{Autodiff, NdArray};
/// use mamba2_burn::train::Threaded;
/// use mamba2_burn::{Mamba2BackboneConfig, Mamba2Config, Mamba2LmConfig};
///
/// # fn main() -> Result<(), mamba2_burn::Mamba2Error> {
/// let mixer = Mamba2Config::new(32).with_d_state(8).with_headdim(16);
/// let lm = Mamba2LmConfig::new(Mamba2BackboneConfig::new(1, mixer), 64)
///     .init::<Autodiff<NdArray>>(&Default::default())?;
/// let model = Threaded::new(lm, 4); // for `Learner::new(model, optimizer, scheduler)`
/// assert_eq!(model.threads(), 4);
/// let lm = model.into_inner();
/// # Ok(())
/// # }
/// ```
///
/// [`parallel_backward`]: super::parallel_backward
#[derive(Clone, Debug)]
pub struct Threaded<B: Backend, M> {
    /// The model.
    pub model: M,
    threads: usize,
    replicas: usize,
    mixed: Option<MixedPrecision>,
    _backend: PhantomData<B>,
}

impl<B: Backend, M: Module<B>> Threaded<B, M> {
    /// `model` with its steps spread over `threads` threads (values below 1 count as 1).
    pub fn new(model: M, threads: usize) -> Self {
        Self {
            model,
            threads: threads.max(1),
            replicas: 1,
            mixed: None,
            _backend: PhantomData,
        }
    }

    /// Mixed precision: each step computes its forward and backward in `mixed`'s half type on
    /// copies of the parameters, whose gradients land on the model's own (`f32`) parameters,
    /// which the optimizer updates in `f32` ([`MixedPrecision`]). `None` (the default): the
    /// model's own type throughout.
    pub fn with_mixed_precision(mut self, mixed: Option<MixedPrecision>) -> Self {
        self.mixed = mixed;
        self
    }

    /// The half type of the steps' computation, if any.
    pub fn mixed_precision(&self) -> Option<MixedPrecision> {
        self.mixed
    }

    /// For Burn's multi-device strategy over `replicas` devices (values below 1 count as 1):
    /// each training step's gradient is divided by `replicas`. That strategy sums the
    /// devices' gradients, so the optimizer gets their mean: for batches of equal size (and
    /// equal numbers of scored positions), the gradient of one device on all of them together.
    /// The loss a step reports is its batch's own. Default: 1.
    pub fn with_replicas(mut self, replicas: usize) -> Self {
        self.replicas = replicas.max(1);
        self
    }

    /// The threads each step spreads its batch over.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The devices whose gradients a step's gradient is averaged with (see
    /// [`with_replicas`](Self::with_replicas)).
    pub fn replicas(&self) -> usize {
        self.replicas
    }

    /// The model.
    pub fn into_inner(self) -> M {
        self.model
    }

    /// `f` of the model, with the same settings (every field written out, so that a new one
    /// cannot be left at its default here).
    fn map_model<B2: Backend, M2: Module<B2>>(self, f: impl FnOnce(M) -> M2) -> Threaded<B2, M2> {
        Threaded {
            model: f(self.model),
            threads: self.threads,
            replicas: self.replicas,
            mixed: self.mixed,
            _backend: PhantomData,
        }
    }
}

// Written out rather than derived, so that the wrapper adds no level to the parameters' paths
// and its record is the model's own.
impl<B: Backend, M: Module<B>> Module<B> for Threaded<B, M> {
    type Record = M::Record;

    fn collect_devices(&self, devices: Devices<B>) -> Devices<B> {
        self.model.collect_devices(devices)
    }

    fn fork(self, device: &B::Device) -> Self {
        self.map_model(|m| m.fork(device))
    }

    fn to_device(self, device: &B::Device) -> Self {
        self.map_model(|m| m.to_device(device))
    }

    fn visit<V: ModuleVisitor<B>>(&self, visitor: &mut V) {
        self.model.visit(visitor)
    }

    fn map<Mapper: ModuleMapper<B>>(self, mapper: &mut Mapper) -> Self {
        self.map_model(|m| m.map(mapper))
    }

    fn load_record(self, record: M::Record) -> Self {
        self.map_model(|m| m.load_record(record))
    }

    fn into_record(self) -> M::Record {
        self.model.into_record()
    }
}

impl<B: AutodiffBackend, M: AutodiffModule<B>> AutodiffModule<B> for Threaded<B, M> {
    type InnerModule = Threaded<B::InnerBackend, M::InnerModule>;

    fn valid(&self) -> Self::InnerModule {
        // every field written out, as in `map_model`
        Threaded {
            model: self.model.valid(),
            threads: self.threads,
            replicas: self.replicas,
            mixed: self.mixed,
            _backend: PhantomData,
        }
    }

    fn from_inner(module: Self::InnerModule) -> Self {
        module.map_model(M::from_inner)
    }
}

impl<B: Backend, M: ModuleDisplay> ModuleDisplayDefault for Threaded<B, M> {
    fn content(&self, content: Content) -> Option<Content> {
        self.model.content(content)
    }

    fn num_params(&self) -> usize {
        self.model.num_params()
    }
}

impl<B: Backend, M: ModuleDisplay> ModuleDisplay for Threaded<B, M> {
    fn custom_settings(&self) -> Option<DisplaySettings> {
        self.model.custom_settings()
    }

    fn custom_content(&self, content: Content) -> Option<Content> {
        self.model.custom_content(content)
    }
}

impl<B: Backend, M: ModuleDisplay> core::fmt::Display for Threaded<B, M> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let model = self.model.format(DisplaySettings::default());
        write!(f, "Threaded ({} threads) {model}", self.threads)
    }
}

impl<B, M> TrainStep for Threaded<B, M>
where
    B: AutodiffBackend,
    M: SupervisedModel<B> + AutodiffModule<B> + Send,
    M::Batch: 'static,
    M::Output: ItemLazy + 'static,
{
    type Input = M::Batch;
    type Output = M::Output;

    fn step(&self, batch: M::Batch) -> TrainOutput<M::Output> {
        scaled_train_step(
            &self.model,
            batch,
            self.threads,
            1.0 / self.replicas as f64,
            self.mixed,
        )
    }
}

impl<B, M> InferenceStep for Threaded<B, M>
where
    B: Backend,
    M: SupervisedModel<B> + Module<B>,
    M::Batch: 'static,
    M::Output: ItemLazy + 'static,
{
    type Input = M::Batch;
    type Output = M::Output;

    fn step(&self, batch: M::Batch) -> M::Output {
        mixed_inference_step(&self.model, batch, self.threads, self.mixed)
    }
}
