//! A file recorder that writes atomically: to a hidden temporary file, then renamed into place,
//! so that an interrupted write never leaves a truncated checkpoint behind.

use std::path::PathBuf;

use burn::record::{
    FileRecorder, FullPrecisionSettings, NamedMpkFileRecorder, Recorder, RecorderError,
};
use burn::tensor::backend::Backend;
use serde::{de::DeserializeOwned, Serialize};

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
