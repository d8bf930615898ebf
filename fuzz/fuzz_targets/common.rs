//! What the fuzz targets share: each target's folder, made once per process, and the target
//! itself ([`loader_target!`]).

use std::path::Path;

use crate::loaders::{Folder, Target};

/// The folder `target` reads in: under the system's temporary directory, one per process
/// (libFuzzer's workers are processes), with the fixtures of `tests/fixtures`.
pub fn folder(name: &str, target: Target) -> Folder {
    let dir = std::env::temp_dir().join(format!("mamba2-burn-fuzz-{name}-{}", std::process::id()));
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    Folder::new(target, &fixtures, &dir)
}

/// The fuzz target of one loader: each input written as `$target`'s file in the target's
/// folder and read (`Folder::run`, which panics on an error that names none of its files). A
/// dependency whose panics the crate catches (`Target::caught`) has them unwind to that catch;
/// any other panic aborts, a finding (`loaders::unwind_quietly`).
macro_rules! loader_target {
    ($name:literal, $target:expr) => {
        static FOLDER: std::sync::OnceLock<loaders::Folder> = std::sync::OnceLock::new();

        libfuzzer_sys::fuzz_target!(|data: &[u8]| {
            let folder = FOLDER.get_or_init(|| {
                // here, after libFuzzer has set its panic hook
                if let Some(dependency) = $target.caught() {
                    loaders::unwind_quietly(dependency);
                }
                common::folder($name, $target)
            });
            let _ = folder.run(data);
        });
    };
}
