//! The theoretical occupancy of the scan's own kernels on a GPU, read from the table that
//! `examples/cuda_kernels` writes from ptxas's figures (`docs/cuda-kernels.md`): what the cost
//! model scales the tiled kernels' arithmetic by (`Launch::seconds`).
//!
//! A kernel's registers, threads and static shared memory do not depend on the scan's sizes
//! (they are runtime arguments; the comptime branches are the products' variant, the types,
//! an initial state and documents), so the 130m rows serve every shape.

use std::sync::OnceLock;

use crate::ssd::fused::ScanProducts;

/// The table, as `examples/cuda_kernels --markdown docs/cuda-kernels.md` writes it.
const TABLE: &str = include_str!("../../../docs/cuda-kernels.md");

/// The target the model's GPUs (H100, H200) compile for, as the table names it.
pub const TARGET: &str = "sm_90a";

/// The name of the operands' type in the table: `bf16` for 2-byte operands (the type the
/// model's calibration ran; `f16` kernels take the same registers within ptxas's variation).
fn dtype(element_bytes: usize) -> &'static str {
    if element_bytes <= 2 {
        "bf16"
    } else {
        "f32"
    }
}

/// One row of the table's first section: the kernel by its function's name (`chunk_scan`),
/// the context that first launched it, its target, its occupancy as a fraction.
type Row = (&'static str, &'static str, &'static str, f64);

/// The rows of the table's first section, read once.
fn rows() -> &'static [Row] {
    static ROWS: OnceLock<Vec<Row>> = OnceLock::new();
    ROWS.get_or_init(|| {
        let section = TABLE
            .split("\n## ")
            .find(|s| s.starts_with("The fused SSD's kernels"))
            .unwrap_or("");
        section
            .lines()
            .filter_map(|line| {
                let cells: Vec<&str> = line.split('|').map(str::trim).collect();
                // | kernel | first launched by | target | threads | registers | shared | spill
                // | occupancy | HMMA |
                if cells.len() != 11 {
                    return None;
                }
                let occupancy = cells[8].strip_suffix('%')?.parse::<f64>().ok()? / 100.0;
                let kernel = cells[1].rsplit("::").next()?;
                Some((kernel, cells[2], cells[3], occupancy))
            })
            .collect()
    })
}

/// The occupancy on [`TARGET`] of the scan's kernel `kernel` (its function's name; a launch's
/// name up to its first space) in the variant `products` with operands of `element_bytes`:
/// the row first launched by that variant and type, else by that variant in another type,
/// else by any (the table lists each distinct kernel once, where it is first launched).
/// `None` where the table has no such kernel.
pub fn occupancy(kernel: &str, products: ScanProducts, element_bytes: usize) -> Option<f64> {
    let kernel = kernel.split(' ').next().unwrap_or(kernel);
    let of_kernel = || {
        rows()
            .iter()
            .filter(move |(name, _, target, _)| *name == kernel && *target == TARGET)
    };
    let variant = format!("ssd {} ", products.name());
    let exact = format!("{variant}{} ", dtype(element_bytes));
    of_kernel()
        .find(|(_, context, _, _)| context.starts_with(&exact))
        .or_else(|| of_kernel().find(|(_, context, _, _)| context.starts_with(&variant)))
        .or_else(|| of_kernel().next())
        .map(|&(_, _, _, occupancy)| occupancy)
}

/// The mean occupancy of the tiled kernels whose arithmetic [`crate::ssd::cost::Calibration`]
/// was fitted on (`chunk_scan`, `chunk_scan_grads`, `score_grads`, in the tiled variant with
/// `bf16` operands): the occupancy its `off_tensor_cores` fraction stands for. This assumes
/// the kernels profiled on the H200 (2026-12-04) took the registers the table gives them now.
pub fn calibration_occupancy() -> f64 {
    let kernels = ["chunk_scan", "chunk_scan_grads", "score_grads"];
    let found: Vec<f64> = kernels
        .iter()
        .filter_map(|k| occupancy(k, ScanProducts::Tiled, 2))
        .collect();
    if found.is_empty() {
        // a table without them: no scaling (see `Launch::seconds`)
        return 0.0;
    }
    found.iter().sum::<f64>() / found.len() as f64
}
