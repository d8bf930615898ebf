//! The layouts Mamba-2 checkpoints are published in, made here from the reference cases so that
//! the golden comparison runs on them unchanged: sharded safetensors with their index (larger
//! Hugging Face checkpoints), `pytorch_model.bin` (state-spaces, with the `pytorch` feature),
//! weights stored in half precision; the errors of broken shards and tied heads; the presets of
//! the published models.

use crate::common;
use crate::common::safetensors::{read_entries, write_entries, Entry};
#[cfg(feature = "pytorch")]
use crate::common::torch::{write_torch, TorchTensor};
use crate::reference::{check_cases_on_ndarray, fixture_root};

use std::path::{Path, PathBuf};

use burn::backend::NdArray;
use burn::module::Module;
use burn::tensor::{Distribution, Int, Tensor, TensorData};
use mamba2_burn::checkpoint::read_config;
use mamba2_burn::{load_lm, Mamba2BackboneConfig, Mamba2Config, Mamba2Error, Mamba2LmConfig};

type B = NdArray<f32>;

/// The reference case folders (config.json, model.safetensors, expected.safetensors).
fn cases() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(fixture_root())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("model.safetensors").is_file())
        .collect();
    dirs.sort();
    dirs
}

/// A copy of case `src` in `root` without its weights (config and expected outputs).
fn copy_case(src: &Path, root: &Path) -> PathBuf {
    let dst = root.join(src.file_name().unwrap());
    std::fs::create_dir_all(&dst).unwrap();
    for file in ["config.json", "expected.safetensors"] {
        std::fs::copy(src.join(file), dst.join(file)).unwrap();
    }
    dst
}

/// Writes `entries` into `dir` as `shards` safetensors shards (in turn) and their index, as
/// transformers' `save_pretrained` names them.
fn write_shards(dir: &Path, entries: Vec<Entry>, shards: usize) {
    let mut parts: Vec<Vec<Entry>> = (0..shards).map(|_| Vec::new()).collect();
    for (i, e) in entries.into_iter().enumerate() {
        parts[i % shards].push(e);
    }
    let mut map = serde_json::Map::new();
    for (i, part) in parts.iter().enumerate() {
        let file = format!("model-{:05}-of-{shards:05}.safetensors", i + 1);
        for e in part {
            map.insert(e.name.clone(), file.clone().into());
        }
        write_entries(&dir.join(&file), part);
    }
    let index = serde_json::json!({ "metadata": { "total_size": 0 }, "weight_map": map });
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

/// With tied embeddings, the head stored beside the embedding, as `torch.save` of a tied model
/// writes it.
fn with_tied_head(dir: &Path, mut entries: Vec<Entry>) -> Vec<Entry> {
    let (config, _) = read_config(dir).unwrap();
    let has_head = entries.iter().any(|e| e.name == "lm_head.weight");
    if config.tie_embeddings && !has_head {
        let embedding = entries
            .iter()
            .find(|e| e.name.starts_with("backbone.embedding"))
            .expect("an embedding");
        entries.push(Entry {
            name: "lm_head.weight".into(),
            dtype: embedding.dtype,
            shape: embedding.shape.clone(),
            bytes: embedding.bytes.clone(),
        });
    }
    entries
}

#[test]
fn sharded_checkpoints_pass_the_reference_cases() {
    let root = tempfile::tempdir().unwrap();
    for case in cases() {
        let dir = copy_case(&case, root.path());
        write_shards(&dir, read_entries(&case.join("model.safetensors")), 3);
    }
    let failed = check_cases_on_ndarray(root.path(), "ndarray, sharded safetensors");
    assert!(failed.is_empty(), "sharded cases failed: {failed:?}");
}

#[cfg(feature = "pytorch")]
#[test]
fn pytorch_checkpoints_pass_the_reference_cases() {
    let root = tempfile::tempdir().unwrap();
    for case in cases() {
        let dir = copy_case(&case, root.path());
        let entries = with_tied_head(&dir, read_entries(&case.join("model.safetensors")));
        let tensors: Vec<TorchTensor> = entries
            .into_iter()
            .map(|e| TorchTensor {
                name: e.name,
                storage: "FloatStorage",
                shape: e.shape,
                bytes: e.bytes,
            })
            .collect();
        write_torch(&dir.join("pytorch_model.bin"), &tensors);
    }
    let failed = check_cases_on_ndarray(root.path(), "ndarray, pytorch_model.bin");
    assert!(
        failed.is_empty(),
        "pytorch_model.bin cases failed: {failed:?}"
    );
}

/// `bf16` and `f16` of `x`, rounded to nearest, as `f32`.
fn rounded(x: f32, dtype: &str) -> f32 {
    match dtype {
        "BF16" => half::bf16::from_f32(x).to_f32(),
        "F16" => half::f16::from_f32(x).to_f32(),
        _ => x,
    }
}

/// The bytes of `values` stored as `dtype`.
fn stored(values: &[f32], dtype: &str) -> Vec<u8> {
    match dtype {
        "BF16" => values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
        "F16" => values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

fn f32_values(e: &Entry) -> Vec<f32> {
    e.bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// Logits of the model in `dir` for a fixed prompt.
fn logits(dir: &Path) -> TensorData {
    let dev = Default::default();
    let model = load_lm::<B>(dir, &dev).unwrap();
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::from([[1i64, 5, 9, 3]]), &dev);
    model.forward(ids, None).unwrap().0.into_data()
}

#[test]
fn half_precision_weights_are_cast_to_the_model_type() {
    let case = fixture_root().join("tiny");
    let entries = read_entries(&case.join("model.safetensors"));
    for dtype in ["BF16", "F16"] {
        // the same values in f32 and in the half type: the same model
        let root = tempfile::tempdir().unwrap();
        let (wide, narrow) = (root.path().join("f32"), root.path().join("half"));
        for (dir, stored_as) in [(&wide, "F32"), (&narrow, dtype)] {
            std::fs::create_dir_all(dir).unwrap();
            std::fs::copy(case.join("config.json"), dir.join("config.json")).unwrap();
            let converted: Vec<Entry> = entries
                .iter()
                .map(|e| {
                    let values: Vec<f32> =
                        f32_values(e).iter().map(|&v| rounded(v, dtype)).collect();
                    Entry {
                        name: e.name.clone(),
                        dtype: stored_as,
                        shape: e.shape.clone(),
                        bytes: stored(&values, stored_as),
                    }
                })
                .collect();
            write_shards(dir, converted, 2);
        }
        logits(&narrow).assert_eq(&logits(&wide), true);
    }
}

#[test]
fn loading_draws_no_random_weights() {
    // A model built for loading defers every parameter's initialisation and the loader
    // replaces them all, so the generator is not touched: the draws after a load are those
    // right after seeding. (Tests that draw without holding the generator may run in
    // between; a loader that draws random weights fails every attempt.)
    let dev = Default::default();
    let draw = || Tensor::<B, 1>::random([8], Distribution::Default, &dev).into_data();
    let _rng = common::seeded(27);
    let untouched = (0..5).any(|_| {
        common::seeded_again(27);
        let fresh = draw();
        common::seeded_again(27);
        load_lm::<B>(fixture_root().join("tiny"), &dev).unwrap();
        draw() == fresh
    });
    assert!(untouched, "loading drew from the generator");
}

/// A sharded copy of case `tiny` whose index or shards went through `edit` (index JSON, the
/// folder).
fn broken_shards(edit: impl FnOnce(&mut serde_json::Value, &Path)) -> tempfile::TempDir {
    let case = fixture_root().join("tiny");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(case.join("config.json"), dir.path().join("config.json")).unwrap();
    write_shards(dir.path(), read_entries(&case.join("model.safetensors")), 2);
    let file = dir.path().join("model.safetensors.index.json");
    let mut index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    edit(&mut index, dir.path());
    std::fs::write(&file, index.to_string()).unwrap();
    dir
}

const SHARD_1: &str = "model-00001-of-00002.safetensors";
const SHARD_2: &str = "model-00002-of-00002.safetensors";
const NORM: &str = "backbone.norm_f.weight";

#[test]
fn broken_shards_are_errors() {
    let _rng = common::seeded(27);
    let dev = Default::default();
    let load = |dir: &tempfile::TempDir| load_lm::<B>(dir.path(), &dev).unwrap_err();

    // a shard the index names is not there
    let missing = broken_shards(|_, dir| std::fs::remove_file(dir.join(SHARD_2)).unwrap());
    match load(&missing) {
        Mamba2Error::File { file, reason } => {
            assert_eq!(file, missing.path().join(SHARD_2), "{reason}")
        }
        other => panic!("expected File, got {other:?}"),
    }

    // the index puts a tensor in a shard that does not hold it
    let norm_home =
        |index: &serde_json::Value| index["weight_map"][NORM].as_str().unwrap().to_string();
    let moved = broken_shards(|index, _| {
        let other = if norm_home(index) == SHARD_1 {
            SHARD_2
        } else {
            SHARD_1
        };
        index["weight_map"][NORM] = other.into();
    });
    match load(&moved) {
        // read in shard order: the shard that lacks it, or the one that holds it unlisted
        Mamba2Error::MissingTensor { name, .. } | Mamba2Error::TensorConflict { name, .. } => {
            assert_eq!(name, NORM)
        }
        other => panic!("expected MissingTensor or TensorConflict, got {other:?}"),
    }

    // a tensor in two shards
    let twice = broken_shards(|index, dir| {
        let home = norm_home(index);
        let other = if home == SHARD_1 { SHARD_2 } else { SHARD_1 };
        let mut entries = read_entries(&dir.join(other));
        let norm = read_entries(&dir.join(&home))
            .into_iter()
            .find(|e| e.name == NORM)
            .unwrap();
        entries.push(norm);
        write_entries(&dir.join(other), &entries);
    });
    match load(&twice) {
        Mamba2Error::TensorConflict { name, reason, .. } => {
            assert_eq!(name, NORM);
            assert!(reason.contains("index"), "{reason}");
        }
        other => panic!("expected TensorConflict, got {other:?}"),
    }

    // a tensor the index leaves out
    let unlisted = broken_shards(|index, _| {
        index["weight_map"].as_object_mut().unwrap().remove(NORM);
    });
    match load(&unlisted) {
        Mamba2Error::TensorConflict { name, reason, .. } => {
            assert_eq!(name, NORM);
            assert!(reason.contains("not in"), "{reason}");
        }
        other => panic!("expected TensorConflict, got {other:?}"),
    }

    // an index that points outside its folder, or is not an index
    let outside = broken_shards(|index, _| index["weight_map"][NORM] = "../x.safetensors".into());
    assert!(matches!(load(&outside), Mamba2Error::File { .. }));
    let not_index = broken_shards(|index, _| *index = serde_json::json!({ "weights": {} }));
    assert!(matches!(load(&not_index), Mamba2Error::File { .. }));
}

#[test]
fn a_tied_head_must_equal_the_embedding() {
    let _rng = common::seeded(28);
    let case = fixture_root().join("tied_ss_format");
    let original = logits(&case);
    let with_head = |change: f32| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(case.join("config.json"), dir.path().join("config.json")).unwrap();
        let mut entries = with_tied_head(dir.path(), read_entries(&case.join("model.safetensors")));
        let head = entries
            .iter_mut()
            .find(|e| e.name == "lm_head.weight")
            .unwrap();
        let mut values = f32_values(head);
        values[0] += change;
        head.bytes = stored(&values, "F32");
        write_entries(&dir.path().join("model.safetensors"), &entries);
        dir
    };
    // the same matrix stored twice loads, and is the same model
    let equal = with_head(0.0);
    logits(equal.path()).assert_eq(&original, true);
    // a head that differs would be dropped silently: an error naming it
    let differs = with_head(1.0);
    match load_lm::<B>(differs.path(), &Default::default()).unwrap_err() {
        Mamba2Error::TensorConflict { name, file, .. } => {
            assert_eq!(name, "lm_head.weight");
            assert_eq!(file, differs.path().join("model.safetensors"));
        }
        other => panic!("expected TensorConflict, got {other:?}"),
    }
}

/// `config.json` of a published state-spaces model, as its folder holds it.
fn published_config(d_model: usize, n_layer: usize) -> String {
    format!(
        r#"{{"d_model": {d_model}, "d_intermediate": 0, "n_layer": {n_layer}, "vocab_size": 50277,
        "ssm_cfg": {{"layer": "Mamba2"}}, "attn_layer_idx": [], "attn_cfg": {{}},
        "rms_norm": true, "residual_in_fp32": true, "fused_add_norm": true,
        "pad_vocab_size_multiple": 16, "tie_embeddings": true}}"#
    )
}

#[test]
fn presets_are_the_published_configs() {
    // the sizes of the state-spaces model cards: name, d_model, n_layer, parameters
    let published = [
        ("mamba2-130m", 768, 24, 128_989_632),
        ("mamba2-370m", 1024, 48, 368_346_624),
        ("mamba2-780m", 1536, 48, 780_161_280),
        ("mamba2-1.3b", 2048, 48, 1_343_757_312),
        ("mamba2-2.7b", 2560, 64, 2_702_599_680),
    ];
    let names: Vec<&str> = Mamba2LmConfig::published_names().collect();
    assert_eq!(names, published.map(|p| p.0));
    for (name, d_model, n_layer, params) in published {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            published_config(d_model, n_layer),
        )
        .unwrap();
        let (read, _) = read_config(dir.path()).unwrap();
        let preset = Mamba2LmConfig::published(&format!("state-spaces/{name}")).unwrap();
        assert_eq!(preset.to_string(), read.to_string(), "{name}");
        assert_eq!(preset.num_params(), params, "{name}");
    }
    assert_eq!(
        Mamba2LmConfig::mamba2_130m().to_string(),
        Mamba2LmConfig::published("mamba2-130m")
            .unwrap()
            .to_string()
    );
    assert!(Mamba2LmConfig::published("mamba2-7b").is_none());
}

#[test]
fn num_params_counts_what_init_builds() {
    let _rng = common::seeded(29);
    let dev = Default::default();
    let mixer = Mamba2Config::new(32).with_d_state(8).with_headdim(16);
    let variants = [
        mixer.clone(),
        mixer.clone().with_bias(true).with_conv_bias(false),
        mixer.clone().with_d_has_hdim(true).with_ngroups(2),
        mixer.clone().with_rmsnorm(false),
    ];
    for (i, m) in variants.into_iter().enumerate() {
        for tied in [true, false] {
            let config = Mamba2LmConfig::new(Mamba2BackboneConfig::new(2, m.clone()), 100)
                .with_tie_embeddings(tied);
            let model = config.init::<B>(&dev).unwrap();
            assert_eq!(
                config.num_params(),
                model.num_params(),
                "variant {i}, tied {tied}"
            );
        }
    }
    // and at a published size
    let config = Mamba2LmConfig::mamba2_130m();
    let model = config.init::<B>(&dev).unwrap();
    assert_eq!(config.num_params(), model.num_params());
}
