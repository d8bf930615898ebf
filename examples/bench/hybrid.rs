//! `--hybrid CONFIG`: the train, forward and decode modes on a hybrid language model (a
//! preset's shape or any `config.json`, random weights, its own vocabulary), side by side with
//! `scripts/torch_hybrid_bench.py` (transformers on the same config); `--mode hybrid-params`:
//! each preset's parameter count beside the published one.

use mamba2_burn::checkpoint::{hybrid_preset, HybridSpec, HYBRID_PRESETS};
use mamba2_burn::hybrid::HybridConfig;
use serde_json::json;

use super::Args;

/// The model of `--hybrid`: a preset name, else a `config.json` (or a folder holding one).
pub fn config(args: &Args) -> mamba2_burn::Result<Option<HybridConfig>> {
    let Some(name) = args.hybrid.as_deref() else {
        return Ok(None);
    };
    let spec = match HYBRID_PRESETS.iter().any(|(n, _, _)| *n == name) {
        true => HybridSpec::preset(name)?,
        false => HybridSpec::from_file(name)?,
    };
    spec.config().map(Some)
}

/// Gives the run the hybrid's vocabulary (the random ids are drawn from it), after checking
/// that `--hybrid` names a model and that no Mamba-2 size was asked for beside it.
pub fn with_vocab(mut args: Args) -> Result<Args, String> {
    let Some(config) = config(&args).map_err(|e| e.to_string())? else {
        return Ok(args);
    };
    if args.preset.is_some() || args.vocab.is_some() {
        return Err("--hybrid takes its sizes from its config: no --preset or --vocab".into());
    }
    args.vocab = Some(config.vocab_size);
    Ok(args)
}

/// The fields `report` adds for a hybrid run.
pub fn describe(args: &Args) -> serde_json::Value {
    match config(args) {
        Ok(Some(config)) => json!({
            "hybrid": args.hybrid,
            "model_type": config.family.model_type(),
            "params": config.num_params(),
        }),
        _ => json!({}),
    }
}

/// One line per hybrid preset: its parameter count from its config, and the published one.
pub fn params() {
    for (name, _, published) in HYBRID_PRESETS {
        match hybrid_preset(name) {
            Ok(config) => println!(
                "{}",
                json!({
                    "mode": "hybrid-params",
                    "preset": name,
                    "params": config.num_params(),
                    "published": published,
                })
            ),
            Err(e) => eprintln!("error: preset {name}: {e}"),
        }
    }
}
