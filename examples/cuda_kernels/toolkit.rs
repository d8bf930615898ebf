//! NVIDIA's compilers without a GPU: NVRTC (through cudarc, as cubecl-cuda calls it, with its
//! options) turns each kernel's CUDA C++ into PTX, `ptxas -v` assembles the PTX for the
//! architecture and reports registers, spills and stack, and `nvdisasm` (where present) lists
//! the SASS, in which the tensor-core instructions are counted.
//!
//! The toolkit is the one cubecl-cuda finds: `CUDA_PATH` (its `include/`, and `include/cccl`
//! where it exists), libnvrtc on the loader's path, `ptxas` and `nvdisasm` in `CUDA_PATH/bin`.
//! PyPI's wheels are enough (`.ci/run`, `cuda_toolkit`).

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::report::target;

/// What `ptxas -v` and the SASS say of one kernel on one architecture.
#[derive(Clone, Debug, Default)]
pub struct Resources {
    pub registers: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    pub stack_bytes: u32,
    /// Shared memory ptxas counts (static arrays; CubeCL's is dynamic, `Compiled::shared_bytes`).
    pub static_shared_bytes: u32,
    pub barriers: u32,
    /// Tensor-core instructions in the SASS (`HMMA`, and Hopper's `HGMMA`), counted where the
    /// PTX has matrix-multiply-accumulate instructions and `nvdisasm` is present.
    pub tensor_core_instructions: Option<usize>,
    pub nvrtc_seconds: f64,
    pub ptxas_seconds: f64,
}

/// The compilers' paths.
#[derive(Clone, Debug)]
pub struct Toolkit {
    root: PathBuf,
    nvdisasm: Option<PathBuf>,
}

impl Toolkit {
    /// The toolkit at `CUDA_PATH` (cubecl-cuda's lookup), with its ptxas, and NVRTC loaded.
    pub fn find() -> Result<Self, String> {
        let root = cubecl_cuda::install::cuda_path()
            .ok_or("no CUDA toolkit: set CUDA_PATH (.ci/run's cuda_toolkit lays one out)")?;
        let ptxas = root.join("bin/ptxas");
        if !ptxas.is_file() {
            return Err(format!("no ptxas at {}", ptxas.display()));
        }
        let nvdisasm = Some(root.join("bin/nvdisasm")).filter(|p| p.is_file());
        // cudarc loads libnvrtc on first use and panics where it finds none: ask first
        // SAFETY: loading the library runs no code of ours
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err("libnvrtc not found: put the toolkit's lib64 on LD_LIBRARY_PATH".into());
        }
        Ok(Self { root, nvdisasm })
    }

    /// NVRTC's version, `major.minor`.
    pub fn nvrtc_version(&self) -> String {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two valid out-pointers; the library is present (`find`)
        let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
        match status.result() {
            Ok(()) => format!("{major}.{minor}"),
            Err(e) => format!("unknown ({e:?})"),
        }
    }

    /// Whether the SASS can be read (`nvdisasm`).
    pub fn disassembles(&self) -> bool {
        self.nvdisasm.is_some()
    }

    /// `source` through NVRTC for `arch`, with cubecl-cuda's options
    /// (`compute/context.rs::compile_kernel`): the PTX, or NVRTC's log.
    pub fn nvrtc(&self, source: &str, arch: u32) -> Result<String, String> {
        let target = format!("--gpu-architecture={}", target(arch));
        let include = cubecl_cuda::install::include_path();
        let cccl = cubecl_cuda::install::cccl_include_path();
        let mut options = vec![
            target,
            format!("--include-path={}", include.display()),
            "-lineinfo".to_string(),
        ];
        if cccl.exists() {
            options.push(format!("--include-path={}", cccl.display()));
        }
        let source = CString::new(source).map_err(|e| e.to_string())?;
        let program = cudarc::nvrtc::result::create_program(source.as_c_str(), None)
            .map_err(|e| format!("nvrtcCreateProgram: {e:?}"))?;
        // SAFETY: `program` was created above and is destroyed once, after its last use
        unsafe {
            let compiled = cudarc::nvrtc::result::compile_program(program, &options);
            let result = match compiled {
                Ok(()) => cudarc::nvrtc::result::get_ptx(program)
                    .map(|ptx| c_chars(&ptx))
                    .map_err(|e| format!("nvrtcGetPTX: {e:?}")),
                Err(e) => Err(match cudarc::nvrtc::result::get_program_log(program) {
                    Ok(log) => format!("{e:?}\n{}", c_chars(&log)),
                    Err(_) => format!("{e:?}"),
                }),
            };
            let _ = cudarc::nvrtc::result::destroy_program(program);
            result
        }
    }

    /// `ptx` assembled by `ptxas -v` for `arch` into `dir/stem.cubin` (beside `stem.ptx`), its
    /// figures read from ptxas's report and, where possible, from the SASS.
    pub fn assemble(
        &self,
        ptx: &str,
        arch: u32,
        dir: &Path,
        stem: &str,
    ) -> Result<Resources, String> {
        let sm = target(arch);
        let ptx_path = dir.join(format!("{stem}.ptx"));
        let cubin = dir.join(format!("{stem}.cubin"));
        std::fs::write(&ptx_path, ptx).map_err(|e| format!("{}: {e}", ptx_path.display()))?;
        let start = Instant::now();
        let out = Command::new(self.root.join("bin/ptxas"))
            .args(["-v", &format!("-arch={sm}")])
            .arg(&ptx_path)
            .arg("-o")
            .arg(&cubin)
            .output()
            .map_err(|e| format!("ptxas: {e}"))?;
        let report = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() {
            return Err(format!("ptxas failed ({}):\n{report}", out.status));
        }
        let mut resources = parse_ptxas(&report);
        resources.ptxas_seconds = start.elapsed().as_secs_f64();
        // only a kernel with matrix-multiply-accumulate calls can hold tensor-core instructions
        // (disassembling takes longer than compiling: about 0.4 s a kernel)
        let has_mma = ptx.contains("mma.sync") || ptx.contains("wmma.mma");
        if let Some(nvdisasm) = self.nvdisasm.as_ref().filter(|_| has_mma) {
            let out = Command::new(nvdisasm)
                .arg(&cubin)
                .output()
                .map_err(|e| format!("nvdisasm: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "nvdisasm failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            let sass = String::from_utf8_lossy(&out.stdout);
            resources.tensor_core_instructions = Some(
                sass.lines()
                    .filter(|l| l.contains(" HMMA.") || l.contains(" HGMMA."))
                    .count(),
            );
        }
        Ok(resources)
    }
}

fn c_chars(chars: &[std::ffi::c_char]) -> String {
    // SAFETY: NVRTC's log and PTX are NUL-terminated
    unsafe { CStr::from_ptr(chars.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// The figures of `ptxas -v`'s report of one entry point:
/// `Used 40 registers, used 1 barriers, 384 bytes cmem[0]`, `0 bytes stack frame, 0 bytes
/// spill stores, 0 bytes spill loads`, `... bytes smem`.
fn parse_ptxas(report: &str) -> Resources {
    let mut r = Resources::default();
    for line in report.lines() {
        let fields: Vec<&str> = line
            .split([':', ','])
            .map(str::trim)
            .filter(|f| !f.is_empty())
            .collect();
        for field in fields {
            let words: Vec<&str> = field.split_whitespace().collect();
            let number = |i: usize| words.get(i).and_then(|w| w.parse::<u32>().ok());
            match words.as_slice() {
                ["Used", _, "registers", ..] => r.registers = number(1).unwrap_or(0),
                ["used", _, "barriers", ..] => r.barriers = number(1).unwrap_or(0),
                [_, "bytes", "stack", "frame"] => r.stack_bytes = number(0).unwrap_or(0),
                [_, "bytes", "spill", "stores"] => r.spill_stores = number(0).unwrap_or(0),
                [_, "bytes", "spill", "loads"] => r.spill_loads = number(0).unwrap_or(0),
                [_, "bytes", "smem"] => r.static_shared_bytes = number(0).unwrap_or(0),
                _ => {}
            }
        }
    }
    r
}
