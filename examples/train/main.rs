//! Trains a Mamba-2 model with Burn's `Learner`: a language model on a generated task or a text
//! file (`lm`), or a forecaster on a CSV series or DBN market data (`forecast`), each a thin
//! layer over the library's runs (`train::train_lm`, `train::train_forecaster`) and scores;
//! `args` holds the command line and each task's defaults.
//!
//! ```text
//! cargo run --release --example train                       # MQAR, 16 pairs, 128 tokens, vocab 256
//! cargo run --release --example train -- --task copy        # selective copying
//! cargo run --release --example train -- --task lm --text FILE   # byte-level language model
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

use clap::Parser;
use mamba2_burn::SsdAutodiffBackend;

use args::{Args, Task};

fn run<B: SsdAutodiffBackend>(
    args: &Args,
    device: B::Device,
) -> Result<(), Box<dyn std::error::Error>> {
    match args.task {
        Task::Forecast | Task::Market => forecast::run::<B>(args, device),
        Task::Mqar | Task::Copy | Task::Lm => lm::run::<B>(args, device),
    }
}

fn main() {
    common::tune_allocator();
    let args = Args::parse();
    let result = match args.device.as_str() {
        "cpu" => {
            run::<burn::backend::Autodiff<burn::backend::NdArray<f32>>>(&args, Default::default())
        }
        #[cfg(feature = "wgpu")]
        "wgpu" => {
            run::<burn::backend::Autodiff<burn::backend::Wgpu<f32>>>(&args, Default::default())
        }
        #[cfg(feature = "cuda")]
        "cuda" => {
            run::<burn::backend::Autodiff<burn::backend::Cuda<f32>>>(&args, Default::default())
        }
        other => Err(common::unknown_device(other)),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
