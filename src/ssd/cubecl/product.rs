//! The fused scan's matrix products: on devices with tensor cores, cubek's matmul with one
//! fixed kernel; elsewhere Burn's autotuned matmul.
//!
//! Burn's `matmul` autotunes each new problem key (shape class, layouts, types) by compiling and
//! timing candidate kernels; the scan issues 9 products a layer, each its own key. On Cuda, where
//! the candidates are many tensor-core kernels and each first launch took 1.0–1.9 s, one process
//! spent about 95 s compiling and timing before the first step of one layer (an H200,
//! `docs/performance.md`, "Cold start"). The scan's products are all of one class: batched,
//! row-major operands of the model's type, `f32` accumulation. So where the device has tensor
//! cores for the operand type, they run cubek's simple cyclic tile matmul on them (`cmma`), the
//! kernel autotune ranks first for such products, with no timing (`f32` operands multiply as
//! TF32 there, as the Cuda tests allow).
//!
//! Where the device has none (Vulkan on lavapipe, Metal without cooperative matrices), the
//! products keep Burn's autotune, whose candidates there are few and cheap to time: on
//! lavapipe a fixed register-tile kernel made a model's cold start 30% shorter but the fused
//! scan's tests, at many small odd shapes, 2.3× slower (each shape compiled a tiled kernel that
//! llvmpipe compiles slowly, where the autotune picks the naive one), `docs/performance.md`.
//! A device found without tensor cores for a type is not asked again; a problem the tensor-core
//! kernel does not take goes to the autotune alone.

use std::any::TypeId;
use std::collections::HashSet;
use std::sync::Mutex;

use burn::tensor::{DType, Tensor};
use burn_cubecl::kernel::matmul::{init_matmul_output, matmul, MatmulStrategy};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::client::ComputeClient;
use cubecl::features::MmaConfig;
use cubecl::prelude::TensorBinding;
use cubecl::std::tensor::{matrix_batch_layout, MatrixBatchLayout};
use cubek::matmul::components::stage::PartitionBuffering;
use cubek::matmul::components::tile::TileMatmulKind;
use cubek::matmul::definition::{
    MatmulElems, MatmulGlobalElems, MatmulProblem, MatmulSetupError, TilingBlueprint, TilingScheme,
};
use cubek::matmul::launch::{launch_ref, Strategy};
use cubek::matmul::routines::simple::SimpleArgs;
use cubek::matmul::routines::BlueprintStrategy;
use cubek::std::InputBinding;

use crate::ssd::primitive::primitive;

/// The tensor-core kernel as cubek infers it (module docs): for `f32` operands, which it
/// multiplies as TF32 in 128-thread cubes, and half-precision ones [`half_tiles`] does not take.
fn tensor_cores() -> Strategy {
    Strategy::SimpleCyclicCmma(BlueprintStrategy::Inferred(SimpleArgs {
        tile_matmul: TileMatmulKind::Cmma,
        multi_rows: false,
    }))
}

/// The tensor-core kernel for half-precision operands, with its tiles fixed: cubek's inference
/// gives a half-precision product whose `m` is at least 4 `n` (the scan's `C · S` and `M · x` at
/// the 130m shape: `m` = 256, `n` = 64) 32 × 8 tiles, 16 warps of 16 accumulator tiles each:
/// 512-thread cubes, so at most 128 registers a thread, and ptxas spilled 400–1,200 B a thread
/// (`docs/cuda-kernels.md`). Here each warp holds one row of at most 4 accumulator tiles of
/// 16 × 16 (32 registers), and a cube at most 4 warps (a 64 × 64 block of the output, `k` in
/// steps of 32): 29–96 registers on sm_80 and sm_90, none spilled for lack of them. `None` where the device has no 16 × 16 × 16
/// tensor-core product for the types, or cubek would copy an operand first (its layout is then
/// not the one the blueprint would be built for).
fn half_tiles<R: CubeRuntime>(
    client: &ComputeClient<R>,
    lhs: &InputBinding<R>,
    rhs: &InputBinding<R>,
    out: &TensorBinding<R>,
    dtypes: &MatmulElems,
) -> Option<Strategy> {
    const TILE: usize = 16;
    const WARPS: usize = 4;
    const TILES_N: usize = 4;
    let tile_matmul = TileMatmulKind::Cmma;
    let supported = tile_matmul.is_supported(
        client,
        MmaConfig {
            a_type: dtypes.lhs_register,
            b_type: dtypes.rhs_register,
            cd_type: dtypes.acc_register,
            m: TILE as u32,
            n: TILE as u32,
            k: TILE as u32,
        },
    );
    let copied = |input: &InputBinding<R>| {
        matrix_batch_layout(&input.data().strides, input.scheme())
            == MatrixBatchLayout::HighlyPermuted
    };
    if !supported || copied(lhs) || copied(rhs) {
        return None;
    }
    let address_type = lhs
        .required_address_type()
        .max(rhs.required_address_type())
        .max(out.required_address_type(dtypes.acc_global.size()));
    let problem = MatmulProblem::from_shapes_and_strides(
        lhs.shape().clone(),
        rhs.shape().clone(),
        out.shape.clone(),
        lhs.data().strides.clone(),
        rhs.data().strides.clone(),
        out.strides.clone(),
        dtypes.as_global_elems(),
        address_type,
        lhs.scheme(),
        rhs.scheme(),
    )
    .ok()?;
    // as few warps and tiles as the product needs, up to a 64 × 64 block and `k` steps of 32
    let tiles = |extent: usize, most: usize| extent.div_ceil(TILE).next_power_of_two().min(most);
    let scheme = TilingScheme::builder()
        .with_tile_size((TILE as u32, TILE as u32, TILE as u32).into())
        .with_partition_size(
            (
                1,
                tiles(problem.n, TILES_N) as u32,
                tiles(problem.k, 2) as u32,
            )
                .into(),
        )
        .with_stage_size((tiles(problem.m, WARPS) as u32, 1, 1).into())
        .build()
        .ok()?;
    let plane_dim = client.properties().hardware.plane_size_max;
    let blueprint = TilingBlueprint::builder(tile_matmul, scheme, plane_dim, &problem)
        .partition_buffering(PartitionBuffering::Single)
        .build();
    Some(Strategy::SimpleCyclicCmma(BlueprintStrategy::Forced(
        blueprint,
    )))
}

/// The runtimes and operand types found without tensor cores.
static WITHOUT: Mutex<Option<HashSet<(TypeId, DType)>>> = Mutex::new(None);

/// The product `lhs · rhs` of two `[.., m, k]`, `[.., k, n]` tensors of the operand type,
/// accumulated in `f32` and written in `out`'s type: on tensor cores with a fixed kernel where
/// the device has them, else through Burn's autotune (module docs).
pub(super) fn product<R, F, I, BT, const D: usize>(
    lhs: Tensor<CubeBackend<R, F, I, BT>, D>,
    rhs: Tensor<CubeBackend<R, F, I, BT>, D>,
    out: DType,
) -> CubeTensor<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let (lhs_dims, rhs_dims) = (lhs.dims(), rhs.dims());
    let (lhs, rhs) = (primitive(lhs), primitive(rhs));
    let key = (TypeId::of::<R>(), lhs.dtype);
    let known_without = {
        let without = WITHOUT.lock().unwrap_or_else(|e| e.into_inner());
        without.as_ref().is_some_and(|set| set.contains(&key))
    };
    if !known_without {
        let output = init_matmul_output(&lhs, &rhs, out);
        match launch(&lhs, &rhs, &output) {
            Ok(()) => return output,
            Err(MatmulSetupError::Unavailable(_)) => {
                let mut without = WITHOUT.lock().unwrap_or_else(|e| e.into_inner());
                without.get_or_insert_with(HashSet::new).insert(key);
            }
            // this problem only (a size or layout the kernel does not take)
            Err(_) => {}
        }
    }
    matmul(lhs, rhs, None, MatmulStrategy::default(), out)
        .unwrap_or_else(|e| panic!("the scan's product {lhs_dims:?} · {rhs_dims:?}: {e:?}"))
}

/// One product through cubek's tensor-core kernel, its tiles fixed for half-precision operands
/// ([`half_tiles`]), else as cubek infers them; an error where it does not set up.
fn launch<R: CubeRuntime>(
    lhs: &CubeTensor<R>,
    rhs: &CubeTensor<R>,
    out: &CubeTensor<R>,
) -> Result<(), MatmulSetupError> {
    let mut dtypes = MatmulElems::from_globals(&MatmulGlobalElems {
        lhs: lhs.dtype.into(),
        rhs: rhs.dtype.into(),
        out: out.dtype.into(),
    });
    let lhs_binding = InputBinding::new(lhs.clone().binding(), lhs.dtype.into());
    let rhs_binding = InputBinding::new(rhs.clone().binding(), rhs.dtype.into());
    let out_binding = out.clone().binding();
    let half = matches!(lhs.dtype, DType::F16 | DType::BF16) && rhs.dtype == lhs.dtype;
    let strategy = half
        .then(|| {
            half_tiles(
                &out.client,
                &lhs_binding,
                &rhs_binding,
                &out_binding,
                &dtypes,
            )
        })
        .flatten()
        .unwrap_or_else(tensor_cores);
    launch_ref(
        &strategy,
        &out.client,
        lhs_binding,
        rhs_binding,
        out_binding,
        &mut dtypes,
    )
}
