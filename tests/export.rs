//! Export (`save_checkpoint`): each reference case written in its own format gives back its
//! own files (the same tensor names, shapes and values; the config keys its format's loader
//! reads, with the same values), and every case goes round the three formats to the same
//! logits. That transformers reads the Hugging Face files is checked in Python
//! (`scripts/check_export.py`, in `docs/checkpoints.md`). Each hybrid case written back
//! (`save_hybrid`) gives the very files transformers saved.

use std::collections::BTreeMap;
use std::path::Path;

use burn::backend::NdArray;
use burn::tensor::{Int, Tensor, TensorData};
use mamba2_burn::checkpoint::read_config;
use mamba2_burn::{load_lm, save_checkpoint, CheckpointFormat, Mamba2Error, Mamba2LmConfig};
use serde_json::Value;

use crate::common::safetensors::read_entries;
use crate::reference::fixture_root;

type B = NdArray<f32>;

/// The reference cases with a language model (all but `backbone`).
fn lm_cases() -> Vec<std::path::PathBuf> {
    let mut cases: Vec<_> = std::fs::read_dir(fixture_root())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("config.json").is_file() && p.file_name().unwrap() != "backbone")
        .collect();
    cases.sort();
    assert_eq!(cases.len(), 5);
    cases
}

fn logits(dir: &Path) -> TensorData {
    let dev = Default::default();
    let model = load_lm::<B>(dir, &dev).unwrap();
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::from([[1i64, 5, 9, 3, 7, 2]]), &dev);
    model.forward(ids, None).unwrap().0.into_data()
}

fn json(file: &Path) -> Value {
    // Python's JSON: `Infinity` is read (as null) by the same parser the crate uses
    json5::from_str(&std::fs::read_to_string(file).unwrap()).unwrap()
}

/// The `__metadata__` of a safetensors file.
fn metadata(file: &Path) -> Value {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header["__metadata__"].clone()
}

/// Numbers compared as numbers (an integer written as a float is the same value).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

#[test]
fn each_case_exported_in_its_own_format_gives_its_own_files() {
    for case in lm_cases() {
        let name = case.file_name().unwrap().to_string_lossy().to_string();
        let (config, format) = read_config(&case).unwrap();
        let model = load_lm::<B>(&case, &Default::default()).unwrap();
        let out = tempfile::tempdir().unwrap();
        let file = save_checkpoint(&model, &config, out.path(), format).unwrap();
        assert_eq!(file, out.path().join("model.safetensors"));

        // the tensors: names, shapes and values (f32 in, f32 out, transposed back)
        let by_name = |file: &Path| -> BTreeMap<String, (Vec<usize>, Vec<u8>)> {
            read_entries(file)
                .into_iter()
                .map(|e| (e.name, (e.shape, e.bytes)))
                .collect()
        };
        let (ours, theirs) = (by_name(&file), by_name(&case.join("model.safetensors")));
        assert_eq!(
            ours.keys().collect::<Vec<_>>(),
            theirs.keys().collect::<Vec<_>>(),
            "{name}: tensor names"
        );
        for (tensor, (shape, bytes)) in &theirs {
            assert_eq!(&ours[tensor].0, shape, "{name}: shape of {tensor}");
            assert!(&ours[tensor].1 == bytes, "{name}: values of {tensor}");
        }
        assert_eq!(metadata(&file)["format"], "pt", "{name}");

        // the config: what this crate writes is what the format's own file says
        let (ours, theirs) = (
            json(&out.path().join("config.json")),
            json(&case.join("config.json")),
        );
        let (ours, theirs) = (ours.as_object().unwrap(), theirs.as_object().unwrap());
        match format {
            CheckpointFormat::HuggingFace => {
                // every key is one of transformers' `Mamba2Config` (whose `to_dict` wrote the
                // case's file, with the generic `PretrainedConfig` keys too), with its value;
                // `architectures` is null in a config that was never saved with a model
                for (key, value) in ours {
                    let Some(theirs) = theirs.get(key) else {
                        panic!("{name}: `{key}` is not a key of transformers' config");
                    };
                    if key != "architectures" {
                        assert!(same(value, theirs), "{name}: {key} = {value}, not {theirs}");
                    }
                }
            }
            CheckpointFormat::StateSpaces => {
                // every key of the case's file, with its value (`norm_epsilon`, which
                // mamba_ssm's `MambaConfig` does not have, only where it is not 1e-5)
                for (key, value) in theirs {
                    match (key.as_str(), ours.get(key)) {
                        ("norm_epsilon", None) => assert_eq!(value.as_f64(), Some(1e-5)),
                        ("ssm_cfg", Some(ssm)) => {
                            for (k, v) in value.as_object().unwrap() {
                                let got = &ssm[k];
                                assert!(same(got, v), "{name}: ssm_cfg.{k} = {got}, not {v}");
                            }
                        }
                        (_, Some(got)) => {
                            assert!(same(got, value), "{name}: {key} = {got}, not {value}")
                        }
                        (_, None) => panic!("{name}: `{key}` is not written"),
                    }
                }
            }
            CheckpointFormat::Burn => unreachable!("the reference cases are Python's"),
        }
    }
}

#[test]
fn every_case_goes_round_the_three_formats_to_the_same_logits() {
    for case in lm_cases() {
        let name = case.file_name().unwrap().to_string_lossy().to_string();
        let want = logits(&case);
        let (config, _) = read_config(&case).unwrap();
        let mut model = load_lm::<B>(&case, &Default::default()).unwrap();
        let mut config: Mamba2LmConfig = config;
        for format in [
            CheckpointFormat::StateSpaces,
            CheckpointFormat::HuggingFace,
            CheckpointFormat::Burn,
            CheckpointFormat::StateSpaces,
        ] {
            let out = tempfile::tempdir().unwrap();
            save_checkpoint(&model, &config, out.path(), format).unwrap();
            let (read, read_format) = read_config(out.path()).unwrap();
            assert_eq!(read_format, format, "{name}");
            if format == CheckpointFormat::HuggingFace {
                // transformers would apply it to the loaded weights
                let written = json(&out.path().join("config.json"));
                assert_eq!(written["rescale_prenorm_residual"], false, "{name}");
            }
            // same shape; the state-spaces format pads the vocabulary with its own multiple
            assert_eq!(
                read.padded_vocab_size(),
                config.padded_vocab_size(),
                "{name}"
            );
            logits(out.path()).assert_eq(&want, true);
            model = load_lm::<B>(out.path(), &Default::default()).unwrap();
            config = read;
        }
    }
}

#[test]
fn what_a_format_cannot_hold_is_an_error_and_nothing_is_written() {
    let case = fixture_root().join("tiny");
    let (config, _) = read_config(&case).unwrap();
    let model = load_lm::<B>(&case, &Default::default()).unwrap();
    let out = tempfile::tempdir().unwrap();
    let mut per_channel_d = config.clone();
    per_channel_d.backbone.mixer.d_has_hdim = true;
    let mut two_eps = config.clone();
    two_eps.backbone.norm_eps = 1e-6;
    for (bad, format, field) in [
        (&per_channel_d, CheckpointFormat::HuggingFace, "d_has_hdim"),
        (&two_eps, CheckpointFormat::HuggingFace, "norm_eps"),
        (&two_eps, CheckpointFormat::StateSpaces, "norm_eps"),
    ] {
        match save_checkpoint(&model, bad, out.path(), format) {
            Err(Mamba2Error::InvalidConfig { field: f, .. }) => assert_eq!(f, field),
            other => panic!("expected a config error on {field}, got {other:?}"),
        }
        assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0);
    }
    // a config of another vocabulary than the model's
    let mut other_vocab = config.clone();
    other_vocab.vocab_size += 1;
    assert!(matches!(
        save_checkpoint(
            &model,
            &other_vocab,
            out.path(),
            CheckpointFormat::HuggingFace
        ),
        Err(Mamba2Error::InvalidInput { name: "config", .. })
    ));
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0);
}

/// Each hybrid case written back by `save_hybrid` gives the files transformers' `save_pretrained`
/// wrote: its config.json, and every tensor under the same name with the same type, shape and
/// bytes (the fused and stacked ones included), none more.
#[test]
fn hybrid_cases_export_to_the_files_transformers_saved() {
    use mamba2_burn::checkpoint::save_hybrid;
    let dirs = crate::common::golden::case_dirs(&crate::hybrid::root());
    assert!(!dirs.is_empty());
    let config = |dir: &Path| std::fs::read_to_string(dir.join("config.json")).unwrap();
    for dir in &dirs {
        let model = mamba2_burn::load_hybrid::<B>(dir, &Default::default()).unwrap();
        let out = tempfile::tempdir().unwrap();
        save_hybrid(&model, &config(dir), out.path()).unwrap();
        assert_eq!(config(out.path()), config(dir));
        let entries = |d: &Path| -> BTreeMap<_, _> {
            read_entries(&d.join("model.safetensors"))
                .into_iter()
                .map(|e| (e.name.clone(), e))
                .collect()
        };
        let (got, want) = (entries(out.path()), entries(dir));
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            "{}",
            dir.display()
        );
        for (name, w) in &want {
            let g = &got[name];
            assert!(
                g.dtype == w.dtype && g.shape == w.shape && g.bytes == w.bytes,
                "{}: {name} differs",
                dir.display()
            );
        }
    }
    // a config.json that does not describe the model writes nothing
    let model = mamba2_burn::load_hybrid::<B>(&dirs[0], &Default::default()).unwrap();
    let out = tempfile::tempdir().unwrap();
    let e = save_hybrid(&model, &config(&dirs[1]), out.path()).unwrap_err();
    assert!(
        matches!(
            e,
            Mamba2Error::InvalidInput {
                name: "config_json",
                ..
            }
        ),
        "{e}"
    );
    assert!(!out.path().join("model.safetensors").exists());
}
