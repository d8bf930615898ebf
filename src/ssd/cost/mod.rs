//! A cost model of the fused CubeCL scan (`ssd::cubecl`): one [`Launch`] per kernel and matrix
//! product that its forward and its gradient issue, in their order, with
//! the work each does, and an estimate of its time on a GPU at stated peak rates
//! ([`Rates`]). It mirrors `ssd/cubecl/forward.rs` and `backward.rs` step by step and changes
//! with them; `bench --mode ssd-cost` prints it, and tests hold its budgets.
//!
//! Lavapipe proves the scan correct but says nothing of a GPU's speed; the model says where the
//! time of a GPU goes: FLOPs on tensor cores (the products) and off them (the kernels), bytes
//! read and written, cubes (how much of the GPU a launch fills) and the longest serial chain of
//! one thread. A launch's time is its fixed cost plus the largest of its compute time, its
//! memory time (the roofline) and, for the plain kernels, its longest chain. At a data sheet's
//! peaks ([`Rates::h100`]) the estimate is a lower bound for this structure; at the rates the
//! launches achieved on an H200 ([`Rates::h200_calibrated`], [`H200_CALIBRATION`]) it is the
//! code's time as measured there, launch by launch within 1.5×.
//!
//! What it assumes, where the code cannot tell it:
//! - bytes: every tensor a launch reads is read once from memory and every one it writes is
//!   written once (caches serve the re-reads, for example a group's scores read by each of its
//!   heads);
//! - products: Burn's matmul in tiles of 64 × 64 of the output per cube, the operands' type on
//!   tensor cores (`f32` as TF32), `f32` outputs but for the per-head parts the tiled kernels
//!   read (`C·S_inᵀ`, `B·G_outᵀ`), in the operand type;
//! - the scan's tiled kernels: a cube of `UNITS × UNITS` threads per `BLOCK × BLOCK` tile of the output
//!   (`4 × 4` elements each), their multiply-adds on the
//!   cores that are not tensor cores (no `cmma` yet);
//! - with the tensor-core tiles ([`ScanProducts::TensorCores`]), the tiled kernels'
//!   multiply-adds run on tensor cores at the products' rate, their other work as before (the
//!   staging in shared memory is not counted);
//! - with the transient products ([`ScanProducts::Transient`]), the intra-chunk products are
//!   products as the others, over the whole `q × q` matrices (the matmul does not skip the
//!   zeros above the diagonal), on each head's matrices written and read once; the tiled
//!   kernels keep their element-wise work.
//!
//! Dimension letters as in [`crate::ssd`].
//!
//! - occupancy: the scan's kernels hold the warps per multiprocessor that ptxas's registers
//!   allow them on sm_90 (`docs/cuda-kernels.md`, written by `examples/cuda_kernels` without a
//!   GPU); at calibrated rates a kernel's arithmetic off tensor cores runs at the fitted rate
//!   times its occupancy over that of the kernels the rate was fitted on.
//!
//! The model in files: the shapes and launches ([`ScanShape`], [`Launch`]: `launch.rs`), the
//! rates of a GPU (`rates.rs`), the kernels' occupancy (`occupancy.rs`), the builder of a
//! pass's launches (`plan.rs`) and the two passes (`passes.rs`).
//!
//! [`ScanProducts::TensorCores`]: crate::ssd::ScanProducts::TensorCores
//! [`ScanProducts::Transient`]: crate::ssd::ScanProducts::Transient

mod launch;
mod occupancy;
mod passes;
mod plan;
mod rates;

pub use launch::{heavy, totals, Launch, LaunchKind, Pass, ScanShape, Totals};
pub use occupancy::{calibration_occupancy, occupancy, TARGET};
pub use passes::{backward_launches, chunk_scan_product_flops, forward_launches};
pub use rates::{Calibration, Rates, H200_CALIBRATION};
