//! PyTorch-layout weights (of the Hugging Face and state-spaces formats, in any of the files
//! [`super::weights`] reads): the names and layouts of each parameter, the size check made
//! before a model is built, and the all-or-nothing load.

use std::collections::BTreeSet;
use std::path::Path;
use std::rc::Rc;

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::store::{ModuleSnapshot, TensorSnapshot, TensorSnapshotError};
use burn::tensor::{
    backend::Backend, bf16, f16, get_device_settings, DType, Element, Shape, Tensor, TensorData,
};

use super::config::CheckpointFormat;
use super::weights::{Located, Tensors};
use crate::error::{Mamba2Error, Result};

/// Checks, before a model is built, that weight files of `len` bytes (`origin`, for the error)
/// are large enough for the parameters that `params` (the config's count) declares at 2 bytes
/// each (f16 / bf16, the smallest float type a checkpoint may hold), so that a config declaring
/// a huge model next to small files is an error and not an allocation of the declared size.
pub(super) fn check_weights_fit(origin: &Path, len: u64, params: f64) -> Result<()> {
    if 2.0 * params > len as f64 {
        return Err(Mamba2Error::file(
            origin,
            format!("{len} bytes cannot hold the {params:.0} parameters that config.json declares"),
        ));
    }
    Ok(())
}

/// Where a model parameter comes from in a PyTorch-layout checkpoint.
pub(super) struct TensorSource {
    /// Accepted names, in order of preference.
    pub(super) names: Vec<String>,
    /// The file holds the transpose (`[out, in]` of a PyTorch `nn.Linear`).
    pub(super) transpose: bool,
    /// The parameter is block `index` of `of` equal blocks stacked along the file tensor's
    /// first axis (a fused projection that the model holds as separate layers); `None`: the
    /// whole tensor.
    pub(super) part: Option<(usize, usize)>,
    /// Where not empty, the parameter is these tensors stacked along a new first axis, in order
    /// (experts that the files hold one by one); `names` then holds the first.
    pub(super) stacked: Vec<String>,
}

impl TensorSource {
    /// The whole tensor `name`.
    pub(super) fn whole(name: String, transpose: bool) -> Self {
        Self {
            names: vec![name],
            transpose,
            part: None,
            stacked: Vec::new(),
        }
    }

    /// The tensors `names`, stacked along a new first axis, as they are in the files (no
    /// transpose).
    pub(super) fn stacked(names: Vec<String>) -> Self {
        Self {
            names: names.first().cloned().into_iter().collect(),
            transpose: false,
            part: None,
            stacked: names,
        }
    }

    /// Block `index` of `of` along the first axis of `name`.
    pub(super) fn part(name: String, index: usize, of: usize, transpose: bool) -> Self {
        Self {
            names: vec![name],
            transpose,
            part: Some((index, of)),
            stacked: Vec::new(),
        }
    }
}

/// Rows `index · n .. (index + 1) · n` of `data`, `n` being a `of`-th of its first axis.
fn block_of(data: TensorData, index: usize, of: usize) -> TensorData {
    let mut shape = data.shape.to_vec();
    let rows = shape[0] / of;
    let row_bytes = data.as_bytes().len() / shape[0].max(1);
    let bytes = data.as_bytes()[index * rows * row_bytes..(index + 1) * rows * row_bytes].to_vec();
    shape[0] = rows;
    TensorData::from_bytes_vec(bytes, shape, data.dtype)
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
/// parameter's path in [`Mamba2Lm`](crate::Mamba2Lm) (`backbone.layers.0.mixer.a_log`), the result its
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

pub(super) const EMBEDDING_NAMES: [&str; 2] =
    ["backbone.embeddings.weight", "backbone.embedding.weight"];

/// The LM head's checkpoint name.
pub(super) const HEAD_NAME: &str = "lm_head.weight";

/// Converts a checkpoint tensor to the parameter's float type and layout: cast first, then
/// transposed in the parameter's own element type, so that no wider copy is ever made.
pub(super) fn convert(data: TensorData, transpose: bool, dtype: DType) -> TensorData {
    let data = data.convert_dtype(dtype);
    if !transpose {
        return data;
    }
    match dtype {
        DType::F64 => transposed::<f64>(data),
        DType::F16 => transposed::<f16>(data),
        DType::BF16 => transposed::<bf16>(data),
        _ => transposed::<f32>(data.convert_dtype(DType::F32)).convert_dtype(dtype),
    }
}

/// The transpose of a matrix.
fn transposed<E: Element>(data: TensorData) -> TensorData {
    let (rows, cols) = (data.shape[0], data.shape[1]);
    let values: Vec<E> = data.into_vec().expect("the element type of its dtype");
    let mut out = Vec::with_capacity(values.len());
    for j in 0..cols {
        out.extend((0..rows).map(|i| values[i * cols + j]));
    }
    TensorData::new(out, [cols, rows])
}

/// A float parameter of a module: where it is, its shape and float type.
struct Slot {
    path: Vec<String>,
    containers: Vec<String>,
    shape: Shape,
    dtype: DType,
    id: ParamId,
}

/// Finds a module's float parameters without reading them, unlike burn-store's collector: a
/// parameter whose initialisation is deferred stays uninitialised, so a model built for
/// loading never holds random weights.
#[derive(Default)]
struct Slots {
    path: Vec<String>,
    containers: Vec<String>,
    found: Vec<Slot>,
}

impl<B: Backend> ModuleVisitor<B> for Slots {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.path.push(name.to_string());
        self.containers.push(container_type.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
        self.containers.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let dtype = if param.is_initialized() {
            param.val().dtype()
        } else {
            // what the deferred initialisation would create
            get_device_settings::<B>(&param.lazy_device())
                .float_dtype
                .into()
        };
        self.found.push(Slot {
            path: self.path.clone(),
            containers: self.containers.clone(),
            shape: param.lazy_shape(),
            dtype,
            id: param.id,
        });
    }
}

/// Loads the checkpoint's `tensors` into `model`: every parameter from the name(s) `source`
/// gives, every checkpoint tensor used or `ignorable`; `origin` names the checkpoint in the
/// errors of a tensor it lacks. Validates everything before touching the model.
pub(super) fn load_tensors<B: Backend, M: Module<B>>(
    model: M,
    tensors: &Tensors,
    origin: &Path,
    source: impl Fn(&str) -> TensorSource,
    ignorable: impl Fn(&str) -> bool,
) -> Result<M> {
    let mut used = BTreeSet::new();
    let mut snapshots = Vec::new();
    let mut slots = Slots::default();
    model.visit(&mut slots);
    for slot in slots.found {
        let path = slot.path.join(".");
        let TensorSource {
            names,
            transpose,
            part,
            stacked,
        } = source(&path);
        let dtype = slot.dtype;
        if !stacked.is_empty() {
            let data = stacked_data(tensors, origin, &stacked, &slot.shape.to_vec(), dtype)?;
            used.extend(stacked);
            snapshots.push(TensorSnapshot::from_closure(
                data,
                dtype,
                slot.shape,
                slot.path,
                slot.containers,
                slot.id,
            ));
            continue;
        }
        let Some((name, located)) = names
            .iter()
            .find_map(|n| tensors.get(n).map(|t| (n.clone(), t)))
        else {
            return Err(Mamba2Error::MissingTensor {
                file: origin.to_path_buf(),
                name: names[0].clone(),
            });
        };
        let (found, file) = (&located.snapshot, &located.file);
        check_float(&name, located)?;
        let mut expected = slot.shape.to_vec();
        if transpose {
            expected.reverse();
        }
        if let Some((_, of)) = part {
            expected[0] *= of;
        }
        if found.shape.to_vec() != expected {
            return Err(Mamba2Error::TensorShape {
                file: file.clone(),
                name,
                expected,
                actual: found.shape.to_vec(),
            });
        }
        let read: DataFn = match &located.region {
            // a safetensors file: read in pieces, straight into the parameter's layout
            Some(region) => {
                let rows = match part {
                    Some((index, of)) => {
                        let n = region.rows() / of;
                        index * n..(index + 1) * n
                    }
                    None => 0..region.rows(),
                };
                let (region, file) = (region.clone(), file.clone());
                Rc::new(move || region.read(&file, rows.clone(), transpose, dtype))
            }
            None => {
                let data_fn = found.clone_data_fn();
                Rc::new(move || {
                    data_fn().map(|d| {
                        let d = match part {
                            Some((index, of)) => block_of(d, index, of),
                            None => d,
                        };
                        convert(d, transpose, dtype)
                    })
                })
            }
        };
        snapshots.push(TensorSnapshot::from_closure(
            read,
            dtype,
            slot.shape,
            slot.path,
            slot.containers,
            slot.id,
        ));
        used.insert(name);
    }
    if let Some((extra, located)) = tensors
        .iter()
        .find(|(k, _)| !used.contains(*k) && !ignorable(k))
    {
        return Err(Mamba2Error::UnexpectedTensor {
            file: located.file.clone(),
            name: extra.clone(),
        });
    }
    let expected = snapshots.len();
    let mut model = model;
    let result = model.apply(snapshots, None, None, false);
    if !result.errors.is_empty() || result.applied.len() != expected {
        return Err(Mamba2Error::file(
            origin,
            format!("loading failed: {result}"),
        ));
    }
    Ok(model)
}

/// How a tensor's data is read when the model asks for it.
type DataFn = Rc<dyn Fn() -> std::result::Result<TensorData, TensorSnapshotError>>;

/// A float tensor (of any width), or an error naming it.
fn check_float(name: &str, located: &Located) -> Result<()> {
    let dtype = located.snapshot.dtype;
    if matches!(dtype, DType::F64 | DType::F32 | DType::F16 | DType::BF16) {
        return Ok(());
    }
    Err(Mamba2Error::TensorDType {
        file: located.file.clone(),
        name: name.to_string(),
        dtype: format!("{dtype:?}"),
    })
}

/// The data of a parameter of `shape` that stacks the tensors `names` along its first axis,
/// each checked (present, float, `shape` without its first axis) before anything is read.
fn stacked_data(
    tensors: &Tensors,
    origin: &Path,
    names: &[String],
    shape: &[usize],
    dtype: DType,
) -> Result<DataFn> {
    let mut parts = Vec::with_capacity(names.len());
    for name in names {
        let located = tensors
            .get(name)
            .ok_or_else(|| Mamba2Error::MissingTensor {
                file: origin.to_path_buf(),
                name: name.clone(),
            })?;
        check_float(name, located)?;
        let found = &located.snapshot;
        if found.shape.to_vec() != shape[1..] || names.len() != shape[0] {
            return Err(Mamba2Error::TensorShape {
                file: located.file.clone(),
                name: name.clone(),
                expected: shape[1..].to_vec(),
                actual: found.shape.to_vec(),
            });
        }
        parts.push(found.clone_data_fn());
    }
    let shape = shape.to_vec();
    Ok(Rc::new(move || {
        let mut bytes = Vec::new();
        for part in &parts {
            bytes.extend_from_slice(convert(part()?, false, dtype).as_bytes());
        }
        Ok(TensorData::from_bytes_vec(bytes, shape.clone(), dtype))
    }))
}

/// With tied embeddings, a checkpoint that stores `lm_head.weight` beside the embedding (as
/// `torch.save` of a tied model does; any of `embedding_names`) must store the same matrix: a
/// head that differs would be dropped silently, so it is an error.
pub(super) fn check_tied_head(tensors: &Tensors, embedding_names: &[&str]) -> Result<()> {
    let Some(head) = tensors.get(HEAD_NAME) else {
        return Ok(());
    };
    let read = |located: &Located, name: &str| {
        located
            .snapshot
            .to_data()
            .map(|d| d.convert::<f32>())
            .map_err(|e| Mamba2Error::file(&located.file, format!("cannot read `{name}`: {e}")))
    };
    let mut head_data = None;
    for &name in embedding_names {
        if let Some(embedding) = tensors.get(name) {
            let same = embedding.snapshot.shape == head.snapshot.shape && {
                if head_data.is_none() {
                    head_data = Some(read(head, HEAD_NAME)?);
                }
                head_data.as_ref().map(|h| h.as_bytes()) == Some(read(embedding, name)?.as_bytes())
            };
            if !same {
                return Err(Mamba2Error::TensorConflict {
                    file: head.file.clone(),
                    name: HEAD_NAME.into(),
                    reason: format!("differs from `{name}`, but config.json ties the embeddings"),
                });
            }
        }
    }
    Ok(())
}
