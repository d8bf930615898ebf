//! Replays a CSV time series tick by tick through a [`StreamingForecaster`] and prints the
//! latency per tick.
//!
//! ```text
//! cargo run --release --example stream -- --csv FILE [--model artifacts/forecast] [--ticks 2000]
//! ```
//!
//! `--model` is the artifacts (or `model/`) directory of a forecaster trained with
//! `--task forecast --no-revin`; without it a freshly initialised forecaster is used, which
//! measures the latency only. Rows are standardised with the training part's statistics, as in
//! training. Every `--print-every` ticks it prints the one-step-ahead forecast of the first
//! variable next to the value that then arrives; the last line is
//! `result: ticks=<n> us_per_tick_median=<..> us_per_tick_p99=<..> mse_1step=<..>`.

use std::path::PathBuf;
use std::time::Instant;

mod common;

use burn::backend::NdArray;
use clap::Parser;
use mamba2_burn::data::timeseries::{ForecastData, Split, TimeSeries};
use mamba2_burn::train::load_forecaster;
use mamba2_burn::{
    Mamba2BackboneConfig, Mamba2Config, Mamba2Forecaster, Mamba2ForecasterConfig,
    StreamingForecaster,
};

#[derive(Parser, Debug)]
#[command(about = "Stream a CSV series through a Mamba-2 forecaster, one tick at a time")]
struct Args {
    /// The CSV file (a timestamp column, then numeric columns).
    #[arg(long)]
    csv: PathBuf,
    /// A trained forecaster (artifacts or model directory); a fresh one when absent.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Ticks to replay (all rows when larger).
    #[arg(long, default_value_t = 2000)]
    ticks: usize,
    /// Print a forecast line every this many ticks (0: never).
    #[arg(long, default_value_t = 500)]
    print_every: usize,
}

type Cpu = NdArray<f32>;

fn main() {
    common::tune_allocator();
    if let Err(e) = run(Args::parse()) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let device = Default::default();
    let series = TimeSeries::from_csv(&args.csv)?;
    // the same statistics as training: fitted on the training part of the split
    let data = ForecastData::new(
        &series,
        &args.csv,
        &[],
        &[],
        1,
        1,
        Split::for_file(&args.csv),
    )?;
    let n_vars = series.columns.len();
    let model: Mamba2Forecaster<Cpu> = match &args.model {
        Some(dir) => load_forecaster(dir, &device)?.0,
        None => {
            println!("no --model: a freshly initialised forecaster (latency only)");
            let mixer = Mamba2Config::new(64)
                .with_d_state(32)
                .with_headdim(16)
                .with_chunk_size(32);
            Mamba2ForecasterConfig::new(n_vars, n_vars, 96, Mamba2BackboneConfig::new(2, mixer))
                .with_revin(false)
                .init(&device)?
        }
    };
    if model.n_inputs() != n_vars {
        return Err(format!(
            "the model takes {} variables, {} has {n_vars}",
            model.n_inputs(),
            args.csv.display()
        )
        .into());
    }
    let mut stream = StreamingForecaster::new(&model)?;
    let n_targets = stream.n_targets();
    let ticks = args.ticks.min(series.len());
    println!(
        "replaying {ticks} ticks of {} ({n_vars} variables), horizon {}",
        args.csv.display(),
        stream.horizon()
    );
    let mut latencies = Vec::with_capacity(ticks);
    let (mut se, mut scored) = (0.0f64, 0usize);
    let mut previous: Option<Vec<f32>> = None;
    for (t, raw) in series.values.iter().take(ticks).enumerate() {
        let row = data.scaler.transform(raw);
        // one-step-ahead error of the previous forecast, for the targets that are inputs
        if let Some(prev) = &previous {
            if n_targets == n_vars {
                for (p, v) in prev.iter().zip(&row) {
                    se += ((p - v) as f64).powi(2);
                    scored += 1;
                }
            }
        }
        let start = Instant::now();
        let forecast = stream.push(&row)?;
        latencies.push(start.elapsed().as_secs_f64() * 1e6);
        let next: Vec<f32> = forecast[..n_targets].to_vec();
        if args.print_every > 0 && t % args.print_every == 0 {
            println!(
                "tick {t:>6} {}: next {:>8.4} (now {:>8.4}), latency {:.1} us",
                series.timestamps[t], next[0], row[0], latencies[t]
            );
        }
        previous = Some(next);
    }
    latencies.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    let pct = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
    println!(
        "result: ticks={ticks} us_per_tick_median={:.1} us_per_tick_p99={:.1} mse_1step={:.4}",
        pct(0.5),
        pct(0.99),
        if scored > 0 {
            se / scored as f64
        } else {
            f64::NAN
        }
    );
    Ok(())
}
