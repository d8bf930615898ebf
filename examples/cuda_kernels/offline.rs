//! `OfflineCuda`: a CubeCL runtime with cubecl-cuda's compiler and no device. Its server turns
//! each launch into the CUDA C++ that cubecl-cuda would hand to NVRTC, after the same checks
//! (`cubecl-cuda/src/compute/context.rs`, `compile_kernel`), and keeps it instead of running
//! it; the device is a compute capability (`OfflineDevice { arch: 90 }`), its properties those
//! cubecl-cuda reads from the driver (`cubecl-cuda/src/runtime.rs`), for that capability.
//!
//! It is a `CubeRuntime` (burn-cubecl's blanket implementation), so Burn's `CubeBackend` (and `Fusion` over it) runs on it: the crate's
//! own launch code, Burn's kernels and cubek's, at their real launch configurations, with
//! nothing read back. Buffers are never allocated and writes are dropped; a read returns zeros;
//! profiling reports one fixed duration, so that an autotune compiles every candidate it would
//! time and keeps the first.
//!
//! CubeCL 0.10 has no compile-only mode: a device-free server is the one way to reach its
//! compiler with the launches' own comptime arguments. `cuda_properties` copies the driver-side
//! half of `runtime.rs`: re-read it on every CubeCL upgrade.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use burn::tensor::backend::DeviceOps;
use cubecl::ir::features::{AtomicUsage, Plane, Tma, TypeUsage};
use cubecl::ir::{
    BarrierLevel, DeviceProperties, ElemType, FloatKind, HardwareProperties,
    MemoryDeviceProperties, OpaqueType, SemanticType, StorageType, TargetProperties, Type,
    VectorSize,
};
use cubecl::prelude::*;
use cubecl::zspace::{Shape, Strides};
use cubecl_common::backtrace::BackTrace;
use cubecl_common::bytes::Bytes;
use cubecl_common::device::{Device, DeviceId, DeviceService, ServerUtilitiesHandle};
use cubecl_common::future::DynFut;
use cubecl_common::profile::{ProfileDuration, TimingMethod};
use cubecl_common::stream_id::StreamId;
use cubecl_cpp::cuda::arch::CudaArchitecture;
use cubecl_cpp::cuda::mma::CudaWmmaCompiler as WmmaCompiler;
use cubecl_cpp::shared::{
    register_mma_features, register_scaled_mma_features, register_wmma_features,
    CompilationOptions, CppSupportedFeatures,
};
use cubecl_cpp::{register_supported_types, DialectWmmaCompiler};
use cubecl_cuda::{CudaCompiler, CudaRuntime};
use cubecl_runtime::allocator::PitchedMemoryLayoutPolicy;
use cubecl_runtime::compiler::CubeTask;
use cubecl_runtime::logging::ServerLogger;
use cubecl_runtime::memory_management::{ManagedMemoryHandle, MemoryAllocationMode, MemoryUsage};
use cubecl_runtime::server::{
    Binding, ComputeServer, CopyDescriptor, CubeCount, ExecutionMode, IoError, KernelArguments,
    ProfileError, ProfilingToken, ServerCommunication, ServerError, ServerUtilities,
};
use cubecl_runtime::storage::{ComputeStorage, ManagedResource, StorageHandle, StorageId};
use cubecl_runtime::validation::{validate_cube_dim, validate_units};

/// One kernel as the server compiled it, the first time it was launched.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The compute capability (`major * 10 + minor`).
    pub arch: u32,
    /// The kernel's type name (`KernelMetadata::name`).
    pub name: String,
    /// The `extern "C" __global__` function of `source`.
    pub entrypoint: String,
    /// The CUDA C++, or why CubeCL refused the kernel (a cube dimension, the shared memory).
    pub source: Result<String, String>,
    /// The shared memory of a block: CubeCL declares it as one dynamic array, which ptxas does
    /// not count, and checks this figure against the device's limit.
    pub shared_bytes: usize,
    /// Threads per block.
    pub cube_dim: (u32, u32, u32),
    /// What was running when it was first launched (`set_context`).
    pub context: String,
}

/// Every kernel compiled by an `OfflineCuda` server, in the order of their first launches.
pub static COMPILED: Mutex<Vec<Compiled>> = Mutex::new(Vec::new());
static CONTEXT: Mutex<String> = Mutex::new(String::new());

/// Names what runs from now on, for the kernels it launches first (`Compiled::context`).
pub fn set_context(context: impl Into<String>) {
    *CONTEXT.lock().unwrap() = context.into();
}

/// A compute capability, as the device of `OfflineCuda`.
#[derive(Default, Clone, Debug, PartialEq, Eq, Hash)]
pub struct OfflineDevice {
    /// `major * 10 + minor`: 80 for sm_80 (A100), 90 for sm_90 (H100, H200).
    pub arch: u32,
    /// Tells apart devices of one capability (each with its own default float type).
    pub slot: u16,
}

impl Device for OfflineDevice {
    fn from_id(device_id: DeviceId) -> Self {
        Self {
            arch: device_id.index_id as u32,
            slot: device_id.type_id,
        }
    }

    fn to_id(&self) -> DeviceId {
        DeviceId {
            type_id: self.slot,
            index_id: self.arch as u16,
        }
    }
}

impl DeviceOps for OfflineDevice {}

/// cubecl-cuda's compiler with a server that compiles and never runs.
#[derive(Debug, Clone)]
pub struct OfflineCuda;

impl Runtime for OfflineCuda {
    type Compiler = CudaCompiler;
    type Server = OfflineServer;
    type Device = OfflineDevice;

    fn client(device: &Self::Device) -> ComputeClient<Self> {
        ComputeClient::load(device)
    }

    fn name(_client: &ComputeClient<Self>) -> &'static str {
        // what kernels and autotune keys that ask the runtime's name see on CUDA
        "cuda"
    }

    fn require_array_lengths() -> bool {
        CudaRuntime::require_array_lengths()
    }

    fn max_cube_count() -> (u32, u32, u32) {
        CudaRuntime::max_cube_count()
    }

    fn can_read_tensor(shape: &Shape, strides: &Strides) -> bool {
        CudaRuntime::can_read_tensor(shape, strides)
    }

    fn target_properties() -> TargetProperties {
        CudaRuntime::target_properties()
    }

    fn enumerate_devices(_type_id: u16, _info: &()) -> Vec<DeviceId> {
        Vec::new()
    }
}

/// The server of one compute capability.
#[derive(Debug)]
pub struct OfflineServer {
    arch: u32,
    options: CompilationOptions,
    utilities: Arc<ServerUtilities<Self>>,
    /// The kernels compiled so far (CubeCL's kernel ids: type, comptime arguments, cube dim,
    /// address type).
    seen: HashSet<KernelId>,
    next_token: u64,
}

/// The largest shared memory a block may opt into (`CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_
/// BLOCK_OPTIN`, bytes) on the data-center parts of each capability: A100 and H100/H200.
pub fn max_shared_per_block(arch: u32) -> usize {
    match arch {
        80 => 166_912,
        90 => 232_448,
        _ => panic!("sm_{arch}: only sm_80 and sm_90 are described"),
    }
}

/// Streaming multiprocessors of the part each capability stands for (A100: 108; H100 SXM and
/// H200: 132), for the launch grids that CubeCL sizes by them.
fn multiprocessors(arch: u32) -> u32 {
    if arch >= 90 {
        132
    } else {
        108
    }
}

/// The properties `cubecl-cuda/src/runtime.rs` builds from the driver's answers, with those
/// answers for `arch` (a warp of 32, 1,024 threads a block, the opt-in shared memory, the
/// grid's limits) and the CUDA version cudarc was built for, which gates two features there too.
pub fn cuda_properties(arch: u32) -> (DeviceProperties, CompilationOptions) {
    let target = CudaArchitecture { version: arch };
    let wmma = WmmaCompiler::supported_wmma_combinations(&target);
    let mma = WmmaCompiler::supported_mma_combinations(&target);
    let scaled_mma = WmmaCompiler::supported_scaled_mma_combinations(&target);
    let cuda_version = cudarc::driver::sys::CUDA_VERSION;

    let mut options = CompilationOptions {
        supports_features: CppSupportedFeatures {
            fast_math: true,
            ..Default::default()
        },
        ..Default::default()
    };
    options.warp_size = 32;
    let memory = MemoryDeviceProperties {
        // a quarter of an 80 GB part's memory, as cubecl-cuda sets it
        max_page_size: 20 << 30,
        alignment: 512,
    };
    let hardware = HardwareProperties {
        load_width: 128,
        plane_size_min: 32,
        plane_size_max: 32,
        max_bindings: cubecl_cuda::CUDA_MAX_BINDINGS,
        max_shared_memory_size: max_shared_per_block(arch),
        max_cube_count: (i32::MAX as u32, 65_535, 65_535),
        max_units_per_cube: 1024,
        max_cube_dim: (1024, 1024, 64),
        num_streaming_multiprocessors: Some(multiprocessors(arch)),
        num_tensor_cores: Some(4),
        min_tensor_cores_dim: (!wmma.is_empty()).then_some(8),
        num_cpu_cores: None,
        max_vector_size: VectorSize::MAX,
    };
    let mut p = DeviceProperties::new(Default::default(), memory, hardware, TimingMethod::System);
    register_supported_types(&mut p);
    p.register_type_usage(ElemType::Float(FloatKind::TF32), TypeUsage::Conversion);
    let atomic = |kind| Type::new(StorageType::Atomic(ElemType::Float(kind)));
    let add = AtomicUsage::Add | AtomicUsage::LoadStore;
    p.register_atomic_type_usage(atomic(FloatKind::F64), add);
    // from sm_70
    p.register_atomic_type_usage(atomic(FloatKind::F16), add);
    p.register_atomic_type_usage(atomic(FloatKind::F16).with_vector_size(2), add);
    p.register_semantic_type(SemanticType::Pipeline);
    p.register_type_usage(OpaqueType::Barrier(BarrierLevel::Unit), TypeUsage::Buffer);
    p.register_type_usage(OpaqueType::Barrier(BarrierLevel::Cube), TypeUsage::Buffer);
    p.features.plane.insert(Plane::Sync);
    options.supports_features.grid_constants = true;
    // from sm_75
    let half: [StorageType; 2] =
        [FloatKind::F16, FloatKind::BF16].map(|k| ElemType::Float(k).into());
    p.features.matmul.ldmatrix.extend(half);
    options.supports_features.fast_tanh = cuda_version >= 12080;
    // from sm_80
    p.features.copy_async = true;
    if arch >= 89 {
        for kind in [FloatKind::E4M3, FloatKind::E5M2] {
            let usage = TypeUsage::Conversion | TypeUsage::Buffer;
            p.register_type_usage(ElemType::Float(kind), usage);
        }
    }
    if arch >= 90 {
        p.features.tma.insert(Tma::Base);
        p.register_semantic_type(SemanticType::TensorMap);
        p.features.cube_cluster = true;
        options.supports_features.clusters = true;
        options.supports_features.elect_sync = true;
        p.features.matmul.stmatrix.extend(half);
        p.register_atomic_type_usage(atomic(FloatKind::F32).with_vector_size(2), add);
        p.register_atomic_type_usage(atomic(FloatKind::F32).with_vector_size(4), add);
    }
    p.features.memory_reinterpret = true;
    p.features.alignment = true;
    p.features.plane.insert(Plane::Ops);
    p.features.plane.insert(Plane::NonUniformControlFlow);
    register_wmma_features(wmma, &mut p);
    register_mma_features(mma, &mut p);
    register_scaled_mma_features(scaled_mma, &mut p);
    (p, options)
}

impl DeviceService for OfflineServer {
    fn init(device_id: DeviceId) -> Self {
        let arch = device_id.index_id as u32;
        let (properties, options) = cuda_properties(arch);
        let policy = PitchedMemoryLayoutPolicy::new(properties.memory.alignment as usize);
        let utilities =
            ServerUtilities::new(properties, Arc::new(ServerLogger::default()), (), policy);
        Self {
            arch,
            options,
            utilities: Arc::new(utilities),
            seen: HashSet::new(),
            next_token: 0,
        }
    }

    fn utilities(&self) -> ServerUtilitiesHandle {
        self.utilities.clone() as ServerUtilitiesHandle
    }
}

impl ServerCommunication for OfflineServer {
    const SERVER_COMM_ENABLED: bool = false;
}

/// Storage that holds nothing: no launch runs, so no buffer is ever touched.
#[derive(Debug)]
pub struct NoStorage;

impl ComputeStorage for NoStorage {
    type Resource = ();

    fn alignment(&self) -> usize {
        512
    }

    fn get(&mut self, _handle: &StorageHandle) -> Self::Resource {}

    fn alloc(&mut self, _size: u64) -> Result<StorageHandle, IoError> {
        Err(IoError::UnsupportedIoOperation {
            backtrace: BackTrace::capture(),
        })
    }

    fn dealloc(&mut self, _id: StorageId) {}

    fn flush(&mut self) {}
}

fn no_device(what: &str) -> ServerError {
    ServerError::Generic {
        reason: format!("{what}: the offline CUDA server has no device"),
        backtrace: BackTrace::capture(),
    }
}

impl OfflineServer {
    /// What `compile_kernel` does before NVRTC: the cube's checks, `CubeTask::compile` with
    /// the server's options, the shared memory against the device's limit.
    fn compile(&self, kernel: &<Self as ComputeServer>::Kernel, mode: ExecutionMode) -> Compiled {
        let id = kernel.id();
        let props = &self.utilities.properties;
        let mut compiled = Compiled {
            arch: self.arch,
            name: kernel.name().to_string(),
            entrypoint: String::new(),
            source: Err(String::new()),
            shared_bytes: 0,
            cube_dim: (id.cube_dim.x, id.cube_dim.y, id.cube_dim.z),
            context: CONTEXT.lock().unwrap().clone(),
        };
        compiled.source = validate_cube_dim(props, &id)
            .and_then(|()| validate_units(props, &id))
            .map_err(|e| format!("{e:?}"))
            .and_then(|()| {
                // CubeCL panics where a kernel's expansion fails (its IR checks): that is the
                // kernel's failure, recorded like a compile error, and the run goes on
                let compile = || {
                    kernel.compile(
                        &mut Default::default(),
                        &self.options,
                        mode,
                        kernel.address_type(),
                    )
                };
                let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(compile))
                    .map_err(|panic| {
                        let message = panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default();
                        format!("expansion panicked: {message}")
                    })?
                    .map_err(|e| format!("{e:?}"))?;
                compiled.entrypoint = out.entrypoint_name.clone();
                compiled.shared_bytes = out.repr.as_ref().map_or(0, |r| r.shared_memory_size());
                let max = props.hardware.max_shared_memory_size;
                if compiled.shared_bytes > max {
                    return Err(format!(
                        "{} B of shared memory, above sm_{}'s {max} B a block",
                        compiled.shared_bytes, self.arch
                    ));
                }
                Ok(out.source)
            });
        compiled
    }
}

impl ComputeServer for OfflineServer {
    type Kernel = Box<dyn CubeTask<CudaCompiler>>;
    type Info = ();
    type MemoryLayoutPolicy = PitchedMemoryLayoutPolicy;
    type Storage = NoStorage;

    fn initialize_memory(&mut self, _memory: ManagedMemoryHandle, _size: u64, _stream: StreamId) {}

    fn logger(&self) -> Arc<ServerLogger> {
        self.utilities.logger.clone()
    }

    fn utilities(&self) -> Arc<ServerUtilities<Self>> {
        self.utilities.clone()
    }

    /// Zeros of the size asked for: nothing ran, but code that reads a value to go on (a
    /// model's init draws on the device and finishes some parameters on the host) goes on.
    fn read(
        &mut self,
        descriptors: Vec<CopyDescriptor>,
        _stream: StreamId,
    ) -> DynFut<Result<Vec<Bytes>, ServerError>> {
        let bytes = descriptors
            .iter()
            .map(|d| {
                Bytes::from_bytes_vec(vec![0; d.shape.iter().product::<usize>() * d.elem_size])
            })
            .collect();
        Box::pin(async { Ok(bytes) })
    }

    fn write(&mut self, _descriptors: Vec<(CopyDescriptor, Bytes)>, _stream: StreamId) {}

    fn sync(&mut self, _stream: StreamId) -> DynFut<Result<(), ServerError>> {
        Box::pin(async { Ok(()) })
    }

    fn get_resource(
        &mut self,
        _binding: Binding,
        _stream: StreamId,
    ) -> Result<ManagedResource<()>, ServerError> {
        Err(no_device("get_resource"))
    }

    unsafe fn launch(
        &mut self,
        kernel: Self::Kernel,
        _count: CubeCount,
        _bindings: KernelArguments,
        mode: ExecutionMode,
        _stream: StreamId,
    ) {
        if self.seen.insert(kernel.id()) {
            let compiled = self.compile(&kernel, mode);
            COMPILED.lock().unwrap().push(compiled);
        }
    }

    fn flush(&mut self, _stream: StreamId) -> Result<(), ServerError> {
        Ok(())
    }

    fn memory_usage(&mut self, _stream: StreamId) -> Result<MemoryUsage, ServerError> {
        Err(no_device("memory_usage"))
    }

    fn memory_cleanup(&mut self, _stream: StreamId) {}

    fn start_profile(&mut self, _stream: StreamId) -> Result<ProfilingToken, ServerError> {
        self.next_token += 1;
        Ok(ProfilingToken {
            id: self.next_token,
        })
    }

    fn end_profile(
        &mut self,
        _stream: StreamId,
        _token: ProfilingToken,
    ) -> Result<ProfileDuration, ProfileError> {
        let start = Instant::now();
        Ok(ProfileDuration::new_system_time(
            start,
            start + Duration::from_micros(1),
        ))
    }

    fn allocation_mode(&mut self, _mode: MemoryAllocationMode, _stream: StreamId) {}
}
