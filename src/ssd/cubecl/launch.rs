//! What every launch of the fused scan shares: buffers, the launch grid, the address type and
//! the element types.

use burn::tensor::{DType, Shape};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

use super::kernels::{FRAG, PLANE};
use crate::ssd::fused::ScanProducts;
use crate::ssd::geometry::CUBE_SIZE;
use cubecl::ir::features::MmaConfig;

/// An uninitialised contiguous `f32` tensor on `like`'s device.
pub(super) fn empty<R: CubeRuntime>(
    like: &CubeTensor<R>,
    shape: impl Into<Shape>,
) -> CubeTensor<R> {
    empty_device_contiguous_dtype(
        like.client.clone(),
        like.device.clone(),
        shape.into(),
        DType::F32,
    )
}

/// An uninitialised contiguous tensor of `dtype` on `like`'s device.
pub(super) fn empty_as<R: CubeRuntime>(
    like: &CubeTensor<R>,
    shape: impl Into<Shape>,
    dtype: DType,
) -> CubeTensor<R> {
    empty_device_contiguous_dtype(
        like.client.clone(),
        like.device.clone(),
        shape.into(),
        dtype,
    )
}

/// The element type of a kernel that computes in `f32` only.
pub(super) fn f32_type() -> StorageType {
    DType::F32.into()
}

/// The element types of a kernel that computes in `f32` and reads or writes operands of type
/// `e` (its `#[define(F, E)]`).
pub(super) fn types(e: DType) -> [StorageType; 2] {
    [DType::F32.into(), e.into()]
}

/// How the tiled kernels compute their tile products (their comptime flags): read from the
/// matmul's transient products, or on fragments staged in shared memory (on tensor cores with
/// `cmma`), else in registers.
#[derive(Clone, Copy, Debug)]
pub(super) struct TileMode {
    pub(super) transient: bool,
    pub(super) fragments: bool,
    pub(super) cmma: bool,
}

impl TileMode {
    /// The mode of `products` for operands of type `e` on `like`'s device: tensor cores where
    /// the device has `FRAG³` fragments of `e` with `f32` accumulators and planes of
    /// `kernels::PLANE` threads, else the fragments' products on the ordinary cores.
    pub(super) fn of<R: CubeRuntime>(
        like: &CubeTensor<R>,
        products: ScanProducts,
        e: DType,
    ) -> Self {
        let fragments = products == ScanProducts::TensorCores;
        let props = like.client.properties();
        let side = FRAG as u32;
        let cmma = fragments
            && props.hardware.plane_size_min == PLANE as u32
            && props.hardware.plane_size_max == PLANE as u32
            && props.features.matmul.cmma.contains(&MmaConfig {
                a_type: e.into(),
                b_type: e.into(),
                cd_type: DType::F32.into(),
                m: side,
                n: side,
                k: side,
            });
        Self {
            transient: products == ScanProducts::Transient,
            fragments,
            cmma,
        }
    }
}

/// A one-element placeholder for an argument a kernel does not read.
pub(super) fn unused<R: CubeRuntime>(like: &CubeTensor<R>) -> CubeTensor<R> {
    empty(like, [1])
}

/// The launch grid of one thread per element of `count`.
pub(super) fn grid<R: CubeRuntime>(like: &CubeTensor<R>, count: usize) -> (CubeCount, CubeDim) {
    let dim = CubeDim::new_1d(CUBE_SIZE as u32);
    (
        cubecl::calculate_cube_count_elemwise(&like.client, count, dim),
        dim,
    )
}

/// The launch grid of `cubes` cubes of `side × side` threads (the tiled kernels: a cube per
/// tile, its threads the tile's elements).
pub(super) fn tile_grid<R: CubeRuntime>(
    like: &CubeTensor<R>,
    cubes: usize,
    side: usize,
) -> (CubeCount, CubeDim) {
    let dim = CubeDim::new_2d(side as u32, side as u32);
    (
        cubecl::calculate_cube_count_elemwise(&like.client, cubes * side * side, dim),
        dim,
    )
}

/// The indices a launch over `tensors` needs: 64-bit once one of them holds more than 2³²
/// elements (CubeCL's default 32-bit indices would wrap there and read the wrong element
/// without an error), 32-bit otherwise, where they are cheaper.
pub(super) fn address_type<R: CubeRuntime>(tensors: &[&CubeTensor<R>]) -> AddressType {
    tensors
        .iter()
        .map(|t| t.required_address_type())
        .max()
        .unwrap_or_default()
}

/// Launches the kernel `kernels::$kernel` with one thread per element of `$threads` (or, with
/// `tiles $cubes`, `$cubes` cubes of `TILE × TILE` threads, with `blocks
/// $cubes` of `UNITS × UNITS` (`ssd::geometry`), [`tile_grid`]):
/// its tensor arguments (local variables, in the kernel's order), then its other arguments, the
/// element types last ([`f32_type`], [`types`]).
/// The address type covers every tensor of the launch ([`address_type`]).
macro_rules! launch {
    ($kernel:ident, tiles $cubes:expr; $($tensor:ident),+; $($arg:expr),* $(,)?) => {{
        let tensors: &[&burn_cubecl::tensor::CubeTensor<R>] = &[$(&$tensor),+];
        let grid = super::launch::tile_grid(tensors[0], $cubes, crate::ssd::geometry::TILE);
        super::launch::launch!(@run $kernel, grid, tensors; $($tensor),+; $($arg),*);
    }};
    ($kernel:ident, blocks $cubes:expr; $($tensor:ident),+; $($arg:expr),* $(,)?) => {{
        let tensors: &[&burn_cubecl::tensor::CubeTensor<R>] = &[$(&$tensor),+];
        let grid = super::launch::tile_grid(tensors[0], $cubes, crate::ssd::geometry::UNITS);
        super::launch::launch!(@run $kernel, grid, tensors; $($tensor),+; $($arg),*);
    }};
    ($kernel:ident, $threads:expr; $($tensor:ident),+; $($arg:expr),* $(,)?) => {{
        let tensors: &[&burn_cubecl::tensor::CubeTensor<R>] = &[$(&$tensor),+];
        let grid = super::launch::grid(tensors[0], $threads);
        super::launch::launch!(@run $kernel, grid, tensors; $($tensor),+; $($arg),*);
    }};
    (@run $kernel:ident, $grid:expr, $tensors:expr; $($tensor:ident),+; $($arg:expr),*) => {{
        let tensors = $tensors;
        let (count, dim) = $grid;
        let address = super::launch::address_type(tensors);
        let client = tensors[0].client.clone();
        // SAFETY: every index is within its tensor: each kernel checks its thread position
        // against its element count and derives every index from the shapes, and the address
        // type holds the largest index of the launch
        unsafe {
            super::kernels::$kernel::launch_unchecked::<R>(
                &client,
                count,
                dim,
                address,
                $($tensor.clone().into_tensor_arg(),)+
                $($arg,)*
            );
        }
    }};
}
pub(super) use launch;
