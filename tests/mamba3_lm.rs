//! Mamba-3 language models in `mamba_ssm`'s layout (`MambaLMHeadModel` with
//! `ssm_cfg.layer = "Mamba3"`), loaded as hybrid models of Mamba-3 layers: every layer case's
//! state dict under `backbone.layers.{i}.mixer.` loads into the model and gives the case's
//! output; prefill then decode through the cache gives the logits of the whole sequence; export
//! writes the layout back; a folder with a tensor too many, one missing, or a config the reader
//! cannot build is an error naming it.

use std::path::Path;

use burn::backend::NdArray;
use burn::module::Module;
use burn::tensor::{Int, Tensor};
use mamba2_burn::checkpoint::{is_hybrid_folder, load_hybrid, load_lm, save_hybrid};
use mamba2_burn::hybrid::{HybridLm, LayerKind};
use mamba2_burn::Mamba2Error;

use crate::common::golden::{Expected, Report, F32_TOL};
use crate::common::safetensors::{f32_entry, read_entries, write_entries, Entry};
use crate::mamba3::{cases, B};

type Inner = NdArray<f32>;

/// The task-sized model `train --model mamba3` trains.
pub(crate) const TRAIN_CONFIG: &str = include_str!("../examples/train/hybrid/mamba3.json");

/// `config.json` of a `mamba_ssm` model of `n_layer` Mamba-3 layers of the layer case `case`
/// (its constructor arguments as `ssm_cfg`), a vocabulary of `vocab` tokens.
fn lm_config(case: &Path, n_layer: usize, vocab: usize) -> serde_json::Value {
    let text = std::fs::read_to_string(case.join("config.json")).unwrap();
    let mut ssm_cfg: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&text).unwrap();
    let d_model = ssm_cfg.remove("d_model").unwrap();
    ssm_cfg.insert("layer".into(), "Mamba3".into());
    serde_json::json!({
        "d_model": d_model,
        "d_intermediate": 0,
        "n_layer": n_layer,
        "vocab_size": vocab,
        "ssm_cfg": ssm_cfg,
        "rms_norm": true,
        "residual_in_fp32": true,
        "fused_add_norm": true,
        "pad_vocab_size_multiple": 8,
        "tie_embeddings": true,
    })
}

/// Writes to `dir` a `mamba_ssm` folder of two layers: layer 0 the case's state dict, layer 1
/// the same values, the norms and the embedding made up (`vocab` 13, padded to 16), plus
/// `extra` entries.
fn write_folder(case: &Path, dir: &Path, extra: Vec<Entry>) -> usize {
    let config = lm_config(case, 2, 13);
    let d = config["d_model"].as_u64().unwrap() as usize;
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let layer = read_entries(&case.join("model.safetensors"));
    let mut entries = Vec::new();
    for i in 0..2 {
        entries.extend(layer.iter().map(|e| Entry {
            name: format!("backbone.layers.{i}.mixer.{}", e.name),
            dtype: e.dtype,
            shape: e.shape.clone(),
            bytes: e.bytes.clone(),
        }));
        let norm: Vec<f32> = (0..d).map(|c| 1.0 + 0.01 * (c + i) as f32).collect();
        entries.push(f32_entry(
            &format!("backbone.layers.{i}.norm.weight"),
            vec![d],
            &norm,
        ));
    }
    let embedding: Vec<f32> = (0..16 * d)
        .map(|v| ((v * 37 % 101) as f32 / 101.0 - 0.5) * 0.2)
        .collect();
    entries.push(f32_entry(
        "backbone.embedding.weight",
        vec![16, d],
        &embedding,
    ));
    entries.push(f32_entry("backbone.norm_f.weight", vec![d], &vec![0.9; d]));
    entries.extend(extra);
    write_entries(&dir.join("model.safetensors"), &entries);
    d
}

/// Every layer case's weights, under `mamba_ssm`'s LM names, load into a Mamba-3 layer of the
/// model that gives the case's output (`f32` tolerances); the folder is a hybrid folder to the
/// loaders, and the Mamba-2 loader names the reader to use.
#[test]
fn layer_cases_load_under_the_language_model_names() {
    let mut report = Report::new(F32_TOL);
    for case in [cases("layer", "siso"), cases("layer", "mimo")].concat() {
        let dir = tempfile::tempdir().unwrap();
        write_folder(&case, dir.path(), Vec::new());
        assert!(is_hybrid_folder(dir.path()).unwrap());
        let model: HybridLm<B> = load_hybrid(dir.path(), &Default::default()).unwrap();
        assert_eq!(
            model.vocab_size(),
            16,
            "the vocabulary padded to a multiple of 8"
        );
        let kinds: Vec<_> = model.layers.iter().map(|l| l.kind()).collect();
        assert_eq!(kinds, [LayerKind::Mamba3; 2]);
        let e = Expected::read(&case.join("expected.safetensors"));
        let x = e.float::<B, 3>("x", &Default::default());
        for layer in &model.layers {
            let (y, _) = layer
                .mamba3
                .as_ref()
                .unwrap()
                .forward(x.clone(), None)
                .unwrap();
            let name = case.file_name().unwrap().to_string_lossy();
            report.compare(
                &format!("{name}: y"),
                y.into_data(),
                e.get("y").unwrap(),
                false,
            );
        }
        match load_lm::<Inner>(dir.path(), &Default::default()) {
            Err(Mamba2Error::Unsupported { reason, .. }) => {
                assert!(reason.contains("load_hybrid"), "{reason}")
            }
            other => panic!("the Mamba-2 loader read a Mamba-3 folder: {other:?}"),
        }
    }
    assert!(report.failures.is_empty(), "{}", report.failures.join("; "));
}

/// A tensor the model has no place for, a missing one, and a config the Mamba-3 reader refuses
/// are errors naming them.
#[test]
fn a_bad_mamba3_folder_is_an_error_naming_the_fault() {
    let case = &cases("layer", "siso")[0];
    let dev = Default::default();
    let dir = tempfile::tempdir().unwrap();
    let extra = f32_entry("backbone.layers.1.mixer.extra", vec![1], &[0.0]);
    write_folder(case, dir.path(), vec![extra]);
    let e = load_hybrid::<Inner>(dir.path(), &dev).unwrap_err();
    assert!(
        matches!(&e, Mamba2Error::UnexpectedTensor { name, .. } if name == "backbone.layers.1.mixer.extra"),
        "{e}"
    );

    write_folder(case, dir.path(), Vec::new());
    let file = dir.path().join("model.safetensors");
    let entries: Vec<Entry> = read_entries(&file)
        .into_iter()
        .filter(|e| e.name != "backbone.layers.1.mixer.B_bias")
        .collect();
    write_entries(&file, &entries);
    let e = load_hybrid::<Inner>(dir.path(), &dev).unwrap_err();
    assert!(
        matches!(&e, Mamba2Error::MissingTensor { name, .. } if name == "backbone.layers.1.mixer.B_bias"),
        "{e}"
    );

    let config_file = dir.path().join("config.json");
    let good: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_file).unwrap()).unwrap();
    for (edit, named) in [
        (
            serde_json::json!({"ssm_cfg": {"layer": "Mamba3", "rope_fraction": 0.3}}),
            "rope_fraction",
        ),
        (serde_json::json!({"attn_layer_idx": [1]}), "attn_layer_idx"),
        (
            serde_json::json!({"ssm_cfg": {"layer": "Mamba3", "typo": 1}}),
            "typo",
        ),
        (serde_json::json!({"n_layers": 2}), "n_layers"),
    ] {
        let mut config = good.clone();
        for (k, v) in edit.as_object().unwrap() {
            match (config[k].as_object_mut(), v.as_object()) {
                (Some(fields), Some(new)) => fields.extend(new.clone()),
                _ => config[k] = v.clone(),
            }
        }
        std::fs::write(&config_file, config.to_string()).unwrap();
        let e = load_hybrid::<Inner>(dir.path(), &dev).unwrap_err();
        assert!(e.to_string().contains(named), "{named}: {e}");
    }
}

/// The whole sequence's logits equal those of a prefill then the rest through the cache, by the
/// forward in pieces and by the recurrent step; export writes `mamba_ssm`'s names, which load
/// back to the same logits.
#[test]
fn prefill_then_decode_and_export_agree() {
    let dev = Default::default();
    for case in [&cases("layer", "siso")[0], &cases("layer", "mimo")[0]] {
        let dir = tempfile::tempdir().unwrap();
        write_folder(case, dir.path(), Vec::new());
        let model: HybridLm<Inner> = load_hybrid(dir.path(), &dev).unwrap();
        let rows: Vec<Vec<i64>> = (0..2)
            .map(|r| (0..11).map(|t| (3 * r + 5 * t + 1) % 13).collect())
            .collect();
        let ids = model.input_ids(&rows, &dev).unwrap();
        let (whole, _) = model.forward(ids.clone(), None).unwrap();
        let (head, cache) = model.forward(ids.clone().narrow(1, 0, 7), None).unwrap();
        let (tail, _) = model
            .forward(ids.clone().narrow(1, 7, 4), Some(cache.clone()))
            .unwrap();
        let pieces = Tensor::cat(vec![head, tail], 1);
        let mut report = Report::new(F32_TOL);
        report.compare(
            "pieces",
            pieces.into_data(),
            &whole.clone().into_data(),
            false,
        );
        let mut cache = cache;
        for t in 7..11 {
            let token: Tensor<Inner, 1, Int> = ids.clone().narrow(1, t, 1).flatten(0, 1);
            let (logits, next) = model.step(token, cache).unwrap();
            cache = next;
            let expected = whole.clone().narrow(1, t, 1).flatten::<2>(1, 2);
            report.compare(
                &format!("step {t}"),
                logits.into_data(),
                &expected.into_data(),
                false,
            );
        }
        assert!(report.failures.is_empty(), "{}", report.failures.join("; "));

        let config = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
        let out = tempfile::tempdir().unwrap();
        save_hybrid(&model, &config, out.path()).unwrap();
        let names: Vec<String> = read_entries(&out.path().join("model.safetensors"))
            .into_iter()
            .map(|e| e.name)
            .collect();
        let theirs: Vec<String> = read_entries(&dir.path().join("model.safetensors"))
            .into_iter()
            .map(|e| e.name)
            .collect();
        let sorted = |mut v: Vec<String>| {
            v.sort();
            v
        };
        assert_eq!(
            sorted(names),
            sorted(theirs),
            "mamba_ssm's names, the tied head once"
        );
        let back: HybridLm<Inner> = load_hybrid(out.path(), &dev).unwrap();
        let (again, _) = back.forward(ids, None).unwrap();
        assert_eq!(again.into_data(), whole.into_data());
    }
}

/// The training example's Mamba-3 model: two SISO layers, `mamba_ssm`'s parameter count, its
/// out_proj weights drawn at `1/√n_layer` of the plain init's bound as `mamba_ssm` rescales them.
#[test]
fn the_training_config_builds_mamba_ssm_s_model() {
    let spec = mamba2_burn::checkpoint::HybridSpec::new(TRAIN_CONFIG);
    let config = spec.config().unwrap();
    let model: HybridLm<Inner> = config.init(&Default::default()).unwrap();
    assert_eq!(model.num_params() as f64, config.param_count());
    let m = config.mamba3.as_ref().unwrap();
    let bound = 1.0 / (m.d_inner() as f64).sqrt() / (config.layers.len() as f64).sqrt();
    for layer in &model.layers {
        let w = layer.mamba3.as_ref().unwrap().out_proj.weight.val();
        let max = w.abs().max().into_scalar() as f64;
        assert!(max <= bound && max > 0.9 * bound, "{max} against {bound}");
    }
}
