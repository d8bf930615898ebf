//! Bad input gets a typed error that names the offending thing: invalid configs, wrong input
//! shapes, broken checkpoints. Also: this crate's own records round-trip exactly.

use crate::common;
use crate::common::safetensors::{f32_entry, read_entries, write_entries, Entry};

use std::path::{Path, PathBuf};

use burn::backend::NdArray;
use burn::tensor::{Distribution, Int, Tensor, TensorData};
use mamba2_burn::checkpoint::read_config;
use mamba2_burn::{
    load_backbone, load_lm, save_lm, CheckpointFormat, DtLimit, Mamba2BackboneConfig, Mamba2Config,
    Mamba2Error, Mamba2LmConfig, Mamba2RegressorConfig, Mamba2State,
};

type B = NdArray<f32>;

fn dev() -> <B as burn::tensor::backend::BackendTypes>::Device {
    Default::default()
}

fn fixture(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/reference")
        .join(case)
}

fn config_field(err: Mamba2Error) -> &'static str {
    match err {
        Mamba2Error::InvalidConfig { field, .. } => field,
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
}

fn shape_name(err: Mamba2Error) -> &'static str {
    match err {
        Mamba2Error::Shape { name, .. } => name,
        other => panic!("expected Shape, got {other:?}"),
    }
}

#[test]
fn invalid_configs_are_errors() {
    let _rng = common::seeded(20);
    let base = Mamba2Config::new(32).with_d_state(8).with_headdim(16);
    let field = |c: Mamba2Config| config_field(c.init::<B>(&dev()).unwrap_err());
    assert_eq!(field(base.clone().with_headdim(24)), "headdim"); // d_inner 64 % 24 != 0
    assert_eq!(field(base.clone().with_ngroups(3)), "ngroups"); // 4 heads, 3 groups
    assert_eq!(field(base.clone().with_d_state(0)), "d_state");
    assert_eq!(field(Mamba2Config::new(0)), "d_model");
    assert_eq!(field(base.clone().with_headdim(0)), "headdim");
    assert_eq!(field(base.clone().with_chunk_size(0)), "chunk_size");
    assert_eq!(field(base.clone().with_d_conv(0)), "d_conv");
    assert_eq!(
        field(base.clone().with_dt_limit(DtLimit { min: 0.2, max: 0.1 })),
        "dt_limit"
    );
    assert_eq!(
        field(base.clone().with_a_init_range((0.0, 16.0))),
        "a_init_range"
    );
    assert_eq!(field(base.clone().with_dt_min(0.5)), "dt_min"); // dt_min > dt_max
    let message = base
        .clone()
        .with_ngroups(3)
        .validate()
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("ngroups") && message.contains("nheads = 4"),
        "{message}"
    );

    let backbone = Mamba2BackboneConfig::new(0, base.clone());
    assert_eq!(
        config_field(backbone.init::<B>(&dev()).unwrap_err()),
        "n_layer"
    );
    let lm = Mamba2LmConfig::new(Mamba2BackboneConfig::new(1, base.clone()), 0);
    assert_eq!(
        config_field(lm.init::<B>(&dev()).unwrap_err()),
        "vocab_size"
    );
    let reg = Mamba2RegressorConfig::new(0, 1, Mamba2BackboneConfig::new(1, base));
    assert_eq!(
        config_field(reg.init::<B>(&dev()).unwrap_err()),
        "n_features"
    );
}

#[test]
fn wrong_input_shapes_are_errors() {
    let _rng = common::seeded(21);
    let config = Mamba2Config::new(32)
        .with_d_state(8)
        .with_headdim(16)
        .with_chunk_size(8);
    let mixer = config.init::<B>(&dev()).unwrap();
    let x = Tensor::<B, 3>::zeros([2, 5, 32], &dev());
    assert_eq!(
        shape_name(
            mixer
                .forward(Tensor::zeros([2, 5, 31], &dev()), None)
                .unwrap_err()
        ),
        "x"
    );
    assert_eq!(
        shape_name(
            mixer
                .forward(Tensor::zeros([2, 0, 32], &dev()), None)
                .unwrap_err()
        ),
        "x"
    );
    assert_eq!(
        shape_name(
            mixer
                .step(Tensor::zeros([2, 33], &dev()), mixer.zero_state(2, &dev()))
                .unwrap_err()
        ),
        "x"
    );

    let good = mixer.zero_state(2, &dev());
    let bad_conv = Mamba2State {
        conv: Tensor::zeros([2, 96, 3], &dev()),
        ssm: good.ssm.clone(),
    };
    assert_eq!(
        shape_name(mixer.forward(x.clone(), Some(bad_conv)).unwrap_err()),
        "state.conv"
    );
    let bad_ssm = Mamba2State {
        conv: good.conv.clone(),
        ssm: Tensor::zeros([3, 4, 16, 8], &dev()),
    };
    assert_eq!(
        shape_name(mixer.forward(x.clone(), Some(bad_ssm.clone())).unwrap_err()),
        "state.ssm"
    );
    assert_eq!(
        shape_name(
            mixer
                .step(Tensor::zeros([2, 32], &dev()), bad_ssm)
                .unwrap_err()
        ),
        "state.ssm"
    );
    let err = mixer
        .forward(Tensor::zeros([2, 5, 31], &dev()), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("d_model=32") && err.contains("31"), "{err}");

    let lm = Mamba2LmConfig::new(Mamba2BackboneConfig::new(2, config.clone()), 50)
        .init::<B>(&dev())
        .unwrap();
    assert_eq!(
        shape_name(lm.input_ids(&[vec![1, 2], vec![3]], &dev()).unwrap_err()),
        "input_ids"
    );
    assert!(lm.check_token_ids(&[0, 63]).is_ok());
    assert!(lm.check_token_ids(&[-1]).is_err());
    match lm.input_ids(&[vec![1, 2, 64]], &dev()).unwrap_err() {
        Mamba2Error::InvalidInput { name, reason } => {
            assert_eq!(name, "input_ids");
            assert!(reason.contains("64"), "{reason}"); // 64 >= padded vocab 64
        }
        other => panic!("expected InvalidInput, got {other:?}"),
    }
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::from([[1i64, 2, 3]]), &dev());
    let mut state = lm.zero_state(1, &dev());
    state.layers.pop();
    assert_eq!(
        shape_name(lm.forward(ids.clone(), Some(state)).unwrap_err()),
        "state.layers"
    );
    let (_, state) = lm.forward(ids, None).unwrap();
    let two = Tensor::<B, 1, Int>::from_data(TensorData::from([1i64, 2]), &dev());
    assert_eq!(shape_name(lm.step(two, state).unwrap_err()), "state.conv"); // batch 2 vs the state's 1

    let reg = Mamba2RegressorConfig::new(5, 1, Mamba2BackboneConfig::new(1, config))
        .init::<B>(&dev())
        .unwrap();
    assert_eq!(
        shape_name(
            reg.forward(Tensor::zeros([1, 4, 6], &dev()), None)
                .unwrap_err()
        ),
        "x"
    );
}

/// A copy of a fixture case whose weights went through `edit`.
fn edited_case(case: &str, edit: impl FnOnce(&mut Vec<Entry>)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture(case).join("config.json"),
        dir.path().join("config.json"),
    )
    .unwrap();
    let mut entries = read_entries(&fixture(case).join("model.safetensors"));
    edit(&mut entries);
    write_entries(&dir.path().join("model.safetensors"), &entries);
    dir
}

#[test]
fn rewritten_checkpoint_loads() {
    // loading initialises the model from the generator first
    let _rng = common::seeded(24);
    // the hand-written writer itself produces a loadable file
    let dir = edited_case("tiny", |_| {});
    let loaded = load_lm::<B>(dir.path(), &dev()).unwrap();
    let original = load_lm::<B>(fixture("tiny"), &dev()).unwrap();
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::from([[1i64, 5, 9]]), &dev());
    let (a, _) = loaded.forward(ids.clone(), None).unwrap();
    let (b, _) = original.forward(ids, None).unwrap();
    a.into_data().assert_eq(&b.into_data(), true);
}

#[test]
fn broken_checkpoints_are_errors() {
    // loading initialises the model from the generator first
    let _rng = common::seeded(25);
    let missing = edited_case("tiny", |e| {
        e.retain(|t| t.name != "backbone.layers.1.mixer.D")
    });
    match load_lm::<B>(missing.path(), &dev()).unwrap_err() {
        Mamba2Error::MissingTensor { name, .. } => assert_eq!(name, "backbone.layers.1.mixer.D"),
        other => panic!("expected MissingTensor, got {other:?}"),
    }

    let extra = edited_case("tiny", |e| {
        e.push(f32_entry(
            "backbone.layers.0.mixer.extra",
            vec![2],
            &[1.0, 2.0],
        ))
    });
    match load_lm::<B>(extra.path(), &dev()).unwrap_err() {
        Mamba2Error::UnexpectedTensor { name, .. } => {
            assert_eq!(name, "backbone.layers.0.mixer.extra")
        }
        other => panic!("expected UnexpectedTensor, got {other:?}"),
    }

    let misshaped = edited_case("tiny", |e| {
        let t = e
            .iter_mut()
            .find(|t| t.name == "backbone.layers.0.mixer.dt_bias")
            .unwrap();
        *t = f32_entry("backbone.layers.0.mixer.dt_bias", vec![5], &[0.0; 5]);
    });
    match load_lm::<B>(misshaped.path(), &dev()).unwrap_err() {
        Mamba2Error::TensorShape {
            name,
            expected,
            actual,
            ..
        } => {
            assert_eq!(name, "backbone.layers.0.mixer.dt_bias");
            assert_eq!((expected, actual), (vec![4], vec![5]));
        }
        other => panic!("expected TensorShape, got {other:?}"),
    }

    let transposed = edited_case("tiny", |e| {
        let t = e
            .iter_mut()
            .find(|t| t.name == "backbone.layers.1.mixer.out_proj.weight")
            .unwrap();
        t.shape.reverse(); // [32, 64] -> [64, 32]
    });
    match load_lm::<B>(transposed.path(), &dev()).unwrap_err() {
        Mamba2Error::TensorShape { name, expected, .. } => {
            assert_eq!(name, "backbone.layers.1.mixer.out_proj.weight");
            assert_eq!(expected, vec![32, 64]);
        }
        other => panic!("expected TensorShape, got {other:?}"),
    }

    let wrong_type = edited_case("tiny", |e| {
        let t = e
            .iter_mut()
            .find(|t| t.name == "backbone.norm_f.weight")
            .unwrap();
        t.dtype = "I32";
    });
    match load_lm::<B>(wrong_type.path(), &dev()).unwrap_err() {
        Mamba2Error::TensorDType { name, .. } => assert_eq!(name, "backbone.norm_f.weight"),
        other => panic!("expected TensorDType, got {other:?}"),
    }

    // truncated file
    let truncated = edited_case("tiny", |_| {});
    let file = truncated.path().join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    assert!(matches!(
        load_lm::<B>(truncated.path(), &dev()).unwrap_err(),
        Mamba2Error::File { .. }
    ));

    // no weights, no config, a config that is not JSON, a Mamba-1 config
    let no_weights = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture("tiny").join("config.json"),
        no_weights.path().join("config.json"),
    )
    .unwrap();
    assert!(matches!(
        load_lm::<B>(no_weights.path(), &dev()).unwrap_err(),
        Mamba2Error::File { .. }
    ));
    let empty = tempfile::tempdir().unwrap();
    assert!(matches!(
        load_lm::<B>(empty.path(), &dev()).unwrap_err(),
        Mamba2Error::File { .. }
    ));
    std::fs::write(empty.path().join("config.json"), "{ not json").unwrap();
    assert!(matches!(
        read_config(empty.path()).unwrap_err(),
        Mamba2Error::File { .. }
    ));
    std::fs::write(
        empty.path().join("config.json"),
        r#"{"d_model": 32, "n_layer": 2, "vocab_size": 10, "ssm_cfg": {}}"#,
    )
    .unwrap();
    assert!(matches!(
        read_config(empty.path()).unwrap_err(),
        Mamba2Error::Unsupported { .. }
    ));
    std::fs::write(
        empty.path().join("config.json"),
        r#"{"model_type": "mamba2", "hidden_size": 32, "num_heads": 3, "head_dim": 16}"#,
    )
    .unwrap();
    // a config that describes no buildable model names the file and the field
    match read_config(empty.path()).unwrap_err() {
        Mamba2Error::ConfigFile { file, field, .. } => {
            assert_eq!(
                (file, field),
                (empty.path().join("config.json"), "num_heads")
            );
        }
        other => panic!("expected ConfigFile, got {other:?}"),
    }
}

#[test]
fn configs_of_both_formats_are_read() {
    // loading initialises the model from the generator first
    let _rng = common::seeded(26);
    let (hf, format) = read_config(&fixture("dtlimit_groups4")).unwrap();
    assert_eq!(format, CheckpointFormat::HuggingFace);
    assert_eq!(
        hf.backbone.mixer.dt_limit,
        DtLimit {
            min: 0.02,
            max: 0.2
        }
    );
    assert_eq!(hf.backbone.mixer.ngroups, 4);
    assert!(!hf.tie_embeddings);
    let (hf, _) = read_config(&fixture("tiny")).unwrap(); // holds `Infinity`
    assert_eq!(hf.backbone.mixer.dt_limit, DtLimit::NONE);
    let (ss, format) = read_config(&fixture("tied_ss_format")).unwrap();
    assert_eq!(format, CheckpointFormat::StateSpaces);
    assert!(ss.tie_embeddings);
    assert_eq!(
        (
            ss.backbone.mixer.headdim,
            ss.backbone.mixer.d_state,
            ss.backbone.mixer.chunk_size
        ),
        (8, 4, 4)
    );
    // the backbone alone loads from an LM checkpoint of either format
    load_backbone::<B>(fixture("tied_ss_format"), &dev()).unwrap();
    load_backbone::<B>(fixture("groups2_bias"), &dev()).unwrap();
}

/// A config.json as transformers 5.25's `save_pretrained` writes it (its default
/// `time_step_limit`, `[0.0, {"__float__": "Infinity"}]`): `Mamba2Config(vocab_size=64,
/// hidden_size=32, num_hidden_layers=2, num_heads=4, head_dim=16, state_size=8, n_groups=1,
/// chunk_size=16, expand=2).save_pretrained(DIR)`.
#[test]
fn configs_written_by_transformers_5_are_read() {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/configs/transformers-5.25");
    let (config, format) = read_config(&dir).unwrap();
    assert_eq!(format, CheckpointFormat::HuggingFace);
    let mixer = &config.backbone.mixer;
    assert_eq!(mixer.dt_limit, DtLimit::NONE);
    assert_eq!(
        (
            mixer.d_model,
            mixer.headdim,
            mixer.d_state,
            mixer.chunk_size,
            config.vocab_size
        ),
        (32, 16, 8, 16, 64)
    );

    // every tagged encoding of a float, and the bare one, mean the same
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let out = tempfile::tempdir().unwrap();
    let read = |limit: &str| {
        let edited = text.replace(
            "[\n    0.0,\n    {\n      \"__float__\": \"Infinity\"\n    }\n  ]",
            limit,
        );
        assert_ne!(edited, text, "the fixture's time_step_limit");
        std::fs::write(out.path().join("config.json"), edited).unwrap();
        read_config(out.path())
    };
    for limit in [
        r#"[0.0, Infinity]"#,
        r#"[0.0, {"__float__": "inf"}]"#,
        r#"[{"__float__": "0.0"}, {"__float__": "Infinity"}]"#,
    ] {
        assert_eq!(
            read(limit).unwrap().0.backbone.mixer.dt_limit,
            DtLimit::NONE,
            "{limit}"
        );
    }
    assert_eq!(
        read(r#"[{"__float__": "0.001"}, 0.1]"#)
            .unwrap()
            .0
            .backbone
            .mixer
            .dt_limit,
        DtLimit {
            min: 0.001,
            max: 0.1
        }
    );
    // a field of the wrong type: the error names its JSON path and the file's writer
    for (limit, path) in [
        (
            r#"[0.0, {"__float__": "unbounded"}]"#,
            "`time_step_limit[1]`",
        ),
        (r#"[0.0, "Infinity"]"#, "`time_step_limit[1]`"),
        (
            r#"[{"__float__": "-Infinity"}, 0.1]"#,
            "`time_step_limit[0]`",
        ),
    ] {
        let message = read(limit).unwrap_err().to_string();
        assert!(message.contains(path), "{limit}: {message}");
        assert!(
            message.contains("written by transformers 5.25.0"),
            "{limit}: {message}"
        );
    }
}

#[test]
fn own_records_round_trip() {
    let _rng = common::seeded(22);
    let mixer = Mamba2Config::new(16)
        .with_d_state(8)
        .with_headdim(8)
        .with_dt_limit(DtLimit { min: 0.0, max: 0.5 });
    let config =
        Mamba2LmConfig::new(Mamba2BackboneConfig::new(2, mixer), 20).with_tie_embeddings(false);
    let lm = config.init::<B>(&dev()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    save_lm(&lm, &config, dir.path()).unwrap();
    let (read, format) = read_config(dir.path()).unwrap();
    assert_eq!(format, CheckpointFormat::Burn);
    assert_eq!(read.backbone.mixer.dt_limit, DtLimit { min: 0.0, max: 0.5 });
    let loaded = load_lm::<B>(dir.path(), &dev()).unwrap();
    let ids: Tensor<B, 2, Int> = Tensor::random([2, 9], Distribution::Uniform(0.0, 20.0), &dev());
    let (a, _) = lm.forward(ids.clone(), None).unwrap();
    let (b, _) = loaded.forward(ids, None).unwrap();
    a.into_data().assert_eq(&b.into_data(), true);

    // an infinite dt_limit survives the JSON round trip
    let unlimited = Mamba2LmConfig::new(
        Mamba2BackboneConfig::new(1, Mamba2Config::new(16).with_headdim(8).with_d_state(4)),
        8,
    );
    let dir2 = tempfile::tempdir().unwrap();
    save_lm(
        &unlimited.init::<B>(&dev()).unwrap(),
        &unlimited,
        dir2.path(),
    )
    .unwrap();
    assert_eq!(
        read_config(dir2.path()).unwrap().0.backbone.mixer.dt_limit,
        DtLimit::NONE
    );

    // a corrupt record is an error
    std::fs::write(dir.path().join("model.mpk"), b"garbage").unwrap();
    assert!(matches!(
        load_lm::<B>(dir.path(), &dev()).unwrap_err(),
        Mamba2Error::File { .. }
    ));
}

/// A recorder killed midway through a save: the inner recorder writes its file, which is then
/// cut to half its length, and the save fails, as a process stopped during the write leaves
/// things.
#[derive(Clone, Debug, Default)]
struct DiesMidway;

type Mpk = burn::record::NamedMpkFileRecorder<burn::record::FullPrecisionSettings>;

impl<Bk: burn::tensor::backend::Backend> burn::record::Recorder<Bk> for DiesMidway {
    type Settings = burn::record::FullPrecisionSettings;
    type RecordArgs = PathBuf;
    type RecordOutput = ();
    type LoadArgs = PathBuf;

    fn save_item<I: serde::Serialize>(
        &self,
        item: I,
        file: PathBuf,
    ) -> Result<(), burn::record::RecorderError> {
        burn::record::Recorder::<Bk>::save_item(&Mpk::new(), item, file.clone())?;
        let written = file.with_extension("mpk");
        let len = std::fs::metadata(&written).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&written)
            .unwrap()
            .set_len(len / 2)
            .unwrap();
        Err(burn::record::RecorderError::Unknown("killed midway".into()))
    }

    fn load_item<I: serde::de::DeserializeOwned>(
        &self,
        file: &mut PathBuf,
    ) -> Result<I, burn::record::RecorderError> {
        burn::record::Recorder::<Bk>::load_item(&Mpk::new(), file)
    }
}

impl<Bk: burn::tensor::backend::Backend> burn::record::FileRecorder<Bk> for DiesMidway {
    fn file_extension() -> &'static str {
        "mpk"
    }
}

#[test]
fn a_save_killed_midway_leaves_the_previous_checkpoint_intact() {
    use burn::module::Module;
    let _rng = common::seeded(23);
    let mixer = Mamba2Config::new(16).with_d_state(8).with_headdim(8);
    let config = Mamba2LmConfig::new(Mamba2BackboneConfig::new(1, mixer), 20);
    let first = config.init::<B>(&dev()).unwrap();
    let second = config.init::<B>(&dev()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    save_lm(&first, &config, dir.path()).unwrap();
    let before = std::fs::read(dir.path().join("model.mpk")).unwrap();

    // the second save, atomic as every save of this crate, dies halfway through its write
    let err = second
        .clone()
        .save_file(
            dir.path().join("model"),
            &mamba2_burn::checkpoint::AtomicFileRecorder(DiesMidway),
        )
        .unwrap_err();
    assert!(err.to_string().contains("killed midway"), "{err}");
    // the same write without the atomic wrapper does leave a cut file: the test can fail
    let bare = tempfile::tempdir().unwrap();
    std::fs::write(bare.path().join("model.mpk"), &before).unwrap();
    assert!(second
        .clone()
        .save_file(bare.path().join("model"), &DiesMidway)
        .is_err());
    assert!(std::fs::read(bare.path().join("model.mpk")).unwrap().len() < before.len());

    // the checkpoint is the first model's, byte for byte, and loads as it
    assert_eq!(std::fs::read(dir.path().join("model.mpk")).unwrap(), before);
    let loaded = load_lm::<B>(dir.path(), &dev()).unwrap();
    let ids = Tensor::<B, 2, Int>::from_data([[1, 2, 3, 4]], &dev());
    let (a, _) = first.forward(ids.clone(), None).unwrap();
    let (b, _) = loaded.forward(ids, None).unwrap();
    a.into_data().assert_eq(&b.into_data(), true);
}
