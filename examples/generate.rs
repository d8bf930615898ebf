//! Loads a Mamba-2 checkpoint, or a hybrid one (Granite 4.0-H, Bamba, Nemotron-H, Falcon-H1),
//! and continues a prompt: a thin launcher over the library's `generate_streaming`, printing
//! the text as it is decoded, then the prefill and decode speeds.
//!
//! With no arguments it uses the small reference checkpoint in `tests/fixtures/reference/tiny`
//! (random weights, vocabulary 64, with a tokenizer trained for it), so it runs anywhere
//! without a download:
//!
//! ```text
//! cargo run --release --features tokenizer --example generate
//! cargo run --release --features tokenizer --example generate -- --checkpoint DIR --prompt "Mamba is"
//! cargo run --release --example generate -- --checkpoint DIR --prompt-ids 1,2,3 --max-new-tokens 32
//! ```
//!
//! `DIR` holds `config.json` and the weights (Hugging Face or state-spaces format, any layout
//! they are published in, or this crate's `model.mpk`; a hybrid as transformers saves it), or
//! is the artifacts directory of a training run (its `model/` is loaded). Text needs the `tokenizer` feature and a
//! `tokenizer.json`: `--tokenizer FILE`, or the checkpoint folder's own.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Instant;

mod common;

use clap::Parser;
use mamba2_burn::checkpoint::is_hybrid_folder;
use mamba2_burn::generate::{DecodeStep, Generation};
use mamba2_burn::hybrid::HybridLm;
use mamba2_burn::{load_hybrid, load_lm, GenerateConfig, Mamba2Lm, SsdBackend};

#[derive(Parser, Debug)]
#[command(about = "Continue a prompt with a Mamba-2 or hybrid checkpoint")]
struct Args {
    /// Checkpoint folder (config.json + weights).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/reference/tiny"))]
    checkpoint: PathBuf,
    /// tokenizer.json (default: the checkpoint folder's, when it has one).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// The prompt as text (needs a tokenizer). Default: "the state space model".
    #[arg(long, conflicts_with = "prompt_ids")]
    prompt: Option<String>,
    /// The prompt as token ids, comma separated.
    #[arg(long)]
    prompt_ids: Option<String>,
    /// Number of tokens to generate at most.
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
    /// Stop token ids, comma separated (default: the tokenizer's end-of-text token, if any).
    #[arg(long)]
    stop: Option<String>,
    /// Decode step: auto, tensor or cpu.
    #[arg(long, default_value = "auto")]
    step: String,
    /// Device: cpu, wgpu (needs the `wgpu` feature) or cuda (needs the `cuda` feature).
    #[arg(long, default_value = "cpu")]
    device: String,
}

#[cfg(feature = "tokenizer")]
const DEFAULT_PROMPT: &str = "the state space model";
const DEFAULT_IDS: &str = "3,14,15,9,26,53,58,9,7,9,32,38,46,26,43,38,32,7,9,50";

fn ids(text: &str, flag: &str) -> Result<Vec<i64>, String> {
    text.split(',')
        .map(|t| {
            t.trim()
                .parse::<i64>()
                .map_err(|e| format!("bad token id {t:?} in {flag}: {e}"))
        })
        .collect()
}

/// What prints each new token.
type Printer<'a> = Box<dyn FnMut(i64) -> String + 'a>;

/// Text in and out when there is a tokenizer, ids otherwise.
enum Text {
    #[cfg(feature = "tokenizer")]
    Tokenizer(Box<mamba2_burn::tokenizer::Tokenizer>),
    Ids,
}

impl Text {
    fn new(args: &Args, dir: &Path) -> Result<Self, Box<dyn std::error::Error>> {
        let file = args
            .tokenizer
            .clone()
            .or_else(|| Some(dir.join("tokenizer.json")).filter(|f| f.is_file()));
        match file {
            #[cfg(feature = "tokenizer")]
            Some(file) => Ok(Text::Tokenizer(Box::new(
                mamba2_burn::tokenizer::Tokenizer::from_file(file)?,
            ))),
            #[cfg(not(feature = "tokenizer"))]
            Some(_) if args.prompt.is_some() || args.tokenizer.is_some() => {
                Err("text prompts need the `tokenizer` feature (or give --prompt-ids)".into())
            }
            _ if args.prompt.is_some() => Err(format!(
                "--prompt is text and {} has no tokenizer.json: give --tokenizer or --prompt-ids",
                dir.display()
            )
            .into()),
            _ => Ok(Text::Ids),
        }
    }

    fn prompt(&self, args: &Args) -> Result<Vec<i64>, Box<dyn std::error::Error>> {
        if let Some(list) = &args.prompt_ids {
            return Ok(ids(list, "--prompt-ids")?);
        }
        match self {
            #[cfg(feature = "tokenizer")]
            Text::Tokenizer(t) => Ok(t.encode(args.prompt.as_deref().unwrap_or(DEFAULT_PROMPT))?),
            Text::Ids => Ok(ids(DEFAULT_IDS, "the default prompt")?),
        }
    }

    fn stop_tokens(&self) -> Vec<i64> {
        match self {
            #[cfg(feature = "tokenizer")]
            Text::Tokenizer(t) => ["<|endoftext|>", "</s>", "<eos>"]
                .iter()
                .find_map(|name| t.token_id(name))
                .into_iter()
                .collect(),
            Text::Ids => Vec::new(),
        }
    }

    /// Prints the prompt, then returns the printer of each new token.
    fn printer<'a>(&'a self, prompt: &[i64]) -> Result<Printer<'a>, Box<dyn std::error::Error>> {
        match self {
            #[cfg(feature = "tokenizer")]
            Text::Tokenizer(t) => {
                print!("{}", t.decode(prompt)?);
                let mut stream = t.stream();
                Ok(Box::new(move |id| {
                    stream.push(id).ok().flatten().unwrap_or_default()
                }))
            }
            Text::Ids => {
                print!("{prompt:?} ->");
                Ok(Box::new(|id| format!(" {id}")))
            }
        }
    }
}

/// The two kinds of language model a folder holds.
enum Model<B: SsdBackend> {
    Mamba2(Mamba2Lm<B>),
    Hybrid(HybridLm<B>),
}

impl<B: SsdBackend> Model<B> {
    fn load(dir: &Path, device: &B::Device) -> mamba2_burn::Result<Self> {
        Ok(match is_hybrid_folder(dir)? {
            true => Self::Hybrid(load_hybrid(dir, device)?),
            false => Self::Mamba2(load_lm(dir, device)?),
        })
    }

    fn vocab_size(&self) -> usize {
        match self {
            Self::Mamba2(m) => m.vocab_size(),
            Self::Hybrid(m) => m.vocab_size(),
        }
    }

    fn generate_streaming(
        &self,
        prompts: &[Vec<i64>],
        config: &GenerateConfig,
        on_token: impl FnMut(usize, i64) -> ControlFlow<()>,
    ) -> mamba2_burn::Result<Generation> {
        match self {
            Self::Mamba2(m) => m.generate_streaming(prompts, config, on_token),
            Self::Hybrid(m) => m.generate_streaming(prompts, config, on_token),
        }
    }
}

fn run<B: SsdBackend>(args: &Args, device: B::Device) -> Result<(), Box<dyn std::error::Error>> {
    // a training run's artifacts directory holds the final model in model/
    let dir = if args.checkpoint.join("model").join("config.json").is_file() {
        args.checkpoint.join("model")
    } else {
        args.checkpoint.clone()
    };
    let text = Text::new(args, &dir)?;
    let prompt = text.prompt(args)?;
    let step = match args.step.as_str() {
        "auto" => DecodeStep::Auto,
        "tensor" => DecodeStep::Tensor,
        "cpu" => DecodeStep::Cpu,
        other => return Err(format!("unknown --step {other:?}: auto, tensor or cpu").into()),
    };
    let stop = match &args.stop {
        Some(list) => ids(list, "--stop")?,
        None => text.stop_tokens(),
    };
    let config = GenerateConfig::new()
        .with_max_new_tokens(args.max_new_tokens)
        .with_temperature(args.temperature)
        .with_top_k(args.top_k)
        .with_top_p(args.top_p)
        .with_seed(args.seed)
        .with_stop_tokens(stop)
        .with_step(step);

    let start = Instant::now();
    let model = Model::<B>::load(&dir, &device)?;
    eprintln!(
        "loaded {} (vocabulary {}) in {:.2} s{}",
        dir.display(),
        model.vocab_size(),
        start.elapsed().as_secs_f64(),
        peak_memory().map_or(String::new(), |kib| format!(
            ", peak memory {:.0} MB",
            kib as f64 * 1.024e-3
        ))
    );

    let mut print = text.printer(&prompt)?;
    std::io::stdout().flush()?;
    let generation = model.generate_streaming(&[prompt], &config, |_, token| {
        print!("{}", print(token));
        let _ = std::io::stdout().flush();
        ControlFlow::Continue(())
    })?;
    println!();

    let rate = |n: usize, s: f64| n as f64 / s.max(1e-9);
    let (prefill, decode) = (
        generation.prefill_time.as_secs_f64(),
        generation.decode_time.as_secs_f64(),
    );
    eprintln!(
        "prefill: {} tokens in {:.1} ms ({:.0} tokens/s); decode: {} tokens in {:.1} ms \
         ({:.0} tokens/s, {:?} step; {:?})",
        generation.prompt_tokens,
        prefill * 1e3,
        rate(generation.prompt_tokens, prefill),
        generation.new_tokens(),
        decode * 1e3,
        rate(generation.new_tokens(), decode),
        generation.step,
        generation.finish[0],
    );
    Ok(())
}

/// The process's peak resident memory in KiB so far (Linux's `kB`).
fn peak_memory() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
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
