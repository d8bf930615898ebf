//! The devices a training run uses, and which of Burn's strategies spreads its batches over
//! them: one device, Burn's multi-device strategy (`ExecutionStrategy::multi`), or, with the
//! `ddp` feature on a backend with collective operations (CUDA), Burn's distributed data
//! parallel strategy (`ExecutionStrategy::ddp`).

use burn::tensor::backend::Backend;
use burn::train::{ExecutionStrategy, MultiDeviceOptim};

use crate::error::Mamba2Error;

/// The devices of a training run ([`train_lm`](super::train_lm),
/// [`train_forecaster`](super::train_forecaster)) and how Burn's `Learner` uses them.
///
/// - One device (`&device` converts into this): the whole run on it.
/// - [`TrainDevices::multi`]: Burn's multi-device strategy. The training set is cut into one
///   contiguous share per device; each device runs forward and backward on batches of its
///   share (`batch_size` items each), and one optimizer step on the first device takes the
///   mean of their gradients (see [`Threaded::with_replicas`](super::Threaded::with_replicas)),
///   so that a step over two devices' batches of equal size has the gradient of one device on
///   both batches together. Validation and checkpoints run on the first device.
/// - `TrainDevices::ddp` (feature `ddp`): Burn's distributed data parallel strategy, one
///   model per device whose gradients are averaged by an all-reduce after each backward pass;
///   for backends with collective operations (CUDA through NCCL).
///
/// ```
/// use burn::backend::ndarray::NdArrayDevice;
/// use burn::backend::{Autodiff, NdArray};
/// use mamba2_burn::train::TrainDevices;
///
/// type B = Autodiff<NdArray>;
/// let device = NdArrayDevice::Cpu;
/// let one: TrainDevices<B> = (&device).into();
/// assert_eq!(one.devices().len(), 1);
/// let two = TrainDevices::<B>::multi(vec![device, device]).unwrap();
/// assert_eq!(two.devices().len(), 2);
/// assert!(TrainDevices::<B>::multi(vec![]).is_err());
/// ```
pub struct TrainDevices<B: Backend> {
    devices: Vec<B::Device>,
    /// Burn's DDP strategy over the devices, when chosen; otherwise the multi-device one
    /// (more than one device) or none.
    ddp: Option<ExecutionStrategy<B>>,
}

/// How a run's steps map onto the devices, for the run's schedule and its threads.
pub(crate) struct Placement<B: Backend> {
    /// The device of the model, the optimizer, validation and checkpoints.
    pub main: B::Device,
    /// Burn's strategy, when the run uses more than one device.
    pub strategy: Option<ExecutionStrategy<B>>,
    /// The devices the training set is shared among.
    pub shares: usize,
    /// The devices whose gradients Burn sums: each step's gradient is divided by this
    /// ([`Threaded::with_replicas`](super::Threaded::with_replicas)).
    pub replicas: usize,
    /// Learning-rate steps per step of one device (Burn's DDP advances the schedule once per
    /// device and step).
    pub lr_steps_per_step: usize,
    /// Whether a step may spread its batch over threads (DDP synchronises each backward pass,
    /// so one per step and device).
    pub threads_allowed: bool,
}

impl<B: Backend> TrainDevices<B> {
    /// Burn's multi-device strategy over `devices` (the first holds the model and runs the
    /// optimizer, validation and checkpoints); one device is the plain single-device run.
    /// The same device may appear more than once (on a CPU backend: a step's batches run in
    /// parallel, one thread each).
    ///
    /// # Errors
    /// [`Mamba2Error::InvalidInput`] naming `devices` when the list is empty.
    pub fn multi(devices: Vec<B::Device>) -> crate::error::Result<Self> {
        if devices.is_empty() {
            return Err(no_devices());
        }
        Ok(Self { devices, ddp: None })
    }

    /// Burn's distributed data parallel strategy over `devices` (gradients averaged by an
    /// all-reduce), for backends with collective operations: CUDA (NCCL). The first device
    /// runs validation and checkpoints. A step runs on one thread per device
    /// (`step_threads` must be 1).
    ///
    /// # Errors
    /// [`Mamba2Error::InvalidInput`] naming `devices` when the list is empty.
    #[cfg(feature = "ddp")]
    pub fn ddp(devices: Vec<B::Device>) -> crate::error::Result<Self>
    where
        B: burn::tensor::backend::distributed::DistributedBackend,
    {
        use burn::tensor::backend::distributed::{DistributedConfig, ReduceOperation};
        if devices.is_empty() {
            return Err(no_devices());
        }
        let config = DistributedConfig {
            all_reduce_op: ReduceOperation::Mean,
        };
        let ddp = Some(ExecutionStrategy::ddp(devices.clone(), config));
        Ok(Self { devices, ddp })
    }

    /// The devices, the first one holding the model.
    pub fn devices(&self) -> &[B::Device] {
        &self.devices
    }

    /// The first device: the model's, the optimizer's, validation's and checkpoints'; the
    /// trained model comes back on it.
    pub fn main(&self) -> &B::Device {
        &self.devices[0]
    }

    /// The run's placement: its main device, Burn's strategy and how the steps count.
    pub(crate) fn placement(self) -> Placement<B> {
        let shares = self.devices.len();
        let main = self.main().clone();
        if let Some(strategy) = self.ddp {
            return Placement {
                main,
                strategy: Some(strategy),
                shares,
                // the all-reduce takes the mean already
                replicas: 1,
                lr_steps_per_step: shares,
                threads_allowed: false,
            };
        }
        if shares == 1 {
            return Placement {
                main,
                strategy: None,
                shares,
                replicas: 1,
                lr_steps_per_step: 1,
                threads_allowed: true,
            };
        }
        Placement {
            main,
            // the gradients go to the first device, which steps the optimizer once
            strategy: Some(ExecutionStrategy::multi(
                self.devices,
                MultiDeviceOptim::OptimMainDevice,
            )),
            shares,
            // Burn sums the devices' gradients: each one's share of the mean
            replicas: shares,
            lr_steps_per_step: 1,
            threads_allowed: true,
        }
    }
}

impl<B: Backend> From<&B::Device> for TrainDevices<B> {
    fn from(device: &B::Device) -> Self {
        Self {
            devices: vec![device.clone()],
            ddp: None,
        }
    }
}

fn no_devices() -> Mamba2Error {
    Mamba2Error::InvalidInput {
        name: "devices",
        reason: "a training run needs at least one device".to_string(),
    }
}
