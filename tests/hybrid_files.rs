//! The hybrid models' folders apart from their numbers: each config's parameter count against
//! its files and the presets' against the published counts, each family's ways of writing a
//! config, and the typed errors that name what is wrong in a folder (a family, a layer kind, a
//! field, a tensor).

use std::path::{Path, PathBuf};

use burn::backend::NdArray;
use mamba2_burn::checkpoint::{load_hybrid, read_hybrid_config};

use crate::common::golden::case_dirs;
use crate::hybrid::root;

/// A copy of the `granite_dense` fixture in a new folder, its config edited by `edit` and its
/// tensors by `tensors`.
fn edited_case(
    edit: impl FnOnce(&mut serde_json::Value),
    tensors: impl FnOnce(&mut Vec<crate::common::safetensors::Entry>),
) -> tempfile::TempDir {
    edited_fixture("granite_dense", edit, tensors)
}

/// A copy of fixture `case` in a new folder, its config edited by `edit` and its tensors by
/// `tensors`.
fn edited_fixture(
    case: &str,
    edit: impl FnOnce(&mut serde_json::Value),
    tensors: impl FnOnce(&mut Vec<crate::common::safetensors::Entry>),
) -> tempfile::TempDir {
    use crate::common::safetensors::{read_entries, write_entries};
    let src = root_fixture(case);
    let dir = tempfile::tempdir().unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let mut entries = read_entries(&src.join("model.safetensors"));
    tensors(&mut entries);
    write_entries(&dir.path().join("model.safetensors"), &entries);
    dir
}

fn load_err(dir: &Path) -> mamba2_burn::Mamba2Error {
    load_hybrid::<NdArray<f32>>(dir, &Default::default()).unwrap_err()
}

#[test]
fn hybrid_folders_with_errors_name_the_fault() {
    use mamba2_burn::Mamba2Error;
    let same = |_: &mut Vec<_>| {};
    // a hybrid family the crate does not have
    let dir = edited_case(|c| c["model_type"] = "jamba".into(), same);
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::Unsupported { reason, .. } if reason.contains("jamba")),
        "{e}"
    );
    // Granite's experts: more a token than there are, one expert tensor missing, one of
    // Nemotron-H's experts of the wrong shape
    let dir = edited_fixture(
        "granite_moe_nope_tied",
        |c| c["num_experts_per_tok"] = 5.into(),
        same,
    );
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::ConfigFile { field, .. } if *field == "num_experts_per_tok"),
        "{e}"
    );
    let missing = "model.layers.2.block_sparse_moe.output_linear.weight";
    let dir = edited_fixture(
        "granite_moe_nope_tied",
        |_| {},
        |t| t.retain(|e| e.name != missing),
    );
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::MissingTensor { name, .. } if name == missing),
        "{e}"
    );
    let expert = "backbone.layers.4.mixer.experts.5.up_proj.weight";
    let dir = edited_fixture(
        "nemotron_h_moe",
        |_| {},
        |t| {
            let e = t.iter_mut().find(|e| e.name == expert).unwrap();
            e.shape = vec![e.shape[1], e.shape[0]];
        },
    );
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::TensorShape { name, .. } if name == expert),
        "{e}"
    );
    // a pattern of the wrong length, a layer kind the family does not have
    let dir = edited_case(
        |c| c["layer_types"] = serde_json::json!(["mamba", "attention"]),
        same,
    );
    let e = load_err(dir.path());
    assert!(
        matches!(
            &e,
            Mamba2Error::ConfigFile {
                field: "layer_types",
                ..
            }
        ),
        "{e}"
    );
    let dir = edited_case(|c| c["layer_types"][1] = "mlp".into(), same);
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::Unsupported { reason, .. } if reason.contains("\"mlp\"")),
        "{e}"
    );
    // GQA that does not divide, RoPE scaling
    let dir = edited_case(|c| c["num_key_value_heads"] = 3.into(), same);
    let e = load_err(dir.path());
    assert!(
        matches!(
            &e,
            Mamba2Error::ConfigFile {
                field: "num_key_value_heads",
                ..
            }
        ),
        "{e}"
    );
    let dir = edited_case(|c| c["rope_parameters"]["rope_type"] = "yarn".into(), same);
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::Unsupported { reason, .. } if reason.contains("yarn")),
        "{e}"
    );
    // a missing tensor, one of the wrong shape, one the model does not have
    let dir = edited_case(
        |_| {},
        |t| t.retain(|e| e.name != "model.layers.1.self_attn.k_proj.weight"),
    );
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::MissingTensor { name, .. } if name == "model.layers.1.self_attn.k_proj.weight"),
        "{e}"
    );
    let dir = edited_case(
        |_| {},
        |t| {
            let fused = t
                .iter_mut()
                .find(|e| e.name == "model.layers.0.shared_mlp.input_linear.weight")
                .unwrap();
            fused.shape[0] -= 1;
            fused
                .bytes
                .truncate(fused.shape.iter().product::<usize>() * 4);
        },
    );
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::TensorShape { name, .. } if name == "model.layers.0.shared_mlp.input_linear.weight"),
        "{e}"
    );
    let dir = edited_case(
        |_| {},
        |t| {
            let extra = crate::common::safetensors::f32_entry(
                "model.layers.0.mamba.extra",
                vec![2],
                &[0.0, 1.0],
            );
            t.push(extra);
        },
    );
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::UnexpectedTensor { name, .. } if name == "model.layers.0.mamba.extra"),
        "{e}"
    );
    // the Mamba-2 loader refuses a hybrid folder, and says which loader reads it
    let e =
        mamba2_burn::load_lm::<NdArray<f32>>(root_fixture("granite_dense"), &Default::default())
            .unwrap_err();
    assert!(
        matches!(&e, Mamba2Error::Unsupported { reason, .. } if reason.contains("load_hybrid")),
        "{e}"
    );
}

/// The parameter count of each fixture's config is the number of values in its files.
#[test]
fn param_count_is_what_the_files_hold() {
    use crate::common::safetensors::read_entries;
    for dir in case_dirs(&root()) {
        let config = read_hybrid_config(&dir).unwrap();
        let in_files: usize = read_entries(&dir.join("model.safetensors"))
            .iter()
            .map(|e| e.shape.iter().product::<usize>())
            .sum();
        assert_eq!(config.num_params(), in_files, "{}", dir.display());
    }
}

/// The presets of published models have their published parameter counts.
#[test]
fn presets_have_the_published_parameter_counts() {
    use mamba2_burn::checkpoint::{hybrid_preset, HYBRID_PRESETS};
    for (name, _, published) in HYBRID_PRESETS {
        let config = hybrid_preset(name).unwrap();
        assert_eq!(config.num_params() as u64, published, "{name}");
    }
    assert!(hybrid_preset("granite-4.0-h-2t").is_err());
}

/// Bamba's, Nemotron-H's and Falcon-H1's own ways of writing a config: the older names and
/// pattern read as the new ones, each family's defaults; what the families do not have, or the
/// crate not yet, is refused by name.
#[test]
fn family_configs() {
    use mamba2_burn::Mamba2Error;
    let same = |_: &mut Vec<_>| {};
    let config = |dir: &Path| format!("{:?}", read_hybrid_config(dir).expect("config"));
    // Nemotron-H: the pattern string and the older `mamba_*` names of transformers' renames
    let original = config(&root_fixture("nemotron_h_moe"));
    let dir = edited_fixture(
        "nemotron_h_moe",
        |c| {
            let c = c.as_object_mut().unwrap();
            c.remove("layers_block_type");
            c.insert("hybrid_override_pattern".into(), "M*-ME".into());
            let groups = c.remove("n_groups").unwrap();
            c.insert("mamba_n_groups".into(), groups);
            let chunk = c.remove("chunk_size").unwrap();
            c.insert("mamba_chunk_size".into(), chunk);
        },
        same,
    );
    assert_eq!(config(dir.path()), original);
    // its head is its own tensor even where the config says tied
    let nemotron = read_hybrid_config(&root_fixture("nemotron_h_moe")).unwrap();
    assert!(!nemotron.tie_embeddings && !nemotron.mlp_after_mixer);
    assert_eq!(
        nemotron.mixer.d_inner(),
        48,
        "mamba_num_heads · mamba_head_dim"
    );
    // its experts: relu², no gate, a sigmoid router over groups, the shared expert's width
    let moe = nemotron.moe.as_ref().expect("experts");
    assert_eq!(
        (
            moe.n_experts,
            moe.top_k,
            moe.d_expert,
            moe.n_group,
            moe.topk_group
        ),
        (8, 3, 24, 4, 2)
    );
    assert!(!moe.gated && moe.router == mamba2_burn::RouterKind::Sigmoid);
    assert_eq!(moe.shared.as_ref().map(|s| s.d_hidden), Some(36));
    // the experts' latent projections, and multi-token prediction, are refused by name; groups
    // that do not divide the experts are an error naming the field
    let dir = edited_fixture("nemotron_h_moe", |c| c["moe_latent_size"] = 16.into(), same);
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::Unsupported { reason, .. } if reason.contains("moe_latent_size")),
        "{e}"
    );
    let dir = edited_fixture("nemotron_h_moe", |c| c["n_group"] = 3.into(), same);
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::ConfigFile { field, .. } if *field == "n_group"),
        "{e}"
    );
    let dir = edited_fixture(
        "nemotron_h_moe",
        |c| c["num_nextn_predict_layers"] = 1.into(),
        same,
    );
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::Unsupported { reason, .. } if reason.contains("num_nextn_predict_layers")),
        "{e}"
    );
    // Bamba: half of each head rotated unless `rope_parameters` says otherwise; an attention
    // index past the last layer
    let bamba = read_hybrid_config(&root_fixture("bamba_partial_rope")).unwrap();
    let rope = bamba.attention.rope.as_ref().unwrap();
    assert_eq!((rope.head_dim, rope.rotary_dim), (8, Some(4)));
    let dir = edited_fixture(
        "bamba_partial_rope",
        |c| {
            c["rope_parameters"]
                .as_object_mut()
                .unwrap()
                .remove("partial_rotary_factor");
        },
        same,
    );
    let rope = read_hybrid_config(dir.path())
        .unwrap()
        .attention
        .rope
        .unwrap();
    assert_eq!(rope.rotary_dim, Some(4));
    let dir = edited_fixture(
        "bamba_partial_rope",
        |c| c["attn_layer_indices"] = serde_json::json!([1, 4]),
        same,
    );
    let e = load_err(dir.path());
    assert!(
        matches!(
            &e,
            Mamba2Error::ConfigFile {
                field: "attn_layer_indices",
                ..
            }
        ),
        "{e}"
    );
    // Falcon-H1: its μP multipliers, out_proj's own bias flag, a width of its own or
    // expand · hidden_size where `mamba_d_ssm` is null; the whole head rotated even where
    // `rope_parameters` has a partial factor (this family's code does not read it)
    let falcon = read_hybrid_config(&root_fixture("falcon_h1_mup")).unwrap();
    assert_eq!(
        falcon.mixer.in_proj_multipliers,
        Some([0.9, 1.1, 1.2, 0.8, 1.3])
    );
    assert!(falcon.mixer.bias && !falcon.mixer.has_out_proj_bias());
    assert_eq!(falcon.mixer.d_inner(), 48);
    assert_eq!(falcon.mamba_multipliers, (1.4, 0.75));
    assert_eq!(falcon.attention_multipliers, (1.2, 0.9));
    assert_eq!(falcon.attention.key_multiplier, 0.6);
    assert_eq!(falcon.mlp.multipliers, (1.3, 0.8));
    assert_eq!(falcon.logits_multiplier, 0.7);
    let plain = read_hybrid_config(&root_fixture("falcon_h1_plain")).unwrap();
    assert_eq!(plain.mixer.d_inner(), 64, "mamba_expand · hidden_size");
    assert!(!plain.mixer.rmsnorm);
    let dir = edited_fixture(
        "falcon_h1_mup",
        |c| c["rope_parameters"]["partial_rotary_factor"] = 0.5.into(),
        same,
    );
    let rope = read_hybrid_config(dir.path())
        .unwrap()
        .attention
        .rope
        .unwrap();
    assert_eq!(rope.rotary_dim, None);
    // a Bamba folder without its MLP's gate names the tensor as the file has it
    let dir = edited_fixture(
        "bamba_partial_rope",
        |_| {},
        |t| t.retain(|e| e.name != "model.layers.2.feed_forward.gate_proj.weight"),
    );
    let e = load_err(dir.path());
    assert!(
        matches!(&e, Mamba2Error::MissingTensor { name, .. } if name == "model.layers.2.feed_forward.gate_proj.weight"),
        "{e}"
    );
}

/// The repository's fixture `case` (whatever `MAMBA2_HYBRID_REFERENCE_DIR` says).
pub(crate) fn root_fixture(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hybrid")
        .join(case)
}
