//! Writing a hybrid model back as transformers 5.25's `save_pretrained` writes a folder of its
//! family: the `config.json` its config was read from, and `model.safetensors` under the
//! family's names, each tensor in the layout the loader reads ([`source`]'s inverse: linear
//! weights as PyTorch's `[out, in]`, the blocks of a fused tensor joined, stacked experts split
//! into their own tensors).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{backend::Backend, DType, Tensor, TensorData};

use super::super::config::parse_json;
use super::super::export::{file_dtype, write_safetensors, Lazy};
use super::super::record::write_atomic;
use super::super::safetensors::convert;
use super::{config_from_value, source};
use crate::error::{Mamba2Error, Result};
use crate::models::hybrid::{HybridConfig, HybridLm};

/// Writes `model` to `dir` as transformers' `save_pretrained` writes a folder of its family:
/// `config_json` (the text of the `config.json` its config was read from: a folder's, or a
/// preset's fields) as `config.json`, and `model.safetensors` with every parameter under its name
/// in that family's files, in the model's float type (other float types as `f32`). A tied head
/// is not written: transformers stores the embedding once. `config_json` must describe the
/// model (its layer kinds and its parameter count), or nothing is written and the error says
/// what differs. Low-rank adapters ([`HybridLm::with_lora`]) are written folded into their
/// weights. Returns the weights file.
pub fn save_hybrid<B: Backend>(
    model: &HybridLm<B>,
    config_json: &str,
    dir: impl AsRef<Path>,
) -> Result<PathBuf> {
    // low-rank updates are written folded into their weights
    let model = model.lora_folded();
    let model = model.as_ref();
    let dir = dir.as_ref();
    let config_file = dir.join("config.json");
    let (value, writer) = parse_json(config_json, &config_file)?;
    let config = config_from_value(value, &config_file, &writer)?;
    let kinds: Vec<_> = model.layers.iter().map(|l| l.kind()).collect();
    let (ours, theirs) = (model.num_params(), config.param_count());
    if kinds != config.layers || ours as f64 != theirs {
        return Err(Mamba2Error::InvalidInput {
            name: "config_json",
            reason: format!(
                "describes layers {:?} and {theirs} parameters, the model has {kinds:?} and {ours}",
                config.layers
            ),
        });
    }
    std::fs::create_dir_all(dir).map_err(|e| Mamba2Error::file(dir, e))?;
    write_atomic(&config_file, config_json.as_bytes())
        .map_err(|e| Mamba2Error::file(&config_file, e))?;
    let mut named = Named {
        config: &config,
        path: Vec::new(),
        tensors: Vec::new(),
        blocks: BTreeMap::new(),
    };
    model.visit(&mut named);
    let mut tensors = named.tensors;
    for (name, mut blocks) in named.blocks {
        blocks.sort_by_key(|(index, _)| *index);
        tensors.push((name, joined(blocks.into_iter().map(|(_, b)| b).collect())));
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    write_safetensors(dir, tensors)
}

/// Collects every parameter under its name(s) in the family's files.
struct Named<'a> {
    config: &'a HybridConfig,
    path: Vec<String>,
    /// Tensors of their own.
    tensors: Vec<(String, Lazy)>,
    /// The blocks of fused tensors, by name: `(index, block)`.
    blocks: BTreeMap<String, Vec<(usize, Lazy)>>,
}

impl<B: Backend> ModuleVisitor<B> for Named<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let s = source(self.config, &self.path.join("."));
        let tensor = param.val();
        let (st_dtype, out_dtype) = file_dtype(tensor.dtype());
        let dims = tensor.dims().to_vec();
        if !s.stacked.is_empty() {
            // one tensor per item of the first axis
            for (item, name) in s.stacked.into_iter().enumerate() {
                let t = tensor.clone();
                let shape = dims[1..].to_vec();
                let data = Box::new(move || {
                    let d = convert(t.clone().narrow(0, item, 1).into_data(), false, out_dtype);
                    reshaped(d, &shape, out_dtype)
                });
                let lazy = lazy(dims[1..].to_vec(), st_dtype, out_dtype, data);
                self.tensors.push((name, lazy));
            }
            return;
        }
        let mut shape = dims;
        if s.transpose {
            shape.reverse();
        }
        let transpose = s.transpose;
        let data = Box::new(move || convert(tensor.clone().into_data(), transpose, out_dtype));
        let lazy = lazy(shape, st_dtype, out_dtype, data);
        let name = s.names.into_iter().next().expect("a name");
        match s.part {
            Some((index, _)) => self.blocks.entry(name).or_default().push((index, lazy)),
            None => self.tensors.push((name, lazy)),
        }
    }
}

/// A [`Lazy`] of `shape` whose values `data` makes.
fn lazy(
    shape: Vec<usize>,
    dtype: ::safetensors::tensor::Dtype,
    out: DType,
    data: Box<dyn Fn() -> TensorData>,
) -> Lazy {
    let bytes = shape.iter().product::<usize>() * out.size();
    Lazy {
        shape,
        dtype,
        bytes,
        data,
    }
}

/// `data`'s values under another `shape` of the same size.
fn reshaped(data: TensorData, shape: &[usize], dtype: DType) -> TensorData {
    TensorData::from_bytes_vec(data.as_bytes().to_vec(), shape.to_vec(), dtype)
}

/// The blocks stacked along the first axis, in order, as one tensor.
fn joined(blocks: Vec<Lazy>) -> Lazy {
    let mut shape = blocks[0].shape.clone();
    shape[0] = blocks.iter().map(|b| b.shape[0]).sum();
    let (dtype, bytes) = (blocks[0].dtype, blocks.iter().map(|b| b.bytes).sum());
    let out = shape.clone();
    Lazy {
        shape,
        dtype,
        bytes,
        data: Box::new(move || {
            let parts: Vec<TensorData> = blocks.iter().map(|b| (b.data)()).collect();
            let out_dtype = parts[0].dtype;
            let bytes = parts.iter().flat_map(|p| p.as_bytes().to_vec()).collect();
            TensorData::from_bytes_vec(bytes, out.clone(), out_dtype)
        }),
    }
}
