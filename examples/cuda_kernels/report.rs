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
    /// refuses such a launch: `Compiled::source`), or a spill that is not ptxas's trade for
    /// occupancy ([`Row::occupancy_trade`]).
    pub fn failure(&self) -> Option<String> {
        match (&self.kernel.source, &self.outcome) {
            (Err(e), _) => Some(format!("CubeCL: {e}")),
            (_, Err(e)) => Some(e.clone()),
            (_, Ok(r)) if self.spilled() > 0 && !self.occupancy_trade() => Some(format!(
                "spills {} B stored, {} B loaded at {} registers",
                r.spill_stores, r.spill_loads, r.registers
            )),
            _ => None,
        }
    }

    /// Whether a spill is ptxas's trade for occupancy rather than a lack of registers: ptxas
    /// stopped where one more allocation unit of registers (8 a thread) would hold fewer blocks
    /// on a multiprocessor as far as ptxas can tell (registers, threads, static shared memory),
    /// though the block could still run with it, and stored at most
    /// [`TRADE_MOST`] bytes. ptxas makes that trade on its own, for kernels a few registers past
    /// such a step, whatever the kernel's launch bounds (`ptxas --maxrregcount 255` on the same
    /// PTX makes the same choice), and CubeCL gives no way to ask otherwise; a spill at the most
    /// registers a block of that size may have, or a larger one, fails.
    pub fn occupancy_trade(&self) -> bool {
        let Ok(r) = &self.outcome else {
            return false;
        };
        // ptxas sees the static shared memory only: CubeCL's arrays are one dynamic allocation,
        // sized at launch
        let shared = r.static_shared_bytes as usize;
        let at = occupancy(self.kernel.arch, self.threads(), r.registers, shared);
        let more = occupancy(self.kernel.arch, self.threads(), r.registers + 8, shared);
        r.spill_stores <= TRADE_MOST && r.registers + 8 <= 255 && more > 0.0 && more < at
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

/// The most bytes a thread may store to local memory in ptxas's trade for occupancy
/// ([`Row::occupancy_trade`]): 16 registers' worth; the largest seen, Burn's sum at 32 registers,
/// stored 36 B.
pub const TRADE_MOST: u32 = 64;

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
