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
use cubek::matmul::components::tile::TileMatmulKind;
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems, MatmulSetupError};
use cubek::matmul::launch::{launch_ref, Strategy};
use cubek::matmul::routines::simple::SimpleArgs;
use cubek::matmul::routines::BlueprintStrategy;
use cubek::std::InputBinding;

use crate::ssd::primitive::primitive;

/// The tensor-core kernel (module docs).
fn tensor_cores() -> Strategy {
    Strategy::SimpleCyclicCmma(BlueprintStrategy::Inferred(SimpleArgs {
        tile_matmul: TileMatmulKind::Cmma,
        multi_rows: false,
    }))
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
        match launch(&tensor_cores(), &lhs, &rhs, &output) {
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

/// One product through cubek with `strategy`; an error where it does not set up.
fn launch<R: CubeRuntime>(
    strategy: &Strategy,
    lhs: &CubeTensor<R>,
    rhs: &CubeTensor<R>,
    out: &CubeTensor<R>,
) -> Result<(), MatmulSetupError> {
    let mut dtypes = MatmulElems::from_globals(&MatmulGlobalElems {
        lhs: lhs.dtype.into(),
        rhs: rhs.dtype.into(),
        out: out.dtype.into(),
    });
    launch_ref(
        strategy,
        &out.client,
        InputBinding::new(lhs.clone().binding(), lhs.dtype.into()),
        InputBinding::new(rhs.clone().binding(), rhs.dtype.into()),
        out.clone().binding(),
        &mut dtypes,
    )
}
