//! The fused scan's matrix products: cubek's matmul with a fixed choice of kernel per runtime
//! and operand type, not Burn's autotune.
//!
//! Burn's `matmul` autotunes each new problem key (shape class, layouts, types) by compiling and
//! timing candidate kernels; the scan issues 9 products a layer, each its own key, so on a
//! first run its autotune compiled candidate after candidate (about 95 s before the first step
//! of one layer on an H200, `docs/performance.md`, "Cold start"). Its products are all of one
//! class: batched, row-major operands of the model's type, inner dimensions of 16 and more at
//! every published shape, `f32` accumulation. So the choice is made once, in this order:
//!
//! 1. cubek's simple cyclic tile matmul on tensor cores (`cmma`), where the device has them for
//!    the operand type: what autotune ranks first for such products on Cuda (and where `f32`
//!    multiplies as TF32, as the Cuda tests allow);
//! 2. the register-tile unit matmul: devices without tensor cores (Vulkan on lavapipe, Metal);
//! 3. the naive kernel, which takes every layout.
//!
//! A kernel the device cannot run (no tensor cores for the type) is skipped from then on for
//! that runtime and type; one that does not take a particular problem falls through to the next
//! for that problem only. The products of a training step then compile one kernel each, and
//! nothing is timed.

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::Mutex;

use burn::tensor::{DType, Tensor};
use burn_cubecl::kernel::matmul::init_matmul_output;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubek::matmul::components::tile::TileMatmulKind;
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems, MatmulSetupError};
use cubek::matmul::launch::{launch_ref, Strategy};
use cubek::matmul::routines::simple::SimpleArgs;
use cubek::matmul::routines::BlueprintStrategy;
use cubek::std::InputBinding;

use crate::ssd::backend::primitive;

/// The kernels tried, in order of preference (module docs).
fn strategies() -> [Strategy; 3] {
    [
        Strategy::SimpleCyclicCmma(BlueprintStrategy::Inferred(SimpleArgs {
            tile_matmul: TileMatmulKind::Cmma,
            multi_rows: false,
        })),
        Strategy::SimpleUnit(BlueprintStrategy::Inferred(Default::default())),
        Strategy::Naive,
    ]
}

/// Per runtime and operand type, the first of [`strategies`] that the device can run (those
/// before it failed to set up as unavailable: a missing instruction or type).
static SKIP: Mutex<Option<HashMap<(TypeId, DType), usize>>> = Mutex::new(None);

/// The product `lhs · rhs` of two `[.., m, k]`, `[.., k, n]` tensors of the operand type,
/// accumulated in `f32` and written in `out`'s type, with the kernel chosen for `R` and the
/// operand type (module docs).
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
    let output = init_matmul_output(&lhs, &rhs, out);
    let key = (TypeId::of::<R>(), lhs.dtype);
    let mut errors = Vec::new();
    for (index, strategy) in strategies().iter().enumerate().skip(first_available(key)) {
        match launch(strategy, &lhs, &rhs, &output) {
            Ok(()) => return output,
            // the device lacks what the kernel needs (tensor cores for this type): never again
            // for this runtime and type
            Err(e @ MatmulSetupError::Unavailable(_)) => {
                unavailable(key, index);
                errors.push(format!("{strategy}: {e:?}"));
            }
            // this problem only (a size or layout the kernel does not take)
            Err(e) => errors.push(format!("{strategy}: {e:?}")),
        }
    }
    panic!(
        "no matmul kernel sets up for the scan's product {lhs_dims:?} · {rhs_dims:?}: {}",
        errors.join("; ")
    )
}

/// The first of [`strategies`] not known to be unavailable for this runtime and type.
fn first_available(key: (TypeId, DType)) -> usize {
    let skip = SKIP.lock().unwrap_or_else(|e| e.into_inner());
    skip.as_ref()
        .and_then(|m| m.get(&key).copied())
        .unwrap_or(0)
}

/// Marks [`strategies`]`[index]` unavailable for this runtime and type, with those before it.
fn unavailable(key: (TypeId, DType), index: usize) {
    let mut skip = SKIP.lock().unwrap_or_else(|e| e.into_inner());
    let first = skip
        .get_or_insert_with(HashMap::new)
        .entry(key)
        .or_insert(0);
    *first = (*first).max(index + 1);
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
