//! Loads a Mamba-2 checkpoint, prefills a prompt with the chunked forward, then decodes new
//! tokens one at a time with the recurrent step: greedy, or sampled with temperature, top-k and
//! top-p from a seed.
//!
//! With no arguments it uses the small reference checkpoint in `tests/fixtures/reference/tiny`
//! (random weights, vocabulary 64), so it runs anywhere without a download:
//!
//! ```text
//! cargo run --release --example generate
//! cargo run --release --example generate -- --checkpoint DIR --prompt 1,2,3 --max-new-tokens 32
//! ```
//!
//! `DIR` holds `config.json` and `model.safetensors` (Hugging Face or state-spaces format) or
//! `model.mpk` (this crate's format), or is the artifacts directory of a training run (its
//! `model/` is loaded). Tokens are given and printed as ids.

use std::path::PathBuf;
use std::time::Instant;

mod common;

use burn::tensor::ElementConversion;
use clap::Parser;
use mamba2_burn::load_lm;
use mamba2_burn::sampling::Sampler;
use mamba2_burn::SsdBackend;

#[derive(Parser, Debug)]
#[command(about = "Prefill a prompt and decode greedily with a Mamba-2 checkpoint")]
struct Args {
    /// Checkpoint folder (config.json + model.safetensors or model.mpk).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/reference/tiny"))]
    checkpoint: PathBuf,
    /// Prompt token ids, comma separated.
    #[arg(
        long,
        default_value = "3,14,15,9,26,53,58,9,7,9,32,38,46,26,43,38,32,7,9,50"
    )]
    prompt: String,
    /// Number of tokens to generate.
    #[arg(long, default_value_t = 32)]
    max_new_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Sample only among the k most likely tokens.
    #[arg(long)]
    top_k: Option<usize>,
    /// Sample only among the most likely tokens whose probabilities sum to p.
    #[arg(long)]
    top_p: Option<f64>,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Device: cpu, wgpu (needs the `wgpu` feature) or cuda (needs the `cuda` feature).
    #[arg(long, default_value = "cpu")]
    device: String,
}

fn run<B: SsdBackend>(args: &Args, device: B::Device) -> Result<(), Box<dyn std::error::Error>> {
    let prompt: Vec<i64> = args
        .prompt
        .split(',')
        .map(|t| {
            t.trim()
                .parse::<i64>()
                .map_err(|e| format!("bad token id {t:?} in --prompt: {e}"))
        })
        .collect::<Result<_, _>>()?;
    if prompt.is_empty() {
        return Err("--prompt needs at least one token id".into());
    }
    let mut sampler = Sampler::new(args.temperature, args.top_k, args.top_p, args.seed)?;
    // a training run's artifacts directory holds the final model in model/
    let dir = if args.checkpoint.join("model").join("config.json").is_file() {
        args.checkpoint.join("model")
    } else {
        args.checkpoint.clone()
    };
    let model = load_lm::<B>(&dir, &device)?;
    println!(
        "loaded {} (vocabulary {})",
        dir.display(),
        model.vocab_size()
    );

    let start = Instant::now();
    let ids = model.input_ids(std::slice::from_ref(&prompt), &device)?;
    let (logits, mut state) = model.forward(ids, None)?;
    let last = logits
        .narrow(1, prompt.len() - 1, 1)
        .reshape([1, model.vocab_size()]);
    let mut next = sampler.sample(last);
    let prefill_s = start.elapsed().as_secs_f64();

    let start = Instant::now();
    let mut generated = Vec::with_capacity(args.max_new_tokens);
    for _ in 0..args.max_new_tokens {
        let token: i64 = next.clone().into_scalar().elem();
        generated.push(token);
        let (logits, s) = model.step(next, state)?;
        state = s;
        next = sampler.sample(logits);
    }
    let decode_s = start.elapsed().as_secs_f64();

    println!("prompt:    {prompt:?}");
    println!("generated: {generated:?}");
    println!(
        "prefill: {} tokens in {:.1} ms; decode: {} tokens in {:.1} ms ({:.0} tokens/s)",
        prompt.len(),
        prefill_s * 1e3,
        generated.len(),
        decode_s * 1e3,
        generated.len() as f64 / decode_s.max(1e-9)
    );
    Ok(())
}

fn main() {
    common::tune_allocator();
    let args = Args::parse();
    let result = match args.device.as_str() {
        "cpu" => run::<burn::backend::NdArray<f32>>(&args, Default::default()),
        #[cfg(feature = "wgpu")]
        "wgpu" => run::<burn::backend::Wgpu<f32>>(&args, Default::default()),
        #[cfg(feature = "cuda")]
        "cuda" => run::<burn::backend::Cuda<f32>>(&args, Default::default()),
        other => Err(common::unknown_device(other)),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
