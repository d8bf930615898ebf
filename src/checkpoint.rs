//! Checkpoints: Hugging Face and state-spaces Mamba-2 folders, and this crate's own records.
//!
//! A checkpoint folder holds `config.json` and `model.safetensors`:
//!
//! - **Hugging Face** (`Mamba2ForCausalLM`): `config.json` as transformers writes it (it may hold
//!   `Infinity`, like published configs), tensors `backbone.embeddings.weight`,
//!   `backbone.layers.{i}.{norm.weight, mixer.*}`, `backbone.norm_f.weight`, `lm_head.weight`.
//! - **state-spaces** (`MambaLMHeadModel`): `config.json` with `d_model`, `n_layer`,
//!   `ssm_cfg = {"layer": "Mamba2", ...}`; `backbone.embedding.weight`; `lm_head.weight` may be
//!   absent when the embeddings are tied.
//! - **this crate** ([`save_lm`]): `config.json` of a [`Mamba2LmConfig`] and `model.mpk`, a
//!   full-precision Burn record.
//!
//! Loading is all or nothing: every parameter must be found with the right shape and a float
//! type, and every tensor in the file must be used, or the load fails with an error that names
//! the tensor; no partially loaded model is ever returned.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use burn::config::Config;
use burn::module::Module;
use burn::store::{ModuleSnapshot, ModuleStore, SafetensorsStore, TensorSnapshot};
use burn::tensor::{backend::Backend, DType, TensorData};
use serde::Deserialize;

use crate::backbone::{Mamba2Backbone, Mamba2BackboneConfig};
use crate::error::{Mamba2Error, Result};
use crate::lm::{Mamba2Lm, Mamba2LmConfig};
use crate::mixer::{DtLimit, Mamba2Config};
use crate::recorder::CheckpointRecorder;

/// The layout a checkpoint folder is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointFormat {
    /// Hugging Face transformers (`Mamba2Config`, `backbone.embeddings.*`).
    HuggingFace,
    /// state-spaces `mamba_ssm` (`ssm_cfg`, `backbone.embedding.*`).
    StateSpaces,
    /// This crate's own record (`model.mpk`).
    Burn,
}

/// Hugging Face `Mamba2Config` fields; absent fields take transformers' defaults.
#[derive(Deserialize)]
struct HfConfig {
    #[serde(default = "hf::num_heads")]
    num_heads: usize,
    #[serde(default = "hf::head_dim")]
    head_dim: usize,
    #[serde(default = "hf::vocab_size")]
    vocab_size: usize,
    #[serde(default = "hf::hidden_size")]
    hidden_size: usize,
    #[serde(default = "hf::state_size")]
    state_size: usize,
    #[serde(default = "hf::num_hidden_layers")]
    num_hidden_layers: usize,
    #[serde(default = "hf::eps")]
    layer_norm_epsilon: f64,
    #[serde(default = "hf::expand")]
    expand: usize,
    #[serde(default = "hf::conv_kernel")]
    conv_kernel: usize,
    #[serde(default = "hf::n_groups")]
    n_groups: usize,
    #[serde(default)]
    use_bias: bool,
    #[serde(default = "yes")]
    use_conv_bias: bool,
    #[serde(default = "hf::hidden_act")]
    hidden_act: String,
    #[serde(default = "hf::time_step_min")]
    time_step_min: f64,
    #[serde(default = "hf::time_step_max")]
    time_step_max: f64,
    #[serde(default = "hf::time_step_floor")]
    time_step_floor: f64,
    #[serde(default)]
    time_step_limit: DtLimit,
    #[serde(default = "hf::chunk_size")]
    chunk_size: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default = "yes")]
    rms_norm: bool,
    #[serde(default)]
    norm_before_gate: bool,
}

/// transformers' `Mamba2Config` defaults (those of Mamba-Codestral-7B).
mod hf {
    pub fn num_heads() -> usize {
        128
    }
    pub fn head_dim() -> usize {
        64
    }
    pub fn vocab_size() -> usize {
        32768
    }
    pub fn hidden_size() -> usize {
        4096
    }
    pub fn state_size() -> usize {
        128
    }
    pub fn num_hidden_layers() -> usize {
        64
    }
    pub fn eps() -> f64 {
        1e-5
    }
    pub fn expand() -> usize {
        2
    }
    pub fn conv_kernel() -> usize {
        4
    }
    pub fn n_groups() -> usize {
        8
    }
    pub fn hidden_act() -> String {
        "silu".into()
    }
    pub fn time_step_min() -> f64 {
        0.001
    }
    pub fn time_step_max() -> f64 {
        0.1
    }
    pub fn time_step_floor() -> f64 {
        1e-4
    }
    pub fn chunk_size() -> usize {
        256
    }
}

fn yes() -> bool {
    true
}

/// state-spaces `MambaConfig` fields.
#[derive(Deserialize)]
struct SsConfig {
    d_model: usize,
    #[serde(default)]
    d_intermediate: usize,
    n_layer: usize,
    vocab_size: usize,
    #[serde(default)]
    ssm_cfg: SsMixerConfig,
    #[serde(default)]
    attn_layer_idx: Vec<usize>,
    #[serde(default = "yes")]
    rms_norm: bool,
    #[serde(default = "ss::pad_multiple")]
    pad_vocab_size_multiple: usize,
    #[serde(default = "yes")]
    tie_embeddings: bool,
    #[serde(default = "hf::eps")]
    norm_epsilon: f64,
}

/// state-spaces `Mamba2.__init__` arguments, with its defaults.
#[derive(Deserialize, Default)]
#[allow(non_snake_case)]
struct SsMixerConfig {
    layer: Option<String>,
    d_state: Option<usize>,
    d_conv: Option<usize>,
    expand: Option<usize>,
    headdim: Option<usize>,
    d_ssm: Option<usize>,
    ngroups: Option<usize>,
    chunk_size: Option<usize>,
    dt_min: Option<f64>,
    dt_max: Option<f64>,
    dt_init_floor: Option<f64>,
    dt_limit: Option<DtLimit>,
    A_init_range: Option<(f64, f64)>,
    bias: Option<bool>,
    conv_bias: Option<bool>,
    rmsnorm: Option<bool>,
    norm_before_gate: Option<bool>,
    D_has_hdim: Option<bool>,
}

mod ss {
    pub fn pad_multiple() -> usize {
        8
    }
}

impl HfConfig {
    fn into_config(self, file: &Path) -> Result<Mamba2LmConfig> {
        let unsupported = |reason: String| Mamba2Error::Unsupported {
            file: file.to_path_buf(),
            reason,
        };
        if !matches!(self.hidden_act.as_str(), "silu" | "swish") {
            return Err(unsupported(format!(
                "hidden_act = {:?} (only silu)",
                self.hidden_act
            )));
        }
        if self.num_heads * self.head_dim != self.expand * self.hidden_size {
            return Err(Mamba2Error::InvalidConfig {
                field: "num_heads",
                reason: format!(
                    "num_heads · head_dim = {} · {} must equal expand · hidden_size = {} · {}",
                    self.num_heads, self.head_dim, self.expand, self.hidden_size
                ),
            });
        }
        let mixer = Mamba2Config::new(self.hidden_size)
            .with_d_state(self.state_size)
            .with_d_conv(self.conv_kernel)
            .with_expand(self.expand)
            .with_headdim(self.head_dim)
            .with_ngroups(self.n_groups)
            .with_chunk_size(self.chunk_size)
            .with_dt_min(self.time_step_min)
            .with_dt_max(self.time_step_max)
            .with_dt_init_floor(self.time_step_floor)
            .with_dt_limit(self.time_step_limit)
            .with_bias(self.use_bias)
            .with_conv_bias(self.use_conv_bias)
            .with_rmsnorm(self.rms_norm)
            .with_norm_eps(self.layer_norm_epsilon)
            .with_norm_before_gate(self.norm_before_gate);
        let backbone = Mamba2BackboneConfig::new(self.num_hidden_layers, mixer)
            .with_norm_eps(self.layer_norm_epsilon);
        let config = Mamba2LmConfig::new(backbone, self.vocab_size)
            .with_pad_vocab_size_multiple(1)
            .with_tie_embeddings(self.tie_word_embeddings);
        config.validate()?;
        Ok(config)
    }
}

impl SsConfig {
    fn into_config(self, file: &Path) -> Result<Mamba2LmConfig> {
        let unsupported = |reason: String| Mamba2Error::Unsupported {
            file: file.to_path_buf(),
            reason,
        };
        let m = self.ssm_cfg;
        if m.layer.as_deref() != Some("Mamba2") {
            return Err(unsupported(format!(
                "ssm_cfg.layer = {:?} (only \"Mamba2\"; state-spaces defaults to Mamba-1)",
                m.layer
            )));
        }
        if self.d_intermediate != 0 {
            return Err(unsupported(format!(
                "d_intermediate = {} (MLP blocks)",
                self.d_intermediate
            )));
        }
        if !self.attn_layer_idx.is_empty() {
            return Err(unsupported(format!(
                "attention layers {:?}",
                self.attn_layer_idx
            )));
        }
        if !self.rms_norm {
            return Err(unsupported("rms_norm = false (LayerNorm blocks)".into()));
        }
        let d = Mamba2Config::new(self.d_model);
        let mixer = Mamba2Config {
            d_state: m.d_state.unwrap_or(d.d_state),
            d_conv: m.d_conv.unwrap_or(d.d_conv),
            expand: m.expand.unwrap_or(d.expand),
            headdim: m.headdim.unwrap_or(d.headdim),
            ngroups: m.ngroups.unwrap_or(d.ngroups),
            chunk_size: m.chunk_size.unwrap_or(d.chunk_size),
            dt_min: m.dt_min.unwrap_or(d.dt_min),
            dt_max: m.dt_max.unwrap_or(d.dt_max),
            dt_init_floor: m.dt_init_floor.unwrap_or(d.dt_init_floor),
            dt_limit: m.dt_limit.unwrap_or(d.dt_limit),
            a_init_range: m.A_init_range.unwrap_or(d.a_init_range),
            bias: m.bias.unwrap_or(d.bias),
            conv_bias: m.conv_bias.unwrap_or(d.conv_bias),
            rmsnorm: m.rmsnorm.unwrap_or(d.rmsnorm),
            norm_before_gate: m.norm_before_gate.unwrap_or(d.norm_before_gate),
            d_has_hdim: m.D_has_hdim.unwrap_or(d.d_has_hdim),
            norm_eps: self.norm_epsilon,
            ..d
        };
        if let Some(d_ssm) = m.d_ssm {
            if d_ssm != mixer.d_inner() {
                return Err(unsupported(format!(
                    "d_ssm = {d_ssm} < d_inner (gated MLP part)"
                )));
            }
        }
        let backbone =
            Mamba2BackboneConfig::new(self.n_layer, mixer).with_norm_eps(self.norm_epsilon);
        let config = Mamba2LmConfig::new(backbone, self.vocab_size)
            .with_pad_vocab_size_multiple(self.pad_vocab_size_multiple)
            .with_tie_embeddings(self.tie_embeddings);
        config.validate()?;
        Ok(config)
    }
}

/// Reads `dir/config.json` in any of the three formats.
///
/// Python's JSON (`Infinity`, `NaN`) is accepted. The file is parsed once, into a JSON value
/// that holds a non-finite number as `null`: the dt limits read a `null` bound as `∞` (this
/// crate writes an infinite bound so too), every other number field refuses it.
pub fn read_config(dir: &Path) -> Result<(Mamba2LmConfig, CheckpointFormat)> {
    let file = dir.join("config.json");
    parse_config(&file).map_err(|e| match e {
        // name the file too
        Mamba2Error::InvalidConfig { field, reason } => Mamba2Error::ConfigFile {
            file: file.clone(),
            field,
            reason,
        },
        e => e,
    })
}

fn parse_config(file: &Path) -> Result<(Mamba2LmConfig, CheckpointFormat)> {
    let text = std::fs::read_to_string(file).map_err(|e| Mamba2Error::file(file, e))?;
    let value: serde_json::Value = json5::from_str(&text)
        .map_err(|e| Mamba2Error::file(&file, format!("not valid JSON: {e}")))?;
    let has = |key: &str| value.get(key).is_some();
    let is_mamba2 = value.get("model_type").and_then(|v| v.as_str()) == Some("mamba2");
    let format = if has("ssm_cfg") || (has("d_model") && has("n_layer")) {
        CheckpointFormat::StateSpaces
    } else if has("backbone") && has("vocab_size") && !has("hidden_size") {
        CheckpointFormat::Burn
    } else if has("hidden_size") || is_mamba2 {
        CheckpointFormat::HuggingFace
    } else {
        return Err(Mamba2Error::file(
            &file,
            "not a Mamba-2 config (no hidden_size, d_model/n_layer or backbone)",
        ));
    };
    let parse_err = |e: serde_json::Error| Mamba2Error::file(&file, format!("bad config: {e}"));
    match format {
        CheckpointFormat::StateSpaces => {
            let c: SsConfig = serde_json::from_value(value).map_err(parse_err)?;
            Ok((c.into_config(&file)?, format))
        }
        CheckpointFormat::Burn => {
            let c: Mamba2LmConfig = serde_json::from_value(value).map_err(parse_err)?;
            Ok((c, format))
        }
        CheckpointFormat::HuggingFace => {
            let c: HfConfig = serde_json::from_value(value).map_err(parse_err)?;
            Ok((c.into_config(&file)?, format))
        }
    }
    .and_then(|(c, format)| {
        c.validate()?;
        Ok((c, format))
    })
}

/// Checks, before a model is built, that `file` is large enough for the parameters that
/// `params` (a count from the config) declares at 2 bytes each (f16 / bf16, the smallest float
/// type a checkpoint may hold), so that a config declaring a huge model next to a small file
/// is an error and not an allocation of the declared size.
fn check_weights_fit(file: &Path, params: f64) -> Result<()> {
    if !file.is_file() {
        return Err(Mamba2Error::file(file, "no such file"));
    }
    let len = std::fs::metadata(file)
        .map_err(|e| Mamba2Error::file(file, format!("cannot read: {e}")))?
        .len();
    if 2.0 * params > len as f64 {
        return Err(Mamba2Error::file(
            file,
            format!("{len} bytes cannot hold the {params:.0} parameters that config.json declares"),
        ));
    }
    Ok(())
}

/// The parameters of the backbone `config` describes (counted in `f64`, which cannot overflow
/// for sizes from a corrupt file).
fn backbone_params(config: &Mamba2BackboneConfig) -> f64 {
    let m = &config.mixer;
    let f = |v: usize| v as f64;
    let d_model = f(m.d_model);
    let d_inner = f(m.expand) * d_model;
    let bc = 2.0 * f(m.ngroups) * f(m.d_state);
    let d_in_proj = 2.0 * d_inner + bc + (d_inner / f(m.headdim.max(1))).floor();
    let per_layer = d_model // the block's norm
        + d_model * d_in_proj
        + (d_inner + bc) * f(m.d_conv)
        + d_inner * d_model;
    f(config.n_layer) * per_layer + d_model
}

/// The parameters of the language model `config` describes (a lower bound: biases and the
/// per-head vectors are left out).
fn lm_params(config: &Mamba2LmConfig) -> f64 {
    let multiple = config.pad_vocab_size_multiple.max(1) as f64;
    let vocab = (config.vocab_size as f64 / multiple).ceil() * multiple;
    let embedding = vocab * config.backbone.mixer.d_model as f64;
    let head = if config.tie_embeddings {
        0.0
    } else {
        embedding
    };
    backbone_params(&config.backbone) + embedding + head
}

/// Where a model parameter comes from in a PyTorch-layout checkpoint.
struct Source {
    /// Accepted names, in order of preference.
    names: Vec<String>,
    /// The file holds the transpose (`[out, in]` of a PyTorch `nn.Linear`).
    transpose: bool,
}

/// The checkpoint name of a backbone parameter (path relative to the backbone).
fn backbone_name(path: &str) -> String {
    let name = if let Some(p) = path.strip_suffix(".mixer.a_log") {
        format!("{p}.mixer.A_log")
    } else if let Some(p) = path.strip_suffix(".mixer.d") {
        format!("{p}.mixer.D")
    } else {
        path.to_string()
    };
    format!("backbone.{name}")
}

/// The name and layout of an LM parameter in a PyTorch-format checkpoint: `path` is the
/// parameter's path in [`Mamba2Lm`] (`backbone.layers.0.mixer.a_log`), the result its
/// checkpoint name (`backbone.layers.0.mixer.A_log`) and whether the file stores its transpose
/// (PyTorch `nn.Linear` weights are `[out, in]`, Burn's are `[in, out]`).
pub fn pytorch_name(path: &str, format: CheckpointFormat) -> (String, bool) {
    let transpose = path == "lm_head.weight"
        || path.ends_with(".in_proj.weight")
        || path.ends_with(".out_proj.weight");
    let name = match path {
        "embedding.weight" if format == CheckpointFormat::StateSpaces => {
            EMBEDDING_NAMES[1].to_string()
        }
        "embedding.weight" => EMBEDDING_NAMES[0].to_string(),
        "lm_head.weight" => path.to_string(),
        p => backbone_name(p.strip_prefix("backbone.").unwrap_or(p)),
    };
    (name, transpose)
}

const EMBEDDING_NAMES: [&str; 2] = ["backbone.embeddings.weight", "backbone.embedding.weight"];

/// Converts a checkpoint tensor to the parameter's layout and float type.
fn convert(data: TensorData, transpose: bool, dtype: DType) -> TensorData {
    if !transpose {
        return data.convert_dtype(dtype);
    }
    let shape = data.shape.clone();
    let (rows, cols) = (shape[0], shape[1]);
    let values: Vec<f64> = data.convert::<f64>().to_vec().expect("f64 data");
    let mut out = vec![0.0f64; values.len()];
    for i in 0..rows {
        for j in 0..cols {
            out[j * rows + i] = values[i * cols + j];
        }
    }
    TensorData::new(out, [cols, rows]).convert_dtype(dtype)
}

/// Loads `file` into `model`: every parameter from the name(s) `source` gives, every file
/// tensor used or `ignorable`. Validates everything before touching the model.
fn load_safetensors<B: Backend, M: Module<B>>(
    model: M,
    file: &Path,
    source: impl Fn(&str) -> Source,
    ignorable: impl Fn(&str) -> bool,
) -> Result<M> {
    // the callers have checked that the file exists and fits the model (`check_weights_fit`)
    let mut store = SafetensorsStore::from_file(file);
    let tensors = store
        .get_all_snapshots()
        .map_err(|e| Mamba2Error::file(file, format!("not a readable safetensors file: {e}")))?
        .clone();
    let mut used = BTreeSet::new();
    let mut snapshots = Vec::new();
    for param in model.collect(None, None, false) {
        let path = param.full_path();
        let Source { names, transpose } = source(&path);
        let Some((name, found)) = names
            .iter()
            .find_map(|n| tensors.get(n).map(|t| (n.clone(), t)))
        else {
            return Err(Mamba2Error::MissingTensor {
                file: file.to_path_buf(),
                name: names[0].clone(),
            });
        };
        if !matches!(
            found.dtype,
            DType::F64 | DType::F32 | DType::F16 | DType::BF16
        ) {
            return Err(Mamba2Error::TensorDType {
                file: file.to_path_buf(),
                name,
                dtype: format!("{:?}", found.dtype),
            });
        }
        let mut expected = param.shape.to_vec();
        if transpose {
            expected.reverse();
        }
        if found.shape.to_vec() != expected {
            return Err(Mamba2Error::TensorShape {
                file: file.to_path_buf(),
                name,
                expected,
                actual: found.shape.to_vec(),
            });
        }
        let data_fn = found.clone_data_fn();
        let dtype = param.dtype;
        snapshots.push(TensorSnapshot::from_closure(
            Rc::new(move || data_fn().map(|d| convert(d, transpose, dtype))),
            dtype,
            param.shape.clone(),
            param.path_stack.clone().unwrap_or_default(),
            param.container_stack.clone().unwrap_or_default(),
            param.tensor_id.unwrap_or_default(),
        ));
        used.insert(name);
    }
    if let Some(extra) = tensors.keys().find(|k| !used.contains(*k) && !ignorable(k)) {
        return Err(Mamba2Error::UnexpectedTensor {
            file: file.to_path_buf(),
            name: extra.clone(),
        });
    }
    let expected = snapshots.len();
    let mut model = model;
    let result = model.apply(snapshots, None, None, false);
    if !result.errors.is_empty() || result.applied.len() != expected {
        return Err(Mamba2Error::file(file, format!("loading failed: {result}")));
    }
    Ok(model)
}

/// Loads the language model of a checkpoint folder (`config.json` + `model.safetensors` for
/// the Hugging Face and state-spaces formats, `config.json` + `model.mpk` for this crate's).
pub fn load_lm<B: Backend>(dir: impl AsRef<Path>, device: &B::Device) -> Result<Mamba2Lm<B>> {
    let dir = dir.as_ref();
    let (config, format) = read_config(dir)?;
    let weights = match format {
        CheckpointFormat::Burn => dir.join("model.mpk"),
        _ => dir.join("model.safetensors"),
    };
    check_weights_fit(&weights, lm_params(&config))?;
    let model = config.init::<B>(device)?;
    if format == CheckpointFormat::Burn {
        return load_record(model, &dir.join("model"), device);
    }
    let tied = config.tie_embeddings;
    load_safetensors(
        model,
        &dir.join("model.safetensors"),
        |path| {
            let (name, transpose) = pytorch_name(path, format);
            let names = if path == "embedding.weight" {
                // either spelling; with tied embeddings the head's copy also serves
                let mut names: Vec<String> =
                    EMBEDDING_NAMES.iter().map(|s| s.to_string()).collect();
                if tied {
                    names.push("lm_head.weight".into());
                }
                names
            } else {
                vec![name]
            };
            Source { names, transpose }
        },
        // with tied embeddings, the head and both embedding spellings are the same matrix
        |name| tied && (name == "lm_head.weight" || EMBEDDING_NAMES.contains(&name)),
    )
}

/// Loads only the backbone (blocks and `norm_f`) of a Hugging Face or state-spaces checkpoint
/// folder; the embedding and LM head in the file are skipped.
pub fn load_backbone<B: Backend>(
    dir: impl AsRef<Path>,
    device: &B::Device,
) -> Result<Mamba2Backbone<B>> {
    let dir = dir.as_ref();
    let (config, format) = read_config(dir)?;
    if format == CheckpointFormat::Burn {
        return Ok(load_lm::<B>(dir, device)?.backbone);
    }
    let weights = dir.join("model.safetensors");
    check_weights_fit(&weights, backbone_params(&config.backbone))?;
    let model = config.backbone.init::<B>(device)?;
    load_safetensors(
        model,
        &dir.join("model.safetensors"),
        |path| {
            let (name, transpose) = pytorch_name(&format!("backbone.{path}"), format);
            Source {
                names: vec![name],
                transpose,
            }
        },
        |name| name == "lm_head.weight" || EMBEDDING_NAMES.contains(&name),
    )
}

fn load_record<B: Backend, M: Module<B>>(model: M, path: &Path, device: &B::Device) -> Result<M> {
    let file = path.with_extension("mpk");
    if !file.is_file() {
        return Err(Mamba2Error::file(&file, "no such file"));
    }
    model
        .load_file(path.to_path_buf(), &CheckpointRecorder::default(), device)
        .map_err(|e| Mamba2Error::file(&file, format!("not a readable model record: {e}")))
}

/// Saves `model` and its config to `dir` in this crate's format (`config.json`, `model.mpk`,
/// full precision); [`load_lm`] reads it back.
pub fn save_lm<B: Backend>(
    model: &Mamba2Lm<B>,
    config: &Mamba2LmConfig,
    dir: impl AsRef<Path>,
) -> Result<PathBuf> {
    let dir = dir.as_ref();
    std::fs::create_dir_all(dir).map_err(|e| Mamba2Error::file(dir, e))?;
    save_config(config, &dir.join("config.json"))?;
    let path = dir.join("model");
    save_record(model, &path)?;
    Ok(path.with_extension("mpk"))
}

/// Saves any module of this crate as a full-precision Burn record at `path` (`.mpk` added),
/// atomically: the record is written to a hidden file beside it and renamed into place, so that
/// an interrupted save leaves the previous record intact.
pub fn save_record<B: Backend, M: Module<B>>(module: &M, path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    module
        .clone()
        .save_file(path.to_path_buf(), &CheckpointRecorder::default())
        .map_err(|e| Mamba2Error::file(path.with_extension("mpk"), e))
}

/// Writes `config` as JSON to `file`, atomically (see [`save_record`]).
pub(crate) fn save_config<C: Config>(config: &C, file: &Path) -> Result<()> {
    let text = serde_json::to_string_pretty(config).map_err(|e| Mamba2Error::file(file, e))?;
    crate::recorder::write_atomic(file, text.as_bytes()).map_err(|e| Mamba2Error::file(file, e))
}

/// Loads a record written by [`save_record`] into `module` (built from the same config).
pub fn load_module_record<B: Backend, M: Module<B>>(
    module: M,
    path: impl AsRef<Path>,
    device: &B::Device,
) -> Result<M> {
    load_record(module, path.as_ref(), device)
}
