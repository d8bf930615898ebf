//! Trains a Mamba-2 model with Burn's `Learner`: a language model on a generated task or a text
//! file (`lm`), or a forecaster on a CSV series or DBN market data (`forecast`), each a thin
//! layer over the library's runs (`train::train_lm`, `train::train_forecaster`) and scores;
//! `args` holds the command line and each task's defaults.
//!
//! ```text
//! cargo run --release --example train                       # MQAR, 16 pairs, 128 tokens, vocab 256
//! cargo run --release --example train -- --task copy        # selective copying
//! cargo run --release --example train -- --task lm --text FILE   # byte-level language model
//! cargo run --release --features tokenizer --example train -- --task lm --init-from DIR --text FILE   # fine-tune
//! cargo run --release --example train -- --task forecast --csv ETTh1.csv --lookback 96 --horizon 96
//! cargo run --release --features dbn --example train -- --task market --dbn FILE.dbn.zst ...
//! ```
//!
//! The run leaves `config.json`, `checkpoint/`, `model/` and `metrics.csv` in its artifacts
//! directory (default `artifacts/<task>`); `--resume` continues it from its last checkpoint.
//! The last line on stdout is `result: task=<task> <metric>=<value> ... elapsed_s=<seconds>`.

#[path = "../common/mod.rs"]
mod common;

mod args;
mod forecast;
mod lm;

use burn::tensor::backend::Backend;
use clap::Parser;
use mamba2_burn::train::TrainDevices;
use mamba2_burn::SsdAutodiffBackend;

use args::{Args, Task};

fn run<B: SsdAutodiffBackend>(
    args: &Args,
    devices: Result<TrainDevices<B>, Box<dyn std::error::Error>>,
) -> Result<(), Box<dyn std::error::Error>> {
    let devices = devices?;
    match args.task {
        Task::Forecast | Task::Market => forecast::run::<B>(args, devices),
        Task::Mqar | Task::Copy | Task::Lm => lm::run::<B>(args, devices),
    }
}

/// `devices` under Burn's multi-device strategy (one device: a plain run).
fn multi_device<B: Backend>(
    args: &Args,
    devices: Vec<B::Device>,
) -> Result<TrainDevices<B>, Box<dyn std::error::Error>> {
    if args.ddp {
        return Err("--ddp needs --device cuda and a build with the `ddp` feature".into());
    }
    Ok(TrainDevices::multi(devices)?)
}

/// CUDA devices under Burn's DDP with `--ddp`, else its multi-device strategy.
#[cfg(all(feature = "cuda", feature = "ddp"))]
fn cuda_devices<B>(
    args: &Args,
    devices: Vec<B::Device>,
) -> Result<TrainDevices<B>, Box<dyn std::error::Error>>
where
    B: burn::tensor::backend::distributed::DistributedBackend,
{
    match args.ddp {
        true => Ok(TrainDevices::ddp(devices)?),
        false => multi_device(args, devices),
    }
}

fn main() {
    common::tune_allocator();
    let args = Args::parse();
    let n = args.devices;
    let result = match args.device.as_str() {
        // one CPU device, n times: Burn's multi-device strategy runs n batches at once. (Burn's
        // `distributed` feature, which `ddp` turns on, trains only on backends with collective
        // operations.)
        #[cfg(not(feature = "ddp"))]
        "cpu" => {
            type B = burn::backend::Autodiff<burn::backend::NdArray<f32>>;
            run::<B>(&args, multi_device(&args, vec![Default::default(); n]))
        }
        #[cfg(feature = "wgpu")]
        "wgpu" => {
            type B = burn::backend::Autodiff<burn::backend::Wgpu<f32>>;
            let devices = match n {
                1 => vec![Default::default()],
                _ => (0..n)
                    .map(burn::backend::wgpu::WgpuDevice::DiscreteGpu)
                    .collect(),
            };
            run::<B>(&args, multi_device(&args, devices))
        }
        #[cfg(feature = "cuda")]
        "cuda" => {
            type B = burn::backend::Autodiff<burn::backend::Cuda<f32>>;
            let devices = (0..n).map(burn::backend::cuda::CudaDevice::new).collect();
            #[cfg(feature = "ddp")]
            let devices = cuda_devices::<B>(&args, devices);
            #[cfg(not(feature = "ddp"))]
            let devices = multi_device::<B>(&args, devices);
            run::<B>(&args, devices)
        }
        other => Err(common::unknown_device(other)),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
