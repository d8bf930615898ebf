//! The crate's error type.

use std::path::{Path, PathBuf};

/// Everything that can go wrong when building, running or loading a Mamba-2 model.
///
/// Every variant names the offending thing (a config field, an input, a tensor, a file), so
/// that the message alone says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum Mamba2Error {
    /// A configuration field has a value the model cannot be built with.
    #[error("invalid config: `{field}` {reason}")]
    InvalidConfig {
        /// The config field (or fields) at fault.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },

    /// A checkpoint's `config.json` describes a model that cannot be built.
    #[error("{file}: invalid config: `{field}` {reason}")]
    ConfigFile {
        /// The config file.
        file: PathBuf,
        /// The config field (or fields) at fault, as this crate's config names it.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },

    /// An input tensor or state has the wrong shape.
    #[error("wrong shape for `{name}`: expected {expected}, got {actual:?}")]
    Shape {
        /// The argument at fault (`x`, `state.conv`, ...).
        name: &'static str,
        /// The expected shape, in the spec's dimension letters (`[b, l, d_model]`).
        expected: String,
        /// The shape that was passed.
        actual: Vec<usize>,
    },

    /// An input has values the model cannot take (token ids outside the vocabulary, ...).
    #[error("invalid `{name}`: {reason}")]
    InvalidInput {
        /// The argument at fault.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },

    /// A checkpoint tensor expected by the model is not in the file.
    #[error("checkpoint {file}: missing tensor `{name}`")]
    MissingTensor {
        /// The checkpoint file.
        file: PathBuf,
        /// The tensor name, as the checkpoint spells it.
        name: String,
    },

    /// The checkpoint holds a tensor that no parameter of the model takes.
    #[error("checkpoint {file}: unexpected tensor `{name}`")]
    UnexpectedTensor {
        /// The checkpoint file.
        file: PathBuf,
        /// The tensor name, as the checkpoint spells it.
        name: String,
    },

    /// A checkpoint tensor has a shape other than the parameter's.
    #[error("checkpoint {file}: tensor `{name}` has shape {actual:?}, expected {expected:?}")]
    TensorShape {
        /// The checkpoint file.
        file: PathBuf,
        /// The tensor name, as the checkpoint spells it.
        name: String,
        /// The shape the model needs (in the checkpoint's layout).
        expected: Vec<usize>,
        /// The shape in the file.
        actual: Vec<usize>,
    },

    /// A checkpoint tensor is not a floating-point tensor.
    #[error("checkpoint {file}: tensor `{name}` has dtype {dtype}, expected a float type")]
    TensorDType {
        /// The checkpoint file.
        file: PathBuf,
        /// The tensor name, as the checkpoint spells it.
        name: String,
        /// The dtype found in the file.
        dtype: String,
    },

    /// Checkpoint tensors contradict each other or their index: a tensor in a shard other than
    /// the one `model.safetensors.index.json` names, or a tied weight (`lm_head.weight`) that
    /// differs from the one it is tied to.
    #[error("checkpoint {file}: tensor `{name}` {reason}")]
    TensorConflict {
        /// The checkpoint file that holds the tensor.
        file: PathBuf,
        /// The tensor name, as the checkpoint spells it.
        name: String,
        /// What it contradicts.
        reason: String,
    },

    /// A checkpoint or config file could not be read or parsed.
    #[error("{file}: {reason}")]
    File {
        /// The file at fault.
        file: PathBuf,
        /// What went wrong.
        reason: String,
    },

    /// Training produced a NaN or infinite loss or gradient; the run stopped before applying it.
    #[error("non-finite loss or gradient at optimizer step {step}; the update was not applied{}", match checkpoint { Some(c) => format!(", last good checkpoint: {}", c.display()), None => String::from(" (no checkpoint was written before it)") })]
    NonFiniteLoss {
        /// The optimizer step (counted from 1 over the whole run).
        step: usize,
        /// The last checkpoint written before that step, if any.
        checkpoint: Option<PathBuf>,
    },

    /// The checkpoint describes a model this crate does not implement.
    #[error("{file}: unsupported model: {reason}")]
    Unsupported {
        /// The config file at fault.
        file: PathBuf,
        /// What is not supported.
        reason: String,
    },
}

impl Mamba2Error {
    /// A [`Mamba2Error::File`]: `file` cannot be read, parsed or written, for `reason`.
    pub fn file(file: impl AsRef<Path>, reason: impl ToString) -> Self {
        Self::File {
            file: file.as_ref().to_path_buf(),
            reason: reason.to_string(),
        }
    }

    /// A [`Mamba2Error::InvalidConfig`]: config field `field` is wrong, for `reason`.
    pub fn config(field: &'static str, reason: impl ToString) -> Self {
        Self::InvalidConfig {
            field,
            reason: reason.to_string(),
        }
    }
}

/// Shorthand for `Result<T, Mamba2Error>`.
pub type Result<T> = std::result::Result<T, Mamba2Error>;

/// Checks the rank-`D` shape `actual` against `expected`, where `None` accepts any size.
pub(crate) fn check_shape(
    name: &'static str,
    actual: &[usize],
    expected: &[Option<usize>],
    letters: &str,
) -> Result<()> {
    let ok = actual.len() == expected.len()
        && actual
            .iter()
            .zip(expected)
            .all(|(a, e)| e.is_none_or(|e| e == *a));
    if ok {
        Ok(())
    } else {
        let dims: Vec<String> = letters
            .split(',')
            .zip(expected)
            .map(|(l, e)| match e {
                Some(v) => format!("{}={v}", l.trim()),
                None => l.trim().to_string(),
            })
            .collect();
        Err(Mamba2Error::Shape {
            name,
            expected: format!("[{}]", dims.join(", ")),
            actual: actual.to_vec(),
        })
    }
}
