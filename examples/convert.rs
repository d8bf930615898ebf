//! Converts a Mamba-2 checkpoint folder between the Hugging Face, state-spaces and Burn formats:
//! reads any layout `load_lm` reads, writes with `save_checkpoint`, and copies the folder's
//! `tokenizer.json` when it has one.
//!
//! ```text
//! cargo run --release --example convert -- --from DIR --to OUT --format hf
//! cargo run --release --example convert -- --from artifacts/lm --to OUT --format state-spaces
//! ```
//!
//! The weights are written in `f32` (the model's float type here).

use std::path::PathBuf;

use clap::Parser;
use mamba2_burn::checkpoint::read_config;
use mamba2_burn::{load_lm, save_checkpoint, CheckpointFormat};

#[derive(Parser, Debug)]
#[command(
    about = "Convert a Mamba-2 checkpoint between the Hugging Face, state-spaces and Burn formats"
)]
struct Args {
    /// The checkpoint folder to read (or a training run's artifacts directory).
    #[arg(long)]
    from: PathBuf,
    /// The folder to write.
    #[arg(long)]
    to: PathBuf,
    /// The format to write: hf, state-spaces or burn.
    #[arg(long)]
    format: String,
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let format = match args.format.as_str() {
        "hf" | "huggingface" => CheckpointFormat::HuggingFace,
        "state-spaces" | "ss" => CheckpointFormat::StateSpaces,
        "burn" => CheckpointFormat::Burn,
        other => {
            return Err(format!("unknown --format {other:?}: hf, state-spaces or burn").into())
        }
    };
    // a training run's artifacts directory holds the final model in model/
    let from = if args.from.join("model").join("config.json").is_file() {
        args.from.join("model")
    } else {
        args.from.clone()
    };
    let device = Default::default();
    let (config, source) = read_config(&from)?;
    let model = load_lm::<burn::backend::NdArray<f32>>(&from, &device)?;
    let written = save_checkpoint(&model, &config, &args.to, format)?;
    let tokenizer = from.join("tokenizer.json");
    if tokenizer.is_file() {
        std::fs::copy(&tokenizer, args.to.join("tokenizer.json"))?;
    }
    println!(
        "{} ({source:?}, {} parameters) -> {} ({format:?})",
        from.display(),
        config.num_params(),
        written.display()
    );
    Ok(())
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
