//! Speed of the model on the chosen backend: training steps, forward passes, recurrent decode
//! steps, and the chunked SSD against the sequential recurrence.
//!
//! ```text
//! cargo run --release --example bench -- --mode train,forward,step,ssd --d-model 256 --n-layer 4 \
//!     --d-state 64 --headdim 64 --ngroups 1 --chunk-size 64 --seq-len 256 --batch 8 --iters 5
//! ```
//!
//! Each mode warms up once, times `--iters` runs and prints one JSON line with `mode`, the
//! median seconds per run (`median_s`), the cold start (`first_run_s`, the warm-up run's
//! seconds, which hold its kernel compilations and autotuning; `first_done_s` and
//! `second_done_s`, the seconds from the process's start to the end of its first and second
//! run; on Wgpu and Cuda `kernels_compiled`, the kernels the process had compiled by the end of
//! the first and of the last run, with `--count-kernels`), the throughput (`tokens_per_s` for train and forward,
//! `us_per_token` for step: batch 1, one token with the state, after a 16-token prefill, on the
//! dedicated CPU path `recurrent::CpuBackbone`, with the tensor `step` beside it as
//! `tensor_step_us_per_token`; `decode`: greedy decoding with the tensor `step` at `--batch`,
//! the argmax on the device, `ms_per_token` and `tokens_per_s` of the batch), the
//! peak resident memory of the process so far (on Wgpu and Cuda also the most device memory in
//! use and reserved by CubeCL's pool, sampled after every run: `device_in_use_mb`,
//! `device_reserved_mb`), the thread count, and the configuration. `--dtype f16` / `bf16` runs
//! the model in half precision where the backend has it, `--dtype f64` in double precision.
//! `train` is forward + backward + AdamW step of the backbone on random inputs with loss
//! mean(y²); `ssd` times the chunked SSD and the sequential recurrence on the same inputs;
//! `ssd-train` one layer's chunked SSD alone, forward and backward (`--ssd` chooses the path);
//! both `ssd` modes also print the fused scan's cost model at the shape (`model_ms_h100`, its
//! estimate at an H100's data-sheet rates; `model_ms_h200_calibrated`, at the rates its
//! launches achieved on an H200) and the TFLOP/s and TB/s its FLOPs and bytes come to in the measured
//! time (`achieved_*`) beside those of the estimate (`model_*`).
//! Train and forward spread each batch over `--step-threads` threads (default: the available
//! cores on the cpu, 1 on a GPU), as the training steps of the models do under
//! `train::Threaded`.
//!
//! `--device wgpu` / `--device cuda` run the same modes on Burn's GPU backends (built with the
//! cargo features of those names); `--preset 130m` (or `370m`, `780m`, `1.3b`, `2.7b`) is the
//! shape of that published model with its
//! vocabulary (train and forward then run the language model on random token ids):
//!
//! ```text
//! cargo run --release --features cuda --example bench -- --device cuda --preset 130m --mode train,forward
//! ```
//!
//! `--hybrid granite-4.0-h-350m` (another preset, or a `config.json`) runs train, forward and
//! decode on that hybrid model instead (`hybrid.rs`; the PyTorch side is
//! `scripts/torch_hybrid_bench.py`). `--model mamba2,mamba3 --vocab 256` runs train, forward and
//! decode on the Mamba-2 language model, then on `mamba_ssm`'s Mamba-3 one of the same sizes,
//! side by side in one process.

use std::sync::{Mutex, OnceLock};
use std::time::Instant;

#[path = "../common/mod.rs"]
mod common;
mod hybrid;

use burn::backend::{Autodiff, NdArray};
use burn::module::AutodiffModule;
use burn::optim::{AdamWConfig, Optimizer};
use burn::tensor::backend::Backend;
use burn::tensor::{BasicOps, Distribution, FloatDType, Int, Tensor, TensorData, TensorKind};
use clap::Parser;
use mamba2_burn::hybrid::HybridLm;
use mamba2_burn::recurrent::CpuBackbone;
use mamba2_burn::ssd::{ssd_chunked, ssd_sequential, SsdInput};
use mamba2_burn::train::{parallel_backward, parallel_map, split_rows, BatchPart};
use mamba2_burn::{
    LoraConfig, Mamba2Backbone, Mamba2BackboneConfig, Mamba2Config, Mamba2Lm, Mamba2LmConfig,
};
use mamba2_burn::{SsdAutodiffBackend, SsdBackend};
use serde_json::json;

#[derive(Parser, Debug, Clone)]
#[command(about = "Benchmark Mamba-2 training, forward, decode steps and the SSD")]
struct Args {
    /// Modes to run, comma separated: train, forward, step, decode (greedy decoding with the
    /// tensor step at `--batch`), ssd, ssd-train (one layer's SSD
    /// alone, forward and backward, on the `--ssd` path), ssd-cost (the fused GPU
    /// scan's cost model at this shape, `mamba2_burn::ssd::cost`: no device, nothing timed),
    /// hybrid-params (each hybrid preset's parameter count and the published one: no device).
    #[arg(long, default_value = "train,forward,step,ssd", value_delimiter = ',')]
    mode: Vec<String>,
    /// Backend: cpu (NdArray), wgpu (with `--features wgpu`), cuda (with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// The chunked SSD's implementation: `fused` (the backend's fused kernels wherever it has
    /// them: NdArray, Wgpu, Cuda; `FusedKernels::Always`), `tensor-ops` (the tensor operations
    /// on every backend, `FusedKernels::Never`) or `measured` (the library's default,
    /// `FusedKernels::Measured`: fused where measured at least as fast). Comma separated, the
    /// modes run for each in turn, in one process.
    #[arg(long, default_value = "fused", value_delimiter = ',')]
    ssd: Vec<String>,
    /// How the fused kernels of Wgpu and Cuda compute the scan's intra-chunk products:
    /// `tiled` (inside the kernels, no per-head `q × q` matrix in memory), `transient` (each
    /// head's matrices written for the call and multiplied by the matmul) or `tensor-cores`
    /// (inside the kernels, each tile's product on tensor cores where the device has them);
    /// `mamba2_burn::ScanProducts`. Comma separated, the modes run for each in turn (inside
    /// each `--ssd` path), in one process.
    #[arg(long, default_value = "tiled", value_delimiter = ',')]
    scan_products: Vec<String>,
    /// Float type of the weights and activations: f32, f16, bf16 or f64 (where the backend
    /// supports it: Cuda f16 and bf16, Wgpu f16 where the adapter has it, NdArray f64). With
    /// half precision the SSD's `dt`, decays and states are computed in f32.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Train mode: mixed precision, `bf16` or `f16`: the weights and AdamW's state in f32
    /// (`--dtype f32`), each step's forward and backward on copies of the weights in this type
    /// (`train::MixedPrecision`, the GPU recipe of `train_lm`).
    #[arg(long)]
    mixed_precision: Option<String>,
    /// A named shape that replaces the size flags: a published model's
    /// (`Mamba2LmConfig::published`: `130m`, `370m`, `780m`, `1.3b`, `2.7b`; 130m is d_model
    /// 768, 24 layers, d_state 128, headdim 64, expand 2, chunk 256, vocabulary 50,277), with
    /// sequence 2,048 and batch 1 unless `--seq-len` and `--batch` say otherwise.
    #[arg(long)]
    preset: Option<String>,
    /// A hybrid language model instead of Mamba-2: a preset (`granite-4.0-h-350m`,
    /// `bamba-9b`, ...: `--mode hybrid-params` lists them) or a `config.json`; train (loss: the mean square of
    /// the logits), forward (the prompt's logits and cache) and decode (after a `--seq-len`
    /// prompt) run it with random weights on random ids of its vocabulary.
    #[arg(long)]
    hybrid: Option<String>,
    /// The layer of the model: `mamba2`, or `mamba3` (`mamba_ssm`'s language model of Mamba-3
    /// layers of the same sizes, `--vocab` or `--preset` giving its vocabulary; train, forward
    /// and decode). Comma separated, the modes run for each in turn, in one process (after the
    /// batches), side by side.
    #[arg(long, default_value = "mamba2", value_delimiter = ',')]
    model: Vec<String>,
    /// Train mode of a language model (`--preset`, `--vocab`, `--hybrid`): fine-tune with
    /// low-rank adapters of this rank (`with_lora`, the default targets) in place of the
    /// weights, which stay frozen (side by side with `scripts/torch_finetune_bench.py
    /// --lora-rank`).
    #[arg(long)]
    lora_rank: Option<usize>,
    /// With a vocabulary, train and forward run the language model (embedding, backbone, LM
    /// head; train's loss is the mean square of the logits) on random token ids; 0: the
    /// backbone alone on random inputs (the default without a preset).
    #[arg(long)]
    vocab: Option<usize>,
    #[arg(long, default_value_t = 256)]
    d_model: usize,
    #[arg(long, default_value_t = 4)]
    n_layer: usize,
    #[arg(long, default_value_t = 64)]
    d_state: usize,
    #[arg(long, default_value_t = 64)]
    headdim: usize,
    #[arg(long, default_value_t = 1)]
    ngroups: usize,
    #[arg(long, default_value_t = 64)]
    chunk_size: usize,
    /// Tokens per sequence. Default: 256, 2,048 with `--preset`.
    #[arg(long = "seq-len")]
    seq_len_flag: Option<usize>,
    /// `--seq-len` or its default.
    #[arg(skip)]
    seq_len: usize,
    /// Rows per batch. Default: 8, 1 with `--preset`. Comma separated, the modes run for each
    /// in turn (after the `--ssd` paths), in one process.
    #[arg(long, value_delimiter = ',')]
    batch: Vec<usize>,
    /// Timed runs per mode (after one warm-up run).
    #[arg(long, default_value_t = 5)]
    iters: usize,
    /// Threads that train and forward spread each batch over (slices of the batch on
    /// parallel threads, `mamba2_burn::train::parallel_backward` / `parallel_map`).
    /// Default: the available cores.
    #[arg(long)]
    step_threads: Option<usize>,
    /// On Wgpu and Cuda, count the kernels the process compiles (CubeCL's compilation log, in
    /// a temporary file): `kernels_compiled` on each line.
    #[arg(long)]
    count_kernels: bool,
    /// Threads of each OpenBLAS matrix product (with `--features blas`). Default: 1 when
    /// batches are spread over more than one step thread, else the available cores.
    #[cfg(feature = "blas")]
    #[arg(long)]
    blas_threads: Option<usize>,
}

impl Args {
    /// `--step-threads`, else the available cores on the cpu and 1 on a GPU.
    fn step_threads(&self) -> usize {
        common::step_threads(self.step_threads, &self.device)
    }

    /// Applies `--preset`.
    fn with_preset(mut self) -> Result<Self, String> {
        let Some(name) = self.preset.as_deref() else {
            self.seq_len = self.seq_len_flag.unwrap_or(256);
            return Ok(self);
        };
        let Some(config) = Mamba2LmConfig::published(&format!("mamba2-{name}")) else {
            let known: Vec<&str> = Mamba2LmConfig::published_names()
                .map(|n| n.trim_start_matches("mamba2-"))
                .collect();
            return Err(format!("unknown --preset {name:?} ({})", known.join(", ")));
        };
        let m = &config.backbone.mixer;
        (self.d_model, self.n_layer, self.d_state, self.headdim) =
            (m.d_model, config.backbone.n_layer, m.d_state, m.headdim);
        (self.ngroups, self.chunk_size) = (m.ngroups, m.chunk_size);
        self.vocab = self.vocab.or(Some(config.vocab_size));
        self.seq_len = self.seq_len_flag.unwrap_or(2048);
        if self.batch.is_empty() {
            self.batch = vec![1];
        }
        Ok(self)
    }

    /// This run's `--scan-products` (one per run: `run` splits a list).
    fn scan_products(&self) -> mamba2_burn::ScanProducts {
        products_mode(&self.scan_products[0]).expect("checked in main")
    }

    /// The path of this run's `--ssd` (one per run: `run` splits a list).
    fn fused_kernels(&self) -> mamba2_burn::FusedKernels {
        fused_mode(&self.ssd[0]).expect("checked in main")
    }

    fn batch(&self) -> usize {
        self.batch.first().copied().unwrap_or(8)
    }

    fn vocab(&self) -> usize {
        self.vocab.unwrap_or(0)
    }

    /// This run's `--model` (one per run: `run` splits a list).
    fn model(&self) -> &str {
        &self.model[0]
    }
}

fn median(mut times: Vec<f64>) -> f64 {
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    times[times.len() / 2]
}

/// Warm-up once, then the median of `iters` timed runs.
fn timed(iters: usize, f: impl FnMut()) -> f64 {
    timed_sampled(iters, f, || {})
}

/// The process's start (`main`'s first line), for the cold-start figures.
static START: OnceLock<Instant> = OnceLock::new();

/// The cold start of the last timed mode: the first run's seconds, the seconds from the
/// process's start to the end of its first and second run, and the kernels compiled by the
/// end of the first and of the last run (with `--count-kernels`).
#[derive(Clone, Copy, Default)]
struct ColdStart {
    first_run_s: f64,
    first_done_s: f64,
    second_done_s: f64,
    kernels_first: Option<usize>,
    kernels_last: Option<usize>,
}

static COLD: Mutex<Option<ColdStart>> = Mutex::new(None);

fn since_start() -> f64 {
    START.get_or_init(Instant::now).elapsed().as_secs_f64()
}

/// [`timed`], calling `after` (untimed) after every run; records the cold start ([`COLD`]).
fn timed_sampled(iters: usize, mut f: impl FnMut(), after: impl Fn()) -> f64 {
    let t = Instant::now();
    f();
    let first_run_s = t.elapsed().as_secs_f64();
    let first_done_s = since_start();
    let kernels_first = kernel_count();
    after();
    let times: Vec<f64> = (0..iters.max(1))
        .map(|_| {
            let t = Instant::now();
            f();
            let elapsed = t.elapsed().as_secs_f64();
            after();
            elapsed
        })
        .collect();
    let second_done_s = first_done_s + times[0];
    *COLD.lock().unwrap() = Some(ColdStart {
        first_run_s,
        first_done_s,
        second_done_s,
        kernels_first,
        kernels_last: kernel_count(),
    });
    median(times)
}

/// CubeCL's compilation log of this process (`--count-kernels`).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
static KERNEL_LOG: OnceLock<std::path::PathBuf> = OnceLock::new();

/// The kernels compiled so far, from CubeCL's compilation log (`--count-kernels`).
fn kernel_count() -> Option<usize> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        let path = KERNEL_LOG.get()?;
        Some(mamba2_burn::cubecl_setup::kernels_compiled(path))
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    None
}

/// Gives CubeCL the crate's settings before the first device client starts (the caches; with
/// `--count-kernels` the compilation log): what the library does when the first model is
/// built, done here first since the bench makes tensors before models.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn setup_cubecl(args: &Args) -> serde_json::Value {
    use mamba2_burn::cubecl_setup::{Applied, CubeclSetup};
    let mut setup = CubeclSetup::from_env();
    if args.count_kernels {
        let log =
            std::env::temp_dir().join(format!("mamba2-bench-kernels-{}.log", std::process::id()));
        let _ = std::fs::remove_file(&log);
        let _ = KERNEL_LOG.set(log.clone());
        setup = setup.with_kernel_log(Some(log));
    }
    match setup.apply() {
        Applied::Set(s) => json!({ "cubecl_cache": s.cache_dir }),
        Applied::UserFile(file) => json!({ "cubecl_config_file": file }),
        Applied::AlreadyConfigured => json!({ "cubecl_config": "already set" }),
    }
}

fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn config(args: &Args) -> Mamba2BackboneConfig {
    let mixer = Mamba2Config::new(args.d_model)
        .with_d_state(args.d_state)
        .with_headdim(args.headdim)
        .with_ngroups(args.ngroups)
        .with_chunk_size(args.chunk_size)
        .with_fused_kernels(Some(args.fused_kernels()));
    Mamba2BackboneConfig::new(args.n_layer, mixer)
}

fn backend_name(args: &Args) -> String {
    match args.device.as_str() {
        #[cfg(feature = "blas")]
        "cpu" => format!(
            "ndarray-{}+openblas({} threads)",
            args.dtype,
            mamba2_burn::train::blas_threads()
        ),
        #[cfg(not(feature = "blas"))]
        "cpu" => format!("ndarray-{}", args.dtype),
        other => format!("{other}-{}", args.dtype),
    }
}

/// Reads CubeCL's memory usage: `(in use, reserved)` bytes, `None` when unavailable.
type MemoryProbe = Box<dyn Fn() -> Option<(u64, u64)>>;

/// The device memory of CubeCL's pool, sampled after every timed run: the most in use and the
/// most reserved (the pool's size, which holds the step's transient peak).
#[derive(Default)]
struct DeviceMemory {
    probe: Option<MemoryProbe>,
    peak: std::cell::Cell<(u64, u64)>,
}

impl DeviceMemory {
    fn sample(&self) {
        if let Some((in_use, reserved)) = self.probe.as_ref().and_then(|probe| probe()) {
            let (a, b) = self.peak.get();
            self.peak.set((a.max(in_use), b.max(reserved)));
        }
    }

    /// The peaks since the last call, in MiB, then starts over.
    fn take(&self) -> serde_json::Value {
        let (in_use, reserved) = self.peak.replace((0, 0));
        match self.probe {
            Some(_) => json!({
                "device_in_use_mb": in_use as f64 / 1048576.0,
                "device_reserved_mb": reserved as f64 / 1048576.0,
            }),
            None => json!({}),
        }
    }
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn cubecl_memory<R: cubecl::Runtime>(device: R::Device) -> DeviceMemory {
    DeviceMemory {
        probe: Some(Box::new(move || {
            let usage = R::client(&device).memory_usage().ok()?;
            Some((usage.bytes_in_use, usage.bytes_reserved))
        })),
        ..Default::default()
    }
}

fn report(args: &Args, mode: &str, median_s: f64, extra: serde_json::Value) {
    let cold = COLD.lock().unwrap().take().unwrap_or_default();
    let mut line = json!({
        "mode": mode,
        "median_s": median_s,
        "first_run_s": cold.first_run_s,
        "first_done_s": cold.first_done_s,
        "second_done_s": cold.second_done_s,
        "iters": args.iters,
        "threads": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "step_threads": args.step_threads(),
        "peak_rss_mb": peak_rss_mb(),
        "backend": backend_name(args),
        "ssd": args.ssd.first(),
        "scan_products": args.scan_products.first(),
        "mixed_precision": args.mixed_precision,
        "lora_rank": args.lora_rank,
        "config": {
            "d_model": args.d_model, "n_layer": args.n_layer, "d_state": args.d_state,
            "headdim": args.headdim, "ngroups": args.ngroups, "chunk_size": args.chunk_size,
            "seq_len": args.seq_len, "batch": args.batch(), "vocab": args.vocab(),
        },
    });
    if args.hybrid.is_some() {
        // the Mamba-2 size flags do not apply: the hybrid's sizes are its config's
        line["config"] =
            json!({ "seq_len": args.seq_len, "batch": args.batch(), "vocab": args.vocab() });
    }
    if let (Some(first), Some(last)) = (cold.kernels_first, cold.kernels_last) {
        merge(
            &mut line,
            json!({ "kernels_compiled": { "first_run": first, "last_run": last } }),
        );
    }
    merge(&mut line, hybrid::describe(args));
    merge(&mut line, extra);
    println!("{line}");
}

/// `--mode ssd-cost`: one JSON line per launch of one layer's fused scan (forward, then
/// gradient) with its estimated time on an H100, then a summary line whose
/// `ssd_train_ms_h100` is the scan's estimated time in one training step of `n_layer` layers.
fn ssd_cost(args: &Args) {
    use mamba2_burn::ssd::cost::{backward_launches, forward_launches, totals, Rates};
    let shape = match scan_shape(args) {
        Ok(shape) => shape,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let rates = Rates::h100(shape.element_bytes);
    let calibrated = Rates::h200_calibrated(shape.element_bytes);
    let (forward, backward) = (forward_launches(shape), backward_launches(shape));
    for launch in forward.iter().chain(&backward) {
        let mut line = serde_json::to_value(launch).expect("a launch serialises");
        merge(
            &mut line,
            json!({
                "mode": "ssd-cost",
                "scan_products": args.scan_products.first(),
                "us_h100": launch.seconds(&rates) * 1e6,
                "us_h200_calibrated": launch.seconds(&calibrated) * 1e6,
            }),
        );
        println!("{line}");
    }
    let (f, b) = (totals(&forward, &rates), totals(&backward, &rates));
    println!(
        "{}",
        json!({
            "mode": "ssd-cost", "summary": true, "shape": shape, "rates": rates,
            "forward": f, "backward": b,
            "forward_launches": f.launches, "backward_launches": b.launches,
            "ssd_forward_ms_h100": f.seconds * 1e3 * args.n_layer as f64,
            "ssd_train_ms_h100": (f.seconds + b.seconds) * 1e3 * args.n_layer as f64,
            "ssd_train_ms_h200_calibrated": (totals(&forward, &calibrated).seconds
                + totals(&backward, &calibrated).seconds)
                * 1e3
                * args.n_layer as f64,
            "n_layer": args.n_layer,
        })
    );
}

/// One layer's scan at the bench's shape and `--dtype`, as the cost model takes it.
fn scan_shape(args: &Args) -> Result<mamba2_burn::ssd::cost::ScanShape, String> {
    let mixer = config(args).mixer;
    let mut shape = mamba2_burn::ssd::cost::ScanShape::new(
        args.batch(),
        args.seq_len,
        mixer.nheads(),
        args.ngroups,
        args.headdim,
        args.d_state,
        args.chunk_size,
    );
    shape.products = args.scan_products();
    // the products' operands and the layouts in the model's type, the rest in f32
    shape.element_bytes = match float_dtype(args)? {
        None => 4,
        Some(FloatDType::F64) => 8,
        Some(_) => 2,
    };
    Ok(shape)
}

/// For `--mode ssd` (`with_backward` false) and `ssd-train`, measured in `seconds` on either
/// path: the fused scan's modelled work at this shape (`mamba2_burn::ssd::cost`: FLOPs on and
/// off tensor cores, bytes, the estimated time on an H100) and the rates it implies, achieved
/// (`achieved_tflop_per_s`, `achieved_tb_per_s`: the modelled FLOPs and bytes over the measured
/// time) beside the model's own (`model_tflop_per_s`, `model_tb_per_s`: over its estimate).
fn ssd_rates(args: &Args, with_backward: bool, seconds: f64) -> serde_json::Value {
    use mamba2_burn::ssd::cost::{backward_launches, forward_launches, totals, Rates};
    let Ok(shape) = scan_shape(args) else {
        return json!({});
    };
    let rates = Rates::h100(shape.element_bytes);
    let mut launches = forward_launches(shape);
    if with_backward {
        launches.extend(backward_launches(shape));
    }
    let t = totals(&launches, &rates);
    let flops = t.product_flops + t.other_flops;
    let calibrated = totals(&launches, &Rates::h200_calibrated(shape.element_bytes));
    json!({
        "model": t,
        "model_ms_h100": t.seconds * 1e3,
        "model_ms_h200_calibrated": calibrated.seconds * 1e3,
        "model_tflop_per_s": flops / t.seconds / 1e12,
        "model_tb_per_s": t.bytes / t.seconds / 1e12,
        "achieved_tflop_per_s": flops / seconds / 1e12,
        "achieved_tb_per_s": t.bytes / seconds / 1e12,
        "model_over_measured": t.seconds / seconds,
    })
}

fn merge(into: &mut serde_json::Value, more: serde_json::Value) {
    if let (Some(obj), Some(more)) = (into.as_object_mut(), more.as_object()) {
        obj.extend(more.clone());
    }
}

/// Random token ids in `[0, vocab)` (a fixed sequence), `[batch, seq_len]`.
fn random_ids<B: SsdBackend>(args: &Args, device: &B::Device) -> Tensor<B, 2, Int> {
    let n = args.batch() * args.seq_len;
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let ids: Vec<i64> = (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            ((state >> 33) % args.vocab() as u64) as i64
        })
        .collect();
    Tensor::from_data(TensorData::new(ids, [args.batch(), args.seq_len]), device)
}

fn random_inputs<B: SsdBackend>(args: &Args, device: &B::Device) -> Tensor<B, 3> {
    let shape = [args.batch(), args.seq_len, args.d_model];
    Tensor::random(shape, Distribution::Normal(0.0, 1.0), device)
}

/// Forward + backward + AdamW step of the LM (`--vocab`) or of the backbone, loss mean(out²).
fn bench_train<B: SsdAutodiffBackend>(
    args: &Args,
    device: &B::Device,
    memory: &DeviceMemory,
) -> Result<f64, mamba2_burn::Mamba2Error> {
    let lora = args.lora_rank.map(LoraConfig::new);
    if let Some(config) = hybrid::config(args)? {
        let loss = |m: &HybridLm<B>, ids| m.forward(ids, None).map(|(y, _)| y.square().mean());
        let ids = random_ids(args, device);
        let mut model = config.init(device)?;
        if let Some(lora) = &lora {
            model = model.with_lora(lora)?;
        }
        return train_loop(args, device, memory, model, ids, loss);
    }
    if args.vocab() > 0 {
        let mut model: Mamba2Lm<B> =
            Mamba2LmConfig::new(config(args), args.vocab()).init(device)?;
        if let Some(lora) = &lora {
            model = model.with_lora(lora)?;
        }
        let loss = |m: &Mamba2Lm<B>, ids| m.forward(ids, None).map(|(y, _)| y.square().mean());
        train_loop(args, device, memory, model, random_ids(args, device), loss)
    } else {
        let model: Mamba2Backbone<B> = config(args).init(device)?;
        let loss = |m: &Mamba2Backbone<B>, x| m.forward(x, None).map(|(y, _)| y.square().mean());
        train_loop(
            args,
            device,
            memory,
            model,
            random_inputs(args, device),
            loss,
        )
    }
}

/// Times training steps of `model` on `input`, each batch spread over `--step-threads` slices.
fn train_loop<B, M, const D: usize, K>(
    args: &Args,
    device: &B::Device,
    memory: &DeviceMemory,
    mut model: M,
    input: Tensor<B, D, K>,
    loss: impl Fn(&M, Tensor<B, D, K>) -> mamba2_burn::Result<Tensor<B, 1>> + Sync,
) -> mamba2_burn::Result<f64>
where
    B: SsdAutodiffBackend,
    M: AutodiffModule<B> + Send,
    K: TensorKind<B> + BasicOps<B> + Send,
    Tensor<B, D, K>: Send,
{
    loss(&model, input.clone())?; // shapes checked once
    let mut optim = AdamWConfig::new().init::<B, M>();
    let mixed = mixed_precision(args).expect("checked in main");
    let step = || {
        let parts = split_rows(args.batch(), args.step_threads())
            .into_iter()
            .map(|(start, len)| BatchPart {
                input: input.clone().narrow(0, start, len),
                weight: len as f64 / args.batch() as f64,
            })
            .collect();
        let (grads, _, _) = parallel_backward(&model, parts, |m, x| {
            let loss = match mixed {
                Some(mixed) => loss(&mixed.compute_copy(m), x),
                None => loss(m, x),
            };
            (loss.expect("checked above"), ())
        });
        model = optim.step(1e-4, model.clone(), grads);
        let _ = B::sync(device);
    };
    Ok(timed_sampled(args.iters, step, || memory.sample()))
}

/// Forward of the LM (`--vocab`) or of the backbone, the output read back.
fn bench_forward<B: SsdBackend>(
    args: &Args,
    device: &B::Device,
    memory: &DeviceMemory,
) -> Result<f64, mamba2_burn::Mamba2Error> {
    if let Some(config) = hybrid::config(args)? {
        let out = |m: &HybridLm<B>, ids| m.forward(ids, None).map(|(y, _)| y);
        let ids = random_ids(args, device);
        return forward_loop(args, memory, config.init(device)?, ids, out);
    }
    if args.vocab() > 0 {
        let model: Mamba2Lm<B> = Mamba2LmConfig::new(config(args), args.vocab()).init(device)?;
        let out = |m: &Mamba2Lm<B>, ids| m.forward(ids, None).map(|(y, _)| y);
        forward_loop(args, memory, model, random_ids(args, device), out)
    } else {
        let model: Mamba2Backbone<B> = config(args).init(device)?;
        let out = |m: &Mamba2Backbone<B>, x| m.forward(x, None).map(|(y, _)| y);
        forward_loop(args, memory, model, random_inputs(args, device), out)
    }
}

fn forward_loop<B, M, const D: usize, K>(
    args: &Args,
    memory: &DeviceMemory,
    model: M,
    input: Tensor<B, D, K>,
    out: impl Fn(&M, Tensor<B, D, K>) -> mamba2_burn::Result<Tensor<B, 3>> + Sync,
) -> mamba2_burn::Result<f64>
where
    B: SsdBackend,
    M: Clone + Send,
    K: TensorKind<B> + BasicOps<B> + Send,
    Tensor<B, D, K>: Send,
{
    out(&model, input.clone())?;
    let run = || {
        let slices = split_rows(args.batch(), args.step_threads())
            .into_iter()
            .map(|(start, len)| (model.clone(), input.clone().narrow(0, start, len)))
            .collect();
        parallel_map(slices, |(m, x)| {
            let _ = out(&m, x).expect("checked above").into_data();
        });
    };
    Ok(timed_sampled(args.iters, run, || memory.sample()))
}

/// Seconds per token of the tensor `step` and of the dedicated CPU step (`recurrent::CpuBackbone`),
/// both batch 1 after the same 16-token chunked prefill.
fn bench_step<B: SsdBackend>(
    args: &Args,
    device: &B::Device,
) -> Result<(f64, f64), mamba2_burn::Mamba2Error> {
    let model: Mamba2Backbone<B> = config(args).init(device)?;
    let prefill = Tensor::<B, 3>::random(
        [1, 16, args.d_model],
        Distribution::Normal(0.0, 1.0),
        device,
    );
    let (_, state) = model.forward(prefill, None)?;
    let x = Tensor::<B, 2>::random([1, args.d_model], Distribution::Normal(0.0, 1.0), device);
    let tokens = 64;

    let cpu = CpuBackbone::from_backbone(&model);
    let mut cpu_state = cpu.state_from(&model, &state, 0)?;
    let x_host: Vec<f32> = x
        .clone()
        .into_data()
        .convert::<f32>()
        .to_vec()
        .expect("f32");
    let mut y_host = vec![0.0f32; args.d_model];
    let cpu_tokens = 1024;
    let cpu_run = timed(args.iters, || {
        for _ in 0..cpu_tokens {
            cpu.step(&x_host, &mut cpu_state, &mut y_host)
                .expect("checked shapes");
        }
    });

    let mut state = Some(state);
    let per_run = timed(args.iters, || {
        let mut s = state.take().expect("state");
        for _ in 0..tokens {
            let (y, next) = model.step(x.clone(), s).expect("checked shapes");
            s = next;
            let _ = y.into_data();
        }
        state = Some(s);
    });
    Ok((per_run / tokens as f64, cpu_run / cpu_tokens as f64))
}

/// `--mode decode`: greedy decoding with the tensor `step` at `--batch`, each token's ids the
/// argmax of the last logits (on the device; the ids read back once per run), after a 16-token
/// chunked prefill (a hybrid: a `--seq-len` prompt): seconds per decoded token of the whole
/// batch. The language model with a vocabulary, else the backbone on random inputs.
fn bench_decode<B: SsdBackend>(
    args: &Args,
    device: &B::Device,
) -> Result<f64, mamba2_burn::Mamba2Error> {
    let (b, tokens) = (args.batch(), 32);
    if let Some(config) = hybrid::config(args)? {
        let model = config.init::<B>(device)?;
        return decode_loop(
            args,
            random_ids(args, device),
            |ids| model.forward(ids, None),
            |ids, cache| model.step(ids, cache),
        );
    }
    if args.vocab() > 0 {
        let model: Mamba2Lm<B> = Mamba2LmConfig::new(config(args), args.vocab()).init(device)?;
        let prompt = random_ids(
            &Args {
                seq_len: 16,
                ..args.clone()
            },
            device,
        );
        decode_loop(
            args,
            prompt,
            |ids| model.forward(ids, None),
            |ids, state| model.step(ids, state),
        )
    } else {
        let model: Mamba2Backbone<B> = config(args).init(device)?;
        let normal = Distribution::Normal(0.0, 1.0);
        let prefill = Tensor::<B, 3>::random([b, 16, args.d_model], normal, device);
        let (_, state) = model.forward(prefill, None)?;
        let x = Tensor::<B, 2>::random([b, args.d_model], normal, device);
        let mut carried = Some(state);
        Ok(timed(args.iters, || {
            let mut state = carried.take().expect("carried");
            let mut y = x.clone();
            for _ in 0..tokens {
                let (out, next) = model.step(y, state).expect("checked shapes");
                (y, state) = (out, next);
            }
            let _ = y.into_data();
            carried = Some(state);
        }) / tokens as f64)
    }
}

/// Greedy decoding of `--batch` rows after `prompt` (`forward` then `step` per token, each
/// token's ids the argmax of the last logits on the device, the ids read back once per run):
/// seconds per decoded token of the whole batch.
fn decode_loop<B: SsdBackend, S>(
    args: &Args,
    prompt: Tensor<B, 2, Int>,
    forward: impl Fn(Tensor<B, 2, Int>) -> mamba2_burn::Result<(Tensor<B, 3>, S)>,
    step: impl Fn(Tensor<B, 1, Int>, S) -> mamba2_burn::Result<(Tensor<B, 2>, S)>,
) -> mamba2_burn::Result<f64> {
    let (b, tokens) = (args.batch(), 32);
    let (logits, state) = forward(prompt)?;
    let [_, l, v] = logits.dims();
    let first = logits
        .narrow(1, l - 1, 1)
        .reshape([b, v])
        .argmax(1)
        .reshape([b]);
    let mut carried = Some((first, state));
    Ok(timed(args.iters, || {
        let (mut ids, mut state) = carried.take().expect("carried");
        for _ in 0..tokens {
            let (logits, next) = step(ids, state).expect("checked shapes");
            ids = logits.argmax(1).reshape([b]);
            state = next;
        }
        let _ = ids.clone().into_data();
        carried = Some((ids, state));
    }) / tokens as f64)
}

/// One layer's SSD inputs at the bench's shape (`x`, `B`, `C` normal, `dt` in 0.001 … 0.1,
/// `A` in −16 … −1), on `device`.
fn ssd_input<B: Backend>(args: &Args, device: &B::Device) -> SsdInput<B> {
    let h = args.d_model * 2 / args.headdim;
    let (b, l, p, n, g) = (
        args.batch(),
        args.seq_len,
        args.headdim,
        args.d_state,
        args.ngroups,
    );
    let normal = Distribution::Normal(0.0, 1.0);
    let x = Tensor::<B, 4>::random([b, l, h, p], normal, device);
    let dt = Tensor::<B, 3>::random([b, l, h], Distribution::Uniform(0.001, 0.1), device);
    let a = Tensor::<B, 1>::random([h], Distribution::Uniform(-16.0, -1.0), device);
    let bm = Tensor::<B, 4>::random([b, l, g, n], normal, device);
    let cm = Tensor::<B, 4>::random([b, l, g, n], normal, device);
    SsdInput::new(x, dt, a, bm, cm, args.chunk_size)
        .fused_kernels(args.fused_kernels())
        .scan_products(args.scan_products())
}

fn bench_ssd<B: SsdBackend>(args: &Args, device: &B::Device) -> (f64, f64) {
    let input = ssd_input::<B>(args, device);
    let chunked = timed(args.iters, || {
        let (y, s) = ssd_chunked(input.clone());
        let _ = (y.into_data(), s.into_data());
    });
    let sequential = timed(args.iters.min(3), || {
        let (y, s) = ssd_sequential(input.clone());
        let _ = (y.into_data(), s.into_data());
    });
    (chunked, sequential)
}

/// `--mode ssd-train`: one layer's chunked SSD alone, forward and backward of the loss
/// `mean(y²) + mean(S²)` (the gradients of every input read back), on the `--ssd` path.
fn bench_ssd_train<B: SsdAutodiffBackend>(
    args: &Args,
    device: &B::Device,
    memory: &DeviceMemory,
) -> f64 {
    let base = ssd_input::<B>(args, device);
    let run = || {
        let input = SsdInput::new(
            base.x.clone().require_grad(),
            base.dt.clone().require_grad(),
            base.a.clone().require_grad(),
            base.b.clone().require_grad(),
            base.c.clone().require_grad(),
            base.chunk_size,
        )
        .fused_kernels(base.kernels)
        .scan_products(base.products);
        let leaves = [&input.x, &input.b, &input.c].map(|t| t.clone());
        let (dt, a) = (input.dt.clone(), input.a.clone());
        let (y, s) = ssd_chunked(input);
        // the state is f32 whatever the model's type: its term in y's type
        let state_term = s.powi_scalar(2).mean().cast(y.dtype());
        let grads = (y.powi_scalar(2).mean() + state_term).backward();
        for t in leaves {
            let _ = t.grad(&grads).map(|g| g.into_data());
        }
        let _ = dt.grad(&grads).map(|g| g.into_data());
        let _ = a.grad(&grads).map(|g| g.into_data());
    };
    timed_sampled(args.iters, run, || memory.sample())
}

/// `--mixed-precision`: its half type, if any.
fn mixed_precision(args: &Args) -> Result<Option<mamba2_burn::train::MixedPrecision>, String> {
    use mamba2_burn::train::MixedPrecision;
    match args.mixed_precision.as_deref() {
        None => Ok(None),
        Some("bf16") => Ok(Some(MixedPrecision::Bf16)),
        Some("f16") => Ok(Some(MixedPrecision::F16)),
        Some(other) => Err(format!("unknown --mixed-precision {other:?} (bf16, f16)")),
    }
}

/// `--dtype`: `None` for `f32`, the other type otherwise.
fn float_dtype(args: &Args) -> Result<Option<FloatDType>, String> {
    match args.dtype.as_str() {
        "f32" => Ok(None),
        "f16" => Ok(Some(FloatDType::F16)),
        "bf16" => Ok(Some(FloatDType::BF16)),
        "f64" => Ok(Some(FloatDType::F64)),
        other => Err(format!("unknown --dtype {other:?} (f32, f16, bf16, f64)")),
    }
}

/// `--dtype` as the float type of `device` (before any tensor is made on it).
fn set_dtype<B: SsdBackend>(args: &Args, device: &B::Device) -> Result<(), String> {
    let Some(dtype) = float_dtype(args)? else {
        return Ok(());
    };
    let int = <B::IntElem as burn::tensor::Element>::dtype();
    burn::tensor::set_default_dtypes::<B>(device, dtype, int)
        .map_err(|e| format!("--dtype {} on --device {}: {e}", args.dtype, args.device))
}

/// `--ssd`'s path as the library's setting.
fn fused_mode(ssd: &str) -> Option<mamba2_burn::FusedKernels> {
    use mamba2_burn::FusedKernels;
    match ssd {
        "fused" => Some(FusedKernels::Always),
        "tensor-ops" => Some(FusedKernels::Never),
        "measured" => Some(FusedKernels::Measured),
        _ => None,
    }
}

/// `--scan-products`' variant as the library's setting.
fn products_mode(products: &str) -> Option<mamba2_burn::ScanProducts> {
    mamba2_burn::ScanProducts::from_name(products)
}

/// Every `--mode` for each `--batch`, `--ssd` path and `--scan-products` variant in turn.
fn run<B: SsdBackend>(
    args: &Args,
    device: B::Device,
    memory: DeviceMemory,
) -> Result<(), Box<dyn std::error::Error>> {
    set_dtype::<B>(args, &device)?;
    let batches = if args.batch.is_empty() {
        vec![args.batch()]
    } else {
        args.batch.clone()
    };
    for batch in batches {
        for ssd in &args.ssd {
            // the tensor operations have no intra-chunk variants: they run once
            let variants = if fused_mode(ssd) == Some(mamba2_burn::FusedKernels::Never) {
                &args.scan_products[..1]
            } else {
                &args.scan_products[..]
            };
            for (products, model) in variants
                .iter()
                .flat_map(|p| args.model.iter().map(move |m| (p, m)))
            {
                let args = Args {
                    ssd: vec![ssd.clone()],
                    scan_products: vec![products.clone()],
                    batch: vec![batch],
                    model: vec![model.clone()],
                    ..args.clone()
                };
                // the models' scans on this thread (a GPU's train and forward run on one)
                let _products = mamba2_burn::ssd::override_scan_products(args.scan_products());
                run_modes::<B>(&args, &device, &memory)?;
            }
        }
    }
    Ok(())
}

fn run_modes<B: SsdBackend>(
    args: &Args,
    device: &B::Device,
    memory: &DeviceMemory,
) -> Result<(), Box<dyn std::error::Error>> {
    let tokens = (args.batch() * args.seq_len) as f64;
    for mode in &args.mode {
        if args.model() == "mamba3" && !["train", "forward", "decode"].contains(&mode.as_str()) {
            eprintln!("--mode {mode} runs Mamba-2 only: skipped for mamba3");
            continue;
        }
        match mode.as_str() {
            "train" => bench_train::<Autodiff<B>>(args, device, memory).map(|t| {
                let mut extra = json!({ "tokens_per_s": tokens / t });
                merge(&mut extra, memory.take());
                report(args, mode, t, extra)
            })?,
            "forward" => bench_forward::<B>(args, device, memory).map(|t| {
                let mut extra = json!({ "tokens_per_s": tokens / t });
                merge(&mut extra, memory.take());
                report(args, mode, t, extra)
            })?,
            "step" => bench_step::<B>(args, device).map(|(tensor, cpu)| {
                report(
                    args,
                    mode,
                    cpu,
                    json!({
                        "us_per_token": cpu * 1e6,
                        "tensor_step_us_per_token": tensor * 1e6,
                        "batch": 1,
                    }),
                )
            })?,
            "decode" => bench_decode::<B>(args, device).map(|t| {
                let extra = json!({
                    "ms_per_token": t * 1e3,
                    "tokens_per_s": args.batch() as f64 / t,
                });
                report(args, mode, t, extra)
            })?,
            "ssd" => {
                let (chunked, sequential) = bench_ssd::<B>(args, device);
                let mut extra = json!({ "chunked_s": chunked, "sequential_s": sequential, "speedup": sequential / chunked });
                merge(&mut extra, ssd_rates(args, false, chunked));
                report(args, mode, chunked, extra);
            }
            "ssd-train" => {
                let t = bench_ssd_train::<Autodiff<B>>(args, device, memory);
                let mut extra = json!({ "tokens_per_s": tokens / t });
                merge(&mut extra, memory.take());
                merge(&mut extra, ssd_rates(args, true, t));
                report(args, mode, t, extra);
            }
            other => {
                eprintln!(
                    "error: unknown --mode {other:?} (train, forward, step, decode, ssd, ssd-train, \
                     ssd-cost, hybrid-params)"
                );
                std::process::exit(2);
            }
        }
    }
    Ok(())
}

fn main() {
    START.get_or_init(Instant::now);
    common::tune_allocator();
    let args = match Args::parse().with_preset().and_then(hybrid::with_vocab) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    if args.lora_rank.is_some() && args.vocab() == 0 {
        eprintln!("error: --lora-rank adapts a language model: give --preset, --vocab or --hybrid");
        std::process::exit(2);
    }
    if let Some(other) = args
        .scan_products
        .iter()
        .find(|s| products_mode(s).is_none())
    {
        eprintln!("error: unknown --scan-products {other:?} (tiled, transient, tensor-cores)");
        std::process::exit(2);
    }
    // the cost model needs no device
    if args.mode.iter().any(|m| m == "ssd-cost") {
        for products in &args.scan_products {
            ssd_cost(&Args {
                scan_products: vec![products.clone()],
                ..args.clone()
            });
        }
    }
    // the hybrid presets' parameter counts need no device either
    if args.mode.iter().any(|m| m == "hybrid-params") {
        hybrid::params();
    }
    let args = Args {
        mode: args
            .mode
            .iter()
            .filter(|m| *m != "ssd-cost" && *m != "hybrid-params")
            .cloned()
            .collect(),
        ..args
    };
    if args.mode.is_empty() {
        return;
    }
    if let Some(other) = args.ssd.iter().find(|s| fused_mode(s).is_none()) {
        eprintln!("error: unknown --ssd {other:?} (fused, tensor-ops, measured)");
        std::process::exit(2);
    }
    if let Err(e) = mixed_precision(&args) {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if args.device != "cpu" {
        let mut line = json!({ "mode": "setup", "since_start_s": since_start() });
        merge(&mut line, setup_cubecl(&args));
        println!("{line}");
    }
    #[cfg(feature = "blas")]
    mamba2_burn::train::set_blas_threads(args.blas_threads.unwrap_or(if args.step_threads() > 1 {
        1
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }));
    let result: Result<(), Box<dyn std::error::Error>> = match args.device.as_str() {
        "cpu" => run::<NdArray<f32>>(&args, Default::default(), DeviceMemory::default()),
        #[cfg(feature = "wgpu")]
        "wgpu" => run::<burn::backend::Wgpu<f32>>(
            &args,
            Default::default(),
            cubecl_memory::<cubecl::wgpu::WgpuRuntime>(Default::default()),
        ),
        #[cfg(feature = "cuda")]
        "cuda" => run::<burn::backend::Cuda<f32>>(
            &args,
            Default::default(),
            cubecl_memory::<cubecl::cuda::CudaRuntime>(Default::default()),
        ),
        other => Err(common::unknown_device(other)),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
