//! A file recorder that writes atomically: to a hidden temporary file, then renamed into place,
//! so that an interrupted write never leaves a truncated checkpoint behind.
//!
//! Its conversion of a record (the reads from the device) and the training optimizer's step
//! (`train::Mamba2Optimizer`, feature `train`) exclude each other. Burn's `Learner` saves
//! checkpoints on threads of its own while training goes on,
//! and burn-fusion 0.21 (`Wgpu`, `Cuda`) decides from a tensor's reference count, before its
//! request reaches the device, whether a read or an operation may free the tensor. When the
//! training thread gives up its last reference to a recorded parameter or moment (in the
//! optimizer step) while a checkpointer thread is reading it, the tensor can be freed before the
//! read: "Should have handle for tensor" on the device thread, then a `CallError` in
//! `read_tensor_float` and a `SendError` from the checkpointer (tracel-ai/burn issue 4347).

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use burn::config::Config;
use burn::module::Module;
use burn::record::{BurnRecord, Record};
use burn::record::{
    FileRecorder, FullPrecisionSettings, NamedMpkFileRecorder, Recorder, RecorderError,
};
use burn::tensor::backend::Backend;
use serde::{de::DeserializeOwned, Serialize};

use crate::error::Mamba2Error;

static DEVICE_READS: Mutex<()> = Mutex::new(());

/// Held while a record is read from the device for a checkpoint, and by the optimizer step
/// (see the module documentation).
#[cfg_attr(not(feature = "train"), allow(dead_code))]
pub(crate) fn exclusive_device_reads() -> MutexGuard<'static, ()> {
    DEVICE_READS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Wraps a [`FileRecorder`] so that every save is a write to `.<name>.<ext>` followed by a
/// rename to `<name>.<ext>`. Loading is the inner recorder's.
#[derive(Clone, Debug, Default)]
pub struct AtomicFileRecorder<R>(pub R);

/// The recorder of this crate's checkpoints: named MessagePack, full precision, atomic.
pub type CheckpointRecorder = AtomicFileRecorder<NamedMpkFileRecorder<FullPrecisionSettings>>;

impl<B: Backend, R: FileRecorder<B>> Recorder<B> for AtomicFileRecorder<R> {
    type Settings = R::Settings;
    type RecordArgs = PathBuf;
    type RecordOutput = ();
    type LoadArgs = PathBuf;

    fn record<T: Record<B>>(&self, record: T, file: PathBuf) -> Result<(), RecorderError> {
        let item = {
            let _reads = exclusive_device_reads();
            record.into_item::<Self::Settings>()
        };
        self.save_item(BurnRecord::new::<Self>(item), file)
    }

    fn save_item<I: Serialize>(&self, item: I, file: PathBuf) -> Result<(), RecorderError> {
        let ext = <R as FileRecorder<B>>::file_extension();
        let mut target = file;
        target.set_extension(ext);
        let name = target
            .file_stem()
            .ok_or_else(|| RecorderError::Unknown(format!("no file name in {}", target.display())))?
            .to_string_lossy()
            .to_string();
        // ".name.partial" becomes ".name.<ext>" once the inner recorder sets the extension
        let temporary = target.with_file_name(format!(".{name}.partial"));
        let written = target.with_file_name(format!(".{name}.{ext}"));
        self.0.save_item(item, temporary)?;
        std::fs::rename(&written, &target).map_err(|e| {
            RecorderError::Unknown(format!("cannot move {} into place: {e}", written.display()))
        })
    }

    fn load_item<I: DeserializeOwned>(&self, file: &mut PathBuf) -> Result<I, RecorderError> {
        self.0.load_item(file)
    }
}

impl<B: Backend, R: FileRecorder<B>> FileRecorder<B> for AtomicFileRecorder<R> {
    fn file_extension() -> &'static str {
        R::file_extension()
    }
}

/// Writes `bytes` to `path` atomically: to a hidden temporary file beside it, then renamed into
/// place, so that `path` holds either its old content or the new one, never a part.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("no file name"))?
        .to_string_lossy();
    let temporary = path.with_file_name(format!(".{name}.partial"));
    std::fs::write(&temporary, bytes)?;
    std::fs::rename(&temporary, path)
}

pub(super) fn load_record<B: Backend, M: Module<B>>(
    model: M,
    path: &Path,
    device: &B::Device,
) -> crate::error::Result<M> {
    let file = path.with_extension("mpk");
    if !file.is_file() {
        return Err(Mamba2Error::file(&file, "no such file"));
    }
    model
        .load_file(path.to_path_buf(), &CheckpointRecorder::default(), device)
        .map_err(|e| Mamba2Error::file(&file, format!("not a readable model record: {e}")))
}

/// Saves any module of this crate as a full-precision Burn record at `path` (`.mpk` added),
/// atomically: the record is written to a hidden file beside it and renamed into place, so that
/// an interrupted save leaves the previous record intact.
pub fn save_record<B: Backend, M: Module<B>>(
    module: &M,
    path: impl AsRef<Path>,
) -> crate::error::Result<()> {
    let path = path.as_ref();
    module
        .clone()
        .save_file(path.to_path_buf(), &CheckpointRecorder::default())
        .map_err(|e| Mamba2Error::file(path.with_extension("mpk"), e))
}

/// Writes `config` as JSON to `file`, atomically (see [`save_record`]).
pub(crate) fn save_config<C: Config>(config: &C, file: &Path) -> crate::error::Result<()> {
    let text = serde_json::to_string_pretty(config).map_err(|e| Mamba2Error::file(file, e))?;
    write_atomic(file, text.as_bytes()).map_err(|e| Mamba2Error::file(file, e))
}

/// Loads a record written by [`save_record`] into `module` (built from the same config).
pub fn load_module_record<B: Backend, M: Module<B>>(
    module: M,
    path: impl AsRef<Path>,
    device: &B::Device,
) -> crate::error::Result<M> {
    load_record(module, path.as_ref(), device)
}
