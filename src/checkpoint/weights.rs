//! The tensors of a checkpoint folder in the layouts Mamba-2 checkpoints are published in: one
//! `model.safetensors`, shards listed by `model.safetensors.index.json` (larger Hugging Face
//! checkpoints), or `pytorch_model.bin` (a `torch.save` of the state dict: the state-spaces
//! checkpoints; with the `pytorch` feature).
//!
//! The files are found and sized first ([`WeightFiles::find`], so that a config declaring a
//! huge model next to small files is refused before anything is allocated), then read
//! ([`WeightFiles::read`]): every tensor with the file that holds it, each of them read only
//! when the model takes it.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use ::safetensors::tensor::{Dtype, Metadata};
use burn::module::ParamId;
use burn::store::TensorSnapshot;
use burn::tensor::DType;

use super::region::Region;
use crate::error::{Mamba2Error, Result};

/// The single-file safetensors name.
const SINGLE: &str = "model.safetensors";
/// The index of a sharded safetensors checkpoint.
const INDEX: &str = "model.safetensors.index.json";
/// PyTorch's pickled state dict.
const PYTORCH: &str = "pytorch_model.bin";

/// The weight files of a checkpoint folder, found but not yet read.
#[derive(Debug)]
pub(super) enum WeightFiles {
    /// `model.safetensors`.
    Single(PathBuf),
    /// The index and, per shard file, the tensor names the index puts there.
    Sharded {
        /// `model.safetensors.index.json`.
        index: PathBuf,
        /// Shard path → the names the index lists in it.
        shards: BTreeMap<PathBuf, Vec<String>>,
    },
    /// `pytorch_model.bin`.
    Pytorch(PathBuf),
}

/// A checkpoint tensor and the file that holds it.
pub(super) struct Located {
    /// The tensor, read when its data is asked for.
    pub(super) snapshot: TensorSnapshot,
    /// The file it is in (the shard, for a sharded checkpoint).
    pub(super) file: PathBuf,
    /// Where its data lies in `file`, for a safetensors file: a parameter is then read from it
    /// in pieces ([`Region::read`]).
    pub(super) region: Option<Region>,
}

/// Every tensor of a checkpoint by its name.
pub(super) type Tensors = BTreeMap<String, Located>;

impl WeightFiles {
    /// The weight files of `dir`, in the order transformers looks for them: `model.safetensors`,
    /// then the shards' index, then `pytorch_model.bin`. Checks that every shard the index
    /// names exists in `dir`.
    pub(super) fn find(dir: &Path) -> Result<Self> {
        let single = dir.join(SINGLE);
        if single.is_file() {
            return Ok(Self::Single(single));
        }
        let index = dir.join(INDEX);
        if index.is_file() {
            return read_index(dir, index);
        }
        let pytorch = dir.join(PYTORCH);
        if pytorch.is_file() {
            return Ok(Self::Pytorch(pytorch));
        }
        Err(Mamba2Error::file(
            dir,
            format!("no weights: none of {SINGLE}, {INDEX} or {PYTORCH}"),
        ))
    }

    /// The file that names the whole set in errors: the single file, the index, the `.bin`.
    pub(super) fn path(&self) -> &Path {
        match self {
            Self::Single(p) | Self::Pytorch(p) => p,
            Self::Sharded { index, .. } => index,
        }
    }

    /// The weight files' total size in bytes.
    pub(super) fn bytes(&self) -> Result<u64> {
        match self {
            Self::Single(p) | Self::Pytorch(p) => file_size(p),
            Self::Sharded { shards, .. } => shards.keys().map(|p| file_size(p)).sum(),
        }
    }

    /// Every tensor of the checkpoint, each with its file. A sharded checkpoint must hold each
    /// tensor in the shard its index names and nowhere else, and no tensor the index leaves
    /// out.
    pub(super) fn read(&self) -> Result<Tensors> {
        match self {
            Self::Single(file) => read_safetensors(file),
            Self::Pytorch(file) => read_pytorch(file).map(|t| located(t, file)),
            Self::Sharded { shards, .. } => {
                let mut tensors = Tensors::new();
                // the shard each name belongs in
                let home: BTreeMap<&str, &PathBuf> = shards
                    .iter()
                    .flat_map(|(file, names)| names.iter().map(move |n| (n.as_str(), file)))
                    .collect();
                for (file, names) in shards {
                    let found = read_safetensors(file)?;
                    for name in names {
                        if !found.contains_key(name) {
                            return Err(Mamba2Error::MissingTensor {
                                file: file.clone(),
                                name: name.clone(),
                            });
                        }
                    }
                    for (name, located) in found {
                        match home.get(name.as_str()) {
                            Some(&listed) if listed == file => {}
                            Some(listed) => {
                                return Err(Mamba2Error::TensorConflict {
                                    file: file.clone(),
                                    name,
                                    reason: format!(
                                        "is in this shard, but {INDEX} puts it in {}",
                                        listed.display()
                                    ),
                                });
                            }
                            None => {
                                return Err(Mamba2Error::TensorConflict {
                                    file: file.clone(),
                                    name,
                                    reason: format!("is in this shard but not in {INDEX}"),
                                });
                            }
                        }
                        tensors.insert(name, located);
                    }
                }
                Ok(tensors)
            }
        }
    }
}

/// The size of `file` in bytes; an error naming it if it is not there.
pub(super) fn file_size(file: &Path) -> Result<u64> {
    if !file.is_file() {
        return Err(Mamba2Error::file(file, "no such file"));
    }
    std::fs::metadata(file)
        .map(|m| m.len())
        .map_err(|e| Mamba2Error::file(file, format!("cannot read: {e}")))
}

/// Tensors of one file, with that file.
fn located(tensors: BTreeMap<String, TensorSnapshot>, file: &Path) -> Tensors {
    tensors
        .into_iter()
        .map(|(name, snapshot)| {
            let file = file.to_path_buf();
            let region = None;
            (
                name,
                Located {
                    snapshot,
                    file,
                    region,
                },
            )
        })
        .collect()
}

/// The largest safetensors header read (the format's own limit).
const MAX_HEADER: u64 = 100_000_000;

/// The tensors of one safetensors file: the header now, each tensor's data when the model
/// takes it.
///
/// Written here rather than through burn-store's `SafetensorsStore`, which maps the whole file:
/// every page a load touches then stays in the process's resident memory until the last tensor
/// is dropped, a second copy of the weights. Each tensor is read instead into a buffer of its
/// own element type, which becomes the parameter's storage without a copy (the `safetensors`
/// crate parses and checks the header).
fn read_safetensors(file: &Path) -> Result<Tensors> {
    let bad = |reason: String| {
        Mamba2Error::file(file, format!("not a readable safetensors file: {reason}"))
    };
    let mut handle = File::open(file).map_err(|e| Mamba2Error::file(file, e))?;
    let len = handle
        .metadata()
        .map_err(|e| Mamba2Error::file(file, e))?
        .len();
    let mut prefix = [0u8; 8];
    handle
        .read_exact(&mut prefix)
        .map_err(|_| bad(format!("{len} bytes, shorter than its header")))?;
    let header_len = u64::from_le_bytes(prefix);
    if header_len > MAX_HEADER.min(len - 8) {
        return Err(bad(format!(
            "a header of {header_len} bytes in a file of {len}"
        )));
    }
    let mut header = vec![0u8; header_len as usize];
    handle
        .read_exact(&mut header)
        .map_err(|e| bad(format!("cannot read the header: {e}")))?;
    let metadata: Metadata =
        serde_json::from_slice(&header).map_err(|e| bad(format!("header: {e}")))?;
    let start = 8 + header_len;
    if start + metadata.data_len() as u64 != len {
        return Err(bad(format!(
            "the header describes {} bytes of data, the file holds {}",
            metadata.data_len(),
            len - start
        )));
    }
    let mut tensors = BTreeMap::new();
    for (name, info) in metadata.tensors() {
        let Some(dtype) = burn_dtype(info.dtype) else {
            return Err(Mamba2Error::TensorDType {
                file: file.to_path_buf(),
                name,
                dtype: format!("{:?}", info.dtype),
            });
        };
        let (from, to) = info.data_offsets;
        let region = Region {
            offset: start + from as u64,
            shape: info.shape.clone(),
            dtype,
        };
        if region.shape.iter().product::<usize>() * dtype.size() != to - from {
            return Err(bad(format!(
                "`{name}`: {} bytes for a {dtype:?} tensor of shape {:?}",
                to - from,
                region.shape
            )));
        }
        let (path, whole) = (file.to_path_buf(), region.clone());
        let data_fn = Rc::new(move || whole.read(&path, 0..whole.rows(), false, dtype));
        let snapshot = TensorSnapshot::from_closure(
            data_fn,
            dtype,
            info.shape.clone().into(),
            name.split('.').map(str::to_string).collect(),
            Vec::new(),
            ParamId::new(),
        );
        let file = file.to_path_buf();
        let region = Some(region);
        tensors.insert(
            name,
            Located {
                snapshot,
                file,
                region,
            },
        );
    }
    Ok(tensors)
}

/// The Burn type of a safetensors element type; `None` for those Burn has no tensor of
/// (the 4-, 6- and 8-bit floats, complex numbers).
fn burn_dtype(dtype: Dtype) -> Option<DType> {
    Some(match dtype {
        Dtype::F64 => DType::F64,
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::I64 => DType::I64,
        Dtype::I32 => DType::I32,
        Dtype::I16 => DType::I16,
        Dtype::I8 => DType::I8,
        Dtype::U64 => DType::U64,
        Dtype::U32 => DType::U32,
        Dtype::U16 => DType::U16,
        Dtype::U8 | Dtype::BOOL => DType::U8,
        _ => return None,
    })
}

/// The tensors of a `torch.save` state dict, through burn-store's pickle reader.
#[cfg(feature = "pytorch")]
fn read_pytorch(file: &Path) -> Result<BTreeMap<String, TensorSnapshot>> {
    let reader = burn_store::pytorch::PytorchReader::new(file)
        .map_err(|e| Mamba2Error::file(file, format!("not a readable PyTorch state dict: {e}")))?;
    Ok(reader.into_tensors().into_iter().collect())
}

/// Without the `pytorch` feature a `.bin` checkpoint is an error that says which feature reads
/// it.
#[cfg(not(feature = "pytorch"))]
fn read_pytorch(file: &Path) -> Result<BTreeMap<String, TensorSnapshot>> {
    Err(Mamba2Error::file(
        file,
        "PyTorch state dicts are read with the crate's `pytorch` feature",
    ))
}

/// Reads the index of a sharded checkpoint: `{"weight_map": {name: shard file, ...}}`, every
/// shard a file name inside `dir` that exists.
fn read_index(dir: &Path, index: PathBuf) -> Result<WeightFiles> {
    let text = std::fs::read_to_string(&index).map_err(|e| Mamba2Error::file(&index, e))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Mamba2Error::file(&index, format!("not valid JSON: {e}")))?;
    let Some(map) = value.get("weight_map").and_then(|m| m.as_object()) else {
        return Err(Mamba2Error::file(&index, "no `weight_map` object"));
    };
    let mut shards: BTreeMap<PathBuf, Vec<String>> = BTreeMap::new();
    for (name, shard) in map {
        let Some(shard) = shard.as_str() else {
            return Err(Mamba2Error::file(
                &index,
                format!("`weight_map` entry `{name}` is not a file name"),
            ));
        };
        // a plain file name: the index may not point outside its folder
        let plain = Path::new(shard).file_name().map(|f| f == shard) == Some(true);
        if !plain || shard == ".." {
            return Err(Mamba2Error::file(
                &index,
                format!("`weight_map` entry `{name}` names `{shard}`, not a file in the folder"),
            ));
        }
        let file = dir.join(shard);
        if !file.is_file() {
            return Err(Mamba2Error::file(
                &file,
                format!("no such shard (the index puts `{name}` in it)"),
            ));
        }
        shards.entry(file).or_default().push(name.clone());
    }
    if shards.is_empty() {
        return Err(Mamba2Error::file(&index, "`weight_map` lists no tensor"));
    }
    Ok(WeightFiles::Sharded { index, shards })
}
