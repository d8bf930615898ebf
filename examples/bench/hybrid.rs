//! `--hybrid CONFIG`: the train, forward and decode modes on a hybrid language model (a
//! preset's shape or any `config.json`, random weights, its own vocabulary), side by side with
//! `scripts/torch_hybrid_bench.py` (transformers on the same config); `--model mamba3`: the same
//! modes on `mamba_ssm`'s language model of Mamba-3 layers of the run's sizes; `--mode
//! hybrid-params`: each preset's parameter count beside the published one.

use mamba2_burn::checkpoint::{hybrid_preset, HybridSpec, HYBRID_PRESETS};
use mamba2_burn::hybrid::HybridConfig;
use serde_json::json;

use super::Args;

/// The model of `--hybrid` (a preset name, else a `config.json` or a folder holding one), or
/// of `--model mamba3`.
pub fn config(args: &Args) -> mamba2_burn::Result<Option<HybridConfig>> {
    if args.model() == "mamba3" {
        return HybridSpec::new(mamba3_json(args).to_string())
            .config()
            .map(Some);
    }
    let Some(name) = args.hybrid.as_deref() else {
        return Ok(None);
    };
    let spec = match HYBRID_PRESETS.iter().any(|(n, _, _)| *n == name) {
        true => HybridSpec::preset(name)?,
        false => HybridSpec::from_file(name)?,
    };
    spec.config().map(Some)
}

/// `mamba_ssm`'s `config.json` of a language model of Mamba-3 layers of the run's sizes
/// (`--d-model`, `--n-layer`, `--d-state`, `--headdim`, `--ngroups`, `--chunk-size`, `--vocab`),
/// its vocabulary padded as the Mamba-2 model's (to a multiple of 16).
fn mamba3_json(args: &Args) -> serde_json::Value {
    json!({
        "d_model": args.d_model,
        "n_layer": args.n_layer,
        "vocab_size": args.vocab(),
        "ssm_cfg": {
            "layer": "Mamba3",
            "d_state": args.d_state,
            "headdim": args.headdim,
            "ngroups": args.ngroups,
            "chunk_size": args.chunk_size,
        },
        "pad_vocab_size_multiple": 16,
    })
}

/// Gives the run the hybrid's vocabulary (the random ids are drawn from it), after checking
/// that `--hybrid` names a model and that no Mamba-2 size was asked for beside it.
pub fn with_vocab(mut args: Args) -> Result<Args, String> {
    if let Some(other) = args
        .model
        .iter()
        .find(|m| !["mamba2", "mamba3"].contains(&m.as_str()))
    {
        return Err(format!("unknown --model {other:?} (mamba2, mamba3)"));
    }
    if args.model.iter().any(|m| m == "mamba3") {
        if args.hybrid.is_some() {
            return Err("--model mamba3 and --hybrid each name the model: give one".into());
        }
        if args.vocab() == 0 {
            return Err("--model mamba3 runs a language model: give --vocab or --preset".into());
        }
        return Ok(args);
    }
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
            "model": args.model(),
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
