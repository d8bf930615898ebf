//! The launch geometry of the fused CubeCL scan: cube and tile sides that its kernels
//! (`ssd/cubecl/kernels`) are written for and that its cost model ([`super::cost`]) counts
//! with. No feature gate: the cost model is built without CubeCL.

/// Threads per cube of the scan's one-thread-per-element kernels.
pub(crate) const CUBE_SIZE: usize = 64;

/// The scans (`chunk_prep`, `decay_scans`) run in cubes of `TILE × TILE` threads, a thread per
/// step of a chunk.
pub(crate) const TILE: usize = 16;

/// The side of the output tile of one cube of the tiled kernels (`chunk_scan`,
/// `chunk_scan_grads`, `score_grads`): `UNITS × UNITS` threads, each computing `PER × PER`
/// adjacent elements of it (rows `ty·PER + u`, columns `tx·PER + v`): few threads with many
/// elements each, so that each operand read from shared memory serves `PER` multiply-adds.
pub(crate) const BLOCK: usize = 32;

/// The threads of a cube of the tiled kernels along each side (the cost model counts a tiled
/// kernel's work per tile, not per thread: only the kernels read it).
#[cfg_attr(not(feature = "cubecl"), allow(dead_code))]
pub(crate) const UNITS: usize = 8;

/// The elements of each thread of the tiled kernels along each side.
#[cfg_attr(not(feature = "cubecl"), allow(dead_code))]
pub(crate) const PER: usize = BLOCK / UNITS;

/// The values per head and tile pair of `score_grads`' `spans`: the pairs' sums for the steps
/// of the tile of `s`, for those of the tile of `i`, and the tile pair's total.
pub(crate) const SPAN_WIDTH: usize = 2 * BLOCK + 1;
