//! Each kernel's figures, its theoretical occupancy, and the table of docs/cuda-kernels.md.

use std::fmt::Write;

use crate::offline::Compiled;
use crate::toolkit::Resources;

/// One kernel on one architecture: what CubeCL generated and what NVIDIA's compilers made of it.
pub struct Row {
    pub kernel: Compiled,
    pub outcome: Result<Resources, String>,
}

impl Row {
    /// The kernel's short name: the function of its `#[cube]` module, without the generic
    /// arguments and the crate path.
    pub fn short_name(&self) -> String {
        let name = self
            .kernel
            .name
            .split('<')
            .next()
            .unwrap_or(&self.kernel.name);
        let parts: Vec<&str> = name.split("::").collect();
        // `crate::...::module::function::Function`: the module and the function
        match parts.as_slice() {
            [.., module, function, _] => format!("{module}::{function}"),
            [.., last] => last.to_string(),
            [] => String::new(),
        }
    }

    /// Whether the kernel is the crate's own (the fused SSD) rather than Burn's or cubek's.
    pub fn is_ours(&self) -> bool {
        self.kernel.name.starts_with("mamba2_burn::")
    }

    pub fn threads(&self) -> u32 {
        let (x, y, z) = self.kernel.cube_dim;
        x * y * z
    }

    /// Bytes spilled, stored and loaded together.
    pub fn spilled(&self) -> u32 {
        self.outcome
            .as_ref()
            .map_or(0, |r| r.spill_stores + r.spill_loads)
    }

    /// Why the kernel fails the check: a compile error, shared memory past the limit (CubeCL
    /// refuses such a launch: `Compiled::source`), a spill that `KNOWN_SPILLS` does not list or
    /// that is larger than it allows.
    pub fn failure(&self) -> Option<String> {
        match (&self.kernel.source, &self.outcome) {
            (Err(e), _) => Some(format!("CubeCL: {e}")),
            (_, Err(e)) => Some(e.clone()),
            (_, Ok(r)) if self.spilled() > 0 => {
                let spill = format!(
                    "spills {} B stored, {} B loaded",
                    r.spill_stores, r.spill_loads
                );
                match self.known_spill() {
                    Some(most) if self.spilled() <= most => None,
                    Some(most) => Some(format!("{spill}: more than the {most} B known")),
                    None => Some(spill),
                }
            }
            _ => None,
        }
    }

    /// The most `KNOWN_SPILLS` allows this kernel on its target.
    pub fn known_spill(&self) -> Option<u32> {
        let name = self.short_name();
        KNOWN_SPILLS
            .iter()
            .find(|(kernel, arch, _)| *kernel == name && *arch == self.kernel.arch)
            .map(|&(_, _, most)| most)
    }

    /// Resident warps per multiprocessor over the most it holds (64), from the registers, the
    /// shared memory and the threads of a block.
    pub fn occupancy(&self) -> Option<f64> {
        let r = self.outcome.as_ref().ok()?;
        Some(occupancy(
            self.kernel.arch,
            self.threads(),
            r.registers,
            self.kernel.shared_bytes + r.static_shared_bytes as usize,
        ))
    }
}

/// The spills this check found when it was written, each the most it allows (bytes stored and
/// loaded, per kernel and target; above the largest seen in six runs, as CubeCL's code for one
/// kernel varies a little from process to process and ptxas's allocation with it). A spill of
/// another kernel, or a larger one, fails the check; shrinking these is open work
/// (docs/cuda-kernels.md, "Spills").
/// - `score_grads`: the scan's score gradient at 64 threads, where ptxas holds it at 128
///   registers on sm_90 (12–32 B in the tiled and tensor-core variants at the 130m shape);
/// - cubek's `matmul_entry`: the scan's products on tensor cores in `f16` / `bf16` at the 130m
///   shape, where cubek infers a block of 512 threads (16 planes), so 128 registers a thread at
///   most, and spills 700–1,200 B;
/// - `chunk_scan_grads`: the same at the edge, now and then 12 B on sm_90 (as CubeCL lays out
///   its shared memory: the offsets vary between processes);
/// - Burn's `reduce_kernel`: a sum (16–56 B).
pub const KNOWN_SPILLS: [(&str, u32, u32); 8] = [
    ("scores::score_grads", 80, 64),
    ("scores::score_grads", 90, 64),
    ("grads::chunk_scan_grads", 80, 64),
    ("grads::chunk_scan_grads", 90, 64),
    ("matmul::matmul_entry", 80, 1400),
    ("matmul::matmul_entry", 90, 1400),
    ("base::reduce_kernel", 80, 96),
    ("base::reduce_kernel", 90, 96),
];

/// Theoretical occupancy on sm_80 / sm_90 (the rules of NVIDIA's occupancy calculator): 64
/// warps and 32 blocks a multiprocessor, 65,536 registers allocated 256 at a time per warp,
/// shared memory in 128-byte units with 1 KiB reserved per block, out of 164 KiB (sm_80) or
/// 228 KiB (sm_90) a multiprocessor.
pub fn occupancy(arch: u32, threads: u32, registers: u32, shared: usize) -> f64 {
    const MAX_WARPS: u32 = 64;
    const MAX_BLOCKS: u32 = 32;
    let warps = threads.div_ceil(32).max(1);
    let by_warps = MAX_WARPS / warps;
    let by_registers = if registers == 0 {
        MAX_BLOCKS
    } else {
        let per_warp = (registers * 32).div_ceil(256) * 256;
        (65_536 / per_warp) / warps
    };
    let per_sm = if arch >= 90 { 233_472 } else { 167_936 };
    let per_block = (shared + 1024).div_ceil(128) * 128;
    let by_shared = (per_sm / per_block) as u32;
    let blocks = MAX_BLOCKS.min(by_warps).min(by_registers).min(by_shared);
    (blocks * warps) as f64 / MAX_WARPS as f64
}

/// The architecture's name as NVRTC and ptxas take it (`sm_90a`: Hopper's features, as
/// cubecl-cuda compiles from sm_90).
pub fn target(arch: u32) -> String {
    if arch >= 90 {
        format!("sm_{arch}a")
    } else {
        format!("sm_{arch}")
    }
}

fn percent(o: f64) -> String {
    format!("{:.0}%", o * 100.0)
}

/// The markdown tables of `rows`: every kernel of the fused SSD, one row each; Burn's and
/// cubek's grouped by kernel and target (their count, and the range of each figure).
pub fn markdown(rows: &[Row], header: &str) -> String {
    let mut s = String::from(header);
    let _ = writeln!(s, "\n## The fused SSD's kernels\n");
    let _ = writeln!(
        s,
        "| kernel | first launched by | target | threads | registers | shared B | spill B | \
         occupancy | HMMA |"
    );
    let _ = writeln!(s, "|---|---|---|---:|---:|---:|---:|---:|---:|");
    for row in rows.iter().filter(|r| r.is_ours()) {
        let (registers, hmma) = match &row.outcome {
            Ok(r) => (
                r.registers.to_string(),
                r.tensor_core_instructions
                    .map_or("-".to_string(), |n| n.to_string()),
            ),
            Err(_) => ("error".into(), "-".into()),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {registers} | {} | {} | {} | {hmma} |",
            row.short_name(),
            row.kernel.context,
            target(row.kernel.arch),
            row.threads(),
            row.kernel.shared_bytes,
            row.spilled(),
            row.occupancy().map_or("-".to_string(), percent),
        );
    }
    let _ = writeln!(
        s,
        "\n## Burn's and cubek's kernels, by kernel and target\n\n\
         Launched by the same runs: the scan's products (cubek's matmul, at every shape), the \
         casts, fills and sums around them.\n"
    );
    let _ = writeln!(
        s,
        "| kernel | target | kernels | threads | registers | shared B | spill B (most) | \
         occupancy | with HMMA |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut groups: Vec<(String, u32)> = Vec::new();
    for row in rows.iter().filter(|r| !r.is_ours()) {
        let key = (row.short_name(), row.kernel.arch);
        if !groups.contains(&key) {
            groups.push(key);
        }
    }
    let range = |v: Vec<f64>, f: &dyn Fn(f64) -> String| {
        let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
        let hi = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        match v.is_empty() {
            true => "-".to_string(),
            false if lo == hi => f(lo),
            false => format!("{}–{}", f(lo), f(hi)),
        }
    };
    let int = |x: f64| format!("{x:.0}");
    for (name, arch) in groups {
        let group: Vec<&Row> = rows
            .iter()
            .filter(|r| !r.is_ours() && r.kernel.arch == arch && r.short_name() == name)
            .collect();
        let ok: Vec<&&Row> = group.iter().filter(|r| r.outcome.is_ok()).collect();
        let figure = |f: &dyn Fn(&Row) -> f64| ok.iter().map(|r| f(r)).collect::<Vec<_>>();
        let registers = figure(&|r| r.outcome.as_ref().map_or(0.0, |o| o.registers as f64));
        let with_hmma = ok
            .iter()
            .filter(|r| {
                r.outcome
                    .as_ref()
                    .is_ok_and(|o| o.tensor_core_instructions.unwrap_or(0) > 0)
            })
            .count();
        let _ = writeln!(
            s,
            "| {name} | {} | {} | {} | {} | {} | {} | {} | {with_hmma} |",
            target(arch),
            group.len(),
            range(figure(&|r| r.threads() as f64), &int),
            range(registers, &int),
            range(figure(&|r| r.kernel.shared_bytes as f64), &int),
            group.iter().map(|r| r.spilled()).max().unwrap_or(0),
            range(figure(&|r| r.occupancy().unwrap_or(0.0)), &percent),
        );
    }
    s
}

/// Every row, tab-separated, with the kernel's full name and compile times (`--out`).
pub fn tsv(rows: &[Row]) -> String {
    let mut s = String::from(
        "arch\tkernel\tcontext\tthreads\tshared\tregisters\tspill_stores\tspill_loads\t\
         stack\toccupancy\thmma\tnvrtc_s\tptxas_s\tname\terror\n",
    );
    for row in rows {
        let k = &row.kernel;
        let r = row.outcome.as_ref().ok().cloned().unwrap_or_default();
        let _ = writeln!(
            s,
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{:.3}\t{}\t{:.3}\t{:.3}\t{}\t{}",
            k.arch,
            row.short_name(),
            k.context,
            row.threads(),
            k.shared_bytes,
            r.registers,
            r.spill_stores,
            r.spill_loads,
            r.stack_bytes,
            row.occupancy().unwrap_or(0.0),
            r.tensor_core_instructions.map_or(-1, |n| n as i64),
            r.nvrtc_seconds,
            r.ptxas_seconds,
            k.name,
            row.failure().unwrap_or_default().replace(['\n', '\t'], " "),
        );
    }
    s
}
