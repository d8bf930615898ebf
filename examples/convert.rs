//! Converts a Mamba-2 checkpoint folder between the Hugging Face, state-spaces and Burn formats:
//! reads any layout `load_lm` reads, writes with `save_checkpoint`, and copies the folder's
//! `tokenizer.json` when it has one. A hybrid model's folder (Granite 4.0-H, Bamba, Nemotron-H,
//! Falcon-H1) is read with `load_hybrid` and written back in its family's transformers layout
//! (`--format hf`, `save_hybrid`).
//!
//! ```text
//! cargo run --release --example convert -- --from DIR --to OUT --format hf
//! cargo run --release --example convert -- --from artifacts/lm --to OUT --format state-spaces
//! ```
//!
//! The weights are written in `f32` (the model's float type here).

use std::path::PathBuf;

use clap::Parser;
use mamba2_burn::checkpoint::{is_hybrid_folder, read_config, save_hybrid};
use mamba2_burn::{load_hybrid, load_lm, save_checkpoint, CheckpointFormat};

type B = burn::backend::NdArray<f32>;

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
    let (written, description) = if is_hybrid_folder(&from)? {
        if format != CheckpointFormat::HuggingFace {
            return Err("a hybrid model has one layout, transformers': --format hf".into());
        }
        let model = load_hybrid::<B>(&from, &device)?;
        let config = std::fs::read_to_string(from.join("config.json"))?;
        let written = save_hybrid(&model, &config, &args.to)?;
        (
            written,
            format!("{} parameters", burn::module::Module::num_params(&model)),
        )
    } else {
        let (config, source) = read_config(&from)?;
        let model = load_lm::<B>(&from, &device)?;
        let written = save_checkpoint(&model, &config, &args.to, format)?;
        (
            written,
            format!("{source:?}, {} parameters", config.num_params()),
        )
    };
    let tokenizer = from.join("tokenizer.json");
    if tokenizer.is_file() {
        std::fs::copy(&tokenizer, args.to.join("tokenizer.json"))?;
    }
    println!(
        "{} ({description}) -> {} ({format:?})",
        from.display(),
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
