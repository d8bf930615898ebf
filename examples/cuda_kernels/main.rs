//! Every CUDA kernel the crate launches, compiled for sm_80 and sm_90 without a GPU: the fused
//! SSD (forward and backward, each `ScanProducts` variant, f32 / f16 / bf16, at the 130m
//! training shape and at the golden cases' shapes) and one training step of the 130m LM on
//! `Fusion<CubeBackend>` (Burn's element-wise fusion, matmul, reductions; the optimizer).
//!
//! Each launch goes through cubecl-cuda's own compiler and checks on a runtime that compiles
//! instead of running (`offline`); the CUDA C++ goes through NVRTC with cubecl-cuda's options
//! and the PTX through `ptxas -v` (`toolkit`). It fails on a compile error, shared memory above
//! the block's limit, or a register spill other than ptxas's small trades for occupancy
//! (`report::Row::occupancy_trade`), and writes the table of docs/cuda-kernels.md.
//!
//! ```text
//! # a toolkit from PyPI's wheels, as CI lays it out (.ci/run, `cuda_toolkit`)
//! CUDA_PATH=target/cuda LD_LIBRARY_PATH=target/cuda/lib64 \
//!     cargo run --release --features cuda --example cuda_kernels -- --markdown docs/cuda-kernels.md
//! ```
//!
//! The sources, PTX and cubins go to `--out` (default `artifacts/cuda-kernels/sm_XX/`).

mod offline;
mod report;
mod toolkit;
mod workloads;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use clap::Parser;
use mamba2_burn::cubecl_setup::{Applied, CubeclSetup};
use mamba2_burn::ScanProducts;

use report::Row;
use toolkit::Toolkit;

#[derive(Parser, Debug)]
#[command(about = "Compile every CUDA kernel of the crate for sm_80 and sm_90 without a GPU")]
struct Args {
    /// Compute capabilities (80: A100, 90: H100 and H200).
    #[arg(long = "arch", default_values_t = [80, 90])]
    archs: Vec<u32>,
    /// Folder of the golden cases whose shapes the scan is compiled at. Default:
    /// `MAMBA2_REFERENCE_DIR`, else tests/fixtures/reference.
    #[arg(long)]
    reference: Option<PathBuf>,
    /// Where the CUDA C++, PTX and cubins go.
    #[arg(long, default_value = "artifacts/cuda-kernels")]
    out: PathBuf,
    /// Write the table (docs/cuda-kernels.md) here.
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// Leave out the 130m LM's training step (the scan's cases only).
    #[arg(long)]
    no_lm: bool,
    /// Leave out the scan's cases (the 130m LM's training step only).
    #[arg(long)]
    no_ssd: bool,
    /// The LM step's float type (f32, f16, bf16).
    #[arg(long, default_value = "bf16")]
    lm_dtype: String,
    /// Kernels compiled at once.
    #[arg(long, default_value_t = 2)]
    jobs: usize,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let reference = args.reference.clone().unwrap_or_else(|| {
        std::env::var_os("MAMBA2_REFERENCE_DIR").map_or_else(
            || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/reference"),
            PathBuf::from,
        )
    });
    if let Some(arch) = args.archs.iter().find(|a| ![80, 90].contains(*a)) {
        eprintln!("error: --arch {arch}: the check describes sm_80 and sm_90 only (80, 90)");
        return ExitCode::from(2);
    }
    let toolkit = match Toolkit::find() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let Some(&(lm_dtype, _)) = workloads::DTYPES.iter().find(|(_, n)| *n == args.lm_dtype) else {
        eprintln!(
            "error: unknown --lm-dtype {:?} (f32, f16, bf16)",
            args.lm_dtype
        );
        return ExitCode::from(2);
    };
    let mut shapes = vec![workloads::shape_130m()];
    match workloads::golden_shapes(&reference) {
        Ok(golden) if !golden.is_empty() => shapes.extend(golden),
        Ok(_) => {
            eprintln!("error: no golden cases in {}", reference.display());
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    }

    // CubeCL as the crate's models set it up (`cubecl_setup`: autotune at the `minimal`
    // level, `CUBECL_AUTOTUNE_LEVEL` over it), its caches in an empty folder: every run compiles
    // what a fresh process launches, whatever earlier runs left in `target/`
    let cache = args.out.join("cubecl-cache");
    let _ = std::fs::remove_dir_all(&cache);
    let setup = CubeclSetup::from_env().with_cache_dir(Some(cache));
    if let Applied::UserFile(file) = setup.apply() {
        eprintln!(
            "error: {} configures CubeCL: run from elsewhere",
            file.display()
        );
        return ExitCode::from(2);
    }

    // 1. every launch through CubeCL's CUDA compiler
    let start = Instant::now();
    for &arch in &args.archs {
        if !args.no_ssd {
            workloads::ssd_cases(arch, &shapes);
        }
        if !args.no_lm {
            for (slot, products) in ScanProducts::ALL.into_iter().enumerate() {
                workloads::lm_step(arch, 1 + slot as u16, products, products.name(), lm_dtype);
            }
        }
    }
    let kernels = std::mem::take(&mut *offline::COMPILED.lock().unwrap());
    let generated = start.elapsed().as_secs_f64();
    println!(
        "{} kernels generated by CubeCL in {generated:.1} s ({} shapes: {})",
        kernels.len(),
        shapes.len(),
        shapes
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );

    // 2. NVRTC and ptxas, once per distinct source and architecture
    let start = Instant::now();
    let mut unique: HashMap<(u32, &str), usize> = HashMap::new();
    let mut jobs = Vec::new();
    for k in &kernels {
        if let Ok(source) = &k.source {
            let next = unique.len();
            unique.entry((k.arch, source.as_str())).or_insert_with(|| {
                jobs.push((next, k.arch, source.as_str()));
                next
            });
        }
    }
    for &arch in &args.archs {
        let dir = args.out.join(format!("sm_{arch}"));
        let _ = std::fs::remove_dir_all(&dir);
        if let Err(e) = std::fs::create_dir_all(&dir) {
            eprintln!("error: {}: {e}", dir.display());
            return ExitCode::from(2);
        }
    }
    let results: Mutex<Vec<Option<Result<toolkit::Resources, String>>>> =
        Mutex::new(vec![None; jobs.len()]);
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..args.jobs.max(1) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(id, arch, source)) = jobs.get(i) else {
                    break;
                };
                let dir = args.out.join(format!("sm_{arch}"));
                let stem = format!("{id:04}");
                let _ = std::fs::write(dir.join(format!("{stem}.cu")), source);
                let start = Instant::now();
                let outcome = toolkit.nvrtc(source, arch).and_then(|ptx| {
                    let nvrtc_seconds = start.elapsed().as_secs_f64();
                    let mut r = toolkit.assemble(&ptx, arch, &dir, &stem)?;
                    r.nvrtc_seconds = nvrtc_seconds;
                    Ok(r)
                });
                results.lock().unwrap()[id] = Some(outcome);
            });
        }
    });
    let results = results.into_inner().unwrap();
    let rows: Vec<Row> = kernels
        .iter()
        .map(|k| {
            let outcome = match &k.source {
                Ok(source) => results[unique[&(k.arch, source.as_str())]]
                    .clone()
                    .expect("every job ran"),
                Err(e) => Err(e.clone()),
            };
            Row {
                kernel: k.clone(),
                outcome,
            }
        })
        .collect();
    let compiled = start.elapsed().as_secs_f64();
    println!(
        "{} distinct sources through NVRTC {} and ptxas in {compiled:.1} s ({} at once)",
        jobs.len(),
        toolkit.nvrtc_version(),
        args.jobs
    );

    let tsv = args.out.join("kernels.tsv");
    if let Err(e) = std::fs::write(&tsv, report::tsv(&rows)) {
        eprintln!("error: {}: {e}", tsv.display());
        return ExitCode::from(2);
    }

    // 3. the verdict and the table
    let mut failures = 0;
    for row in &rows {
        if row.spilled() > 0 && row.failure().is_none() {
            println!(
                "occupancy trade, sm_{} {} ({}): {} B stored at {} registers",
                row.kernel.arch,
                row.short_name(),
                row.kernel.context,
                row.outcome.as_ref().map_or(0, |r| r.spill_stores),
                row.outcome.as_ref().map_or(0, |r| r.registers),
            );
        }
        if let Some(why) = row.failure() {
            failures += 1;
            println!(
                "FAIL sm_{} {} ({}): {why}",
                row.kernel.arch,
                row.short_name(),
                row.kernel.context
            );
        }
    }
    for &arch in &args.archs {
        let of_arch: Vec<&Row> = rows.iter().filter(|r| r.kernel.arch == arch).collect();
        let ok: Vec<&toolkit::Resources> = of_arch
            .iter()
            .filter_map(|r| r.outcome.as_ref().ok())
            .collect();
        let max_registers = ok.iter().map(|r| r.registers).max().unwrap_or(0);
        let max_shared = of_arch
            .iter()
            .map(|r| r.kernel.shared_bytes)
            .max()
            .unwrap_or(0);
        let spilled = ok
            .iter()
            .filter(|r| r.spill_stores + r.spill_loads > 0)
            .count();
        let ours = of_arch.iter().filter(|r| r.is_ours()).count();
        println!(
            "sm_{arch}: {} kernels ({ours} the scan's, {} Burn's and cubek's), {} errors, \
             {spilled} spilling, at most {max_registers} registers and {max_shared} B of shared \
             memory (limit {} B)",
            of_arch.len(),
            of_arch.len() - ours,
            of_arch.len() - ok.len(),
            offline::max_shared_per_block(arch),
        );
    }
    if let Some(path) = &args.markdown {
        let header = format!(
            "# CUDA kernels: registers, shared memory, spills, occupancy\n\n\
             Written by `examples/cuda_kernels` (NVRTC {}, ptxas of the same toolkit{}), without \
             a GPU: each kernel as the crate first launches it, compiled by cubecl-cuda's \
             compiler with the device properties of each target. Shared memory is CubeCL's \
             dynamic array (checked against the block's opt-in limit: {} B on sm_80, {} B on \
             sm_90); occupancy is theoretical (resident warps of 64); HMMA counts the \
             tensor-core instructions in the SASS of each kernel whose PTX has \
             matrix-multiply-accumulate instructions (`-`: none).\n",
            toolkit.nvrtc_version(),
            if toolkit.disassembles() {
                ", nvdisasm"
            } else {
                ""
            },
            offline::max_shared_per_block(80),
            offline::max_shared_per_block(90),
        );
        if let Err(e) = std::fs::write(path, report::markdown(&rows, &header)) {
            eprintln!("error: {}: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    if failures > 0 {
        println!("{failures} kernels failed the check");
        return ExitCode::FAILURE;
    }
    println!(
        "every kernel compiled: 0 errors, shared memory within the limits, no spill but ptxas's \
         trades for occupancy"
    );
    ExitCode::SUCCESS
}
