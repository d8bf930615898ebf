//! CubeCL's process-wide settings for the GPU backends (Cuda, Wgpu and the other CubeCL
//! runtimes): where compiled kernels and autotune results persist between processes, and how
//! hard Burn's own operations autotune.
//!
//! A CubeCL process compiles every kernel it launches the first time it launches it (NVRTC on
//! Cuda) and autotunes Burn's matrix products by compiling and timing candidates. Out of the
//! box CubeCL keeps no compiled kernel between processes and autotunes at its `balanced`
//! level, so each new process spends its first minutes compiling (`docs/performance.md`, "Cold
//! start"). The crate therefore sets, unless the user configured CubeCL already:
//!
//! - **caches on**, in one directory for all projects (default `~/.cache/mamba2-burn/cubecl`,
//!   the platform's cache directory): the compiled-kernel cache (PTX on Cuda, SPIR-V on Vulkan)
//!   and the autotune results, so that a second process starts warm wherever it runs from;
//! - **autotune at the `minimal` level**: the first candidates by priority only, which on
//!   Cuda are the tensor-core kernels for Burn's large products.
//!
//! The environment decides first:
//! - `MAMBA2_BURN_CUBECL_CACHE=DIR` moves both caches; `=off` leaves them as CubeCL ships them
//!   (no compiled-kernel cache; autotune results under the `target` folder of the project that
//!   runs);
//! - CubeCL's own variables (`CUBECL_AUTOTUNE_LEVEL`, `CUBECL_DEBUG_LOG`, ...) override these
//!   settings;
//! - a `cubecl.toml` or `burn.toml` (section `cubecl`) in the working directory or above it is
//!   the user's whole configuration: the crate then sets nothing.
//!
//! CubeCL reads its configuration once, when the first device client starts, and never again.
//! The crate applies [`CubeclSetup::from_env`] when a model is built ([`Mamba2Config::init`],
//! and so every `init`, loader and training run); a program that makes tensors on the device
//! before it builds a model calls [`setup_cubecl`] (or [`CubeclSetup::apply`]) first.
//!
//! [`Mamba2Config::init`]: crate::Mamba2Config::init

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use cubecl::config::autotune::AutotuneLevel;
use cubecl::config::cache::CacheConfig;
use cubecl::config::compilation::CompilationLogLevel;
use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};

/// The environment variable that moves the crate's CubeCL caches (a directory) or turns them
/// off (`off`).
pub const CACHE_ENV: &str = "MAMBA2_BURN_CUBECL_CACHE";

/// The files in which a user configures CubeCL (read by CubeCL from the working directory or
/// any folder above it); where one exists, the crate sets nothing.
const USER_FILES: [&str; 4] = ["cubecl.toml", "CubeCL.toml", "burn.toml", "Burn.toml"];

/// What the crate sets in CubeCL's configuration ([module docs](self)).
#[derive(Clone, Debug)]
pub struct CubeclSetup {
    /// The directory of the compiled-kernel and autotune caches; `None`: CubeCL's own
    /// defaults (no compiled-kernel cache, autotune results under the running project's
    /// `target` folder).
    pub cache_dir: Option<PathBuf>,
    /// The autotune level of Burn's own operations (`CUBECL_AUTOTUNE_LEVEL` overrides it).
    pub autotune_level: AutotuneLevel,
    /// A file that receives one line per kernel compiled (`[Compiling kernel] NAME`), for
    /// counting a process's compilations; `None`: no log.
    pub kernel_log: Option<PathBuf>,
}

/// What [`CubeclSetup::apply`] did.
#[derive(Clone, Debug)]
pub enum Applied {
    /// CubeCL now runs with these settings (and the `CUBECL_*` variables over them).
    Set(CubeclSetup),
    /// A CubeCL configuration file was found: CubeCL reads it, the crate sets nothing.
    UserFile(PathBuf),
    /// CubeCL had read or been given its configuration already (a device client started, or
    /// another setup ran first): nothing changed.
    AlreadyConfigured,
}

impl CubeclSetup {
    /// The crate's settings, with [`CACHE_ENV`] applied: caches in
    /// [`default_cache_dir`](Self::default_cache_dir) (or where the variable says, or none
    /// with `off`), autotune at the `minimal` level, no kernel log.
    pub fn from_env() -> Self {
        let cache_dir = match std::env::var_os(CACHE_ENV) {
            Some(v) if v == "off" => None,
            Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
            _ => Self::default_cache_dir(),
        };
        Self {
            cache_dir,
            autotune_level: AutotuneLevel::Minimal,
            kernel_log: None,
        }
    }

    /// `mamba2-burn/cubecl` in the platform's cache directory (`$XDG_CACHE_HOME` or
    /// `~/.cache` on Linux); `None` where the platform has none.
    pub fn default_cache_dir() -> Option<PathBuf> {
        dirs::cache_dir().map(|d| d.join("mamba2-burn").join("cubecl"))
    }

    /// These settings with the caches in `dir` (`None`: CubeCL's defaults).
    pub fn with_cache_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.cache_dir = dir;
        self
    }

    /// These settings with autotune at `level`.
    pub fn with_autotune_level(mut self, level: AutotuneLevel) -> Self {
        self.autotune_level = level;
        self
    }

    /// These settings with every kernel compilation logged to `file` (one line each).
    pub fn with_kernel_log(mut self, file: Option<PathBuf>) -> Self {
        self.kernel_log = file;
        self
    }

    /// Gives CubeCL these settings, the `CUBECL_*` environment variables over them, if it has
    /// no configuration yet and the user has no CubeCL configuration file ([`Applied`] says
    /// which). Call it before the first tensor is made on a GPU device.
    pub fn apply(&self) -> Applied {
        let mut state = CubeClRuntimeConfig::storage().lock();
        if state.is_some() {
            return Applied::AlreadyConfigured;
        }
        if let Some(file) = std::env::current_dir().ok().and_then(|dir| user_file(&dir)) {
            return Applied::UserFile(file);
        }
        let mut config = CubeClRuntimeConfig::default();
        if let Some(dir) = &self.cache_dir {
            config.compilation.cache = Some(CacheConfig::File(dir.clone()));
            config.autotune.cache = CacheConfig::File(dir.clone());
        }
        config.autotune.level = self.autotune_level.clone();
        if let Some(file) = &self.kernel_log {
            config.compilation.logger.level = CompilationLogLevel::Basic;
            config.compilation.logger.file = Some(file.clone());
        }
        *state = Some(Arc::new(config.override_from_env()));
        Applied::Set(self.clone())
    }
}

/// Applies [`CubeclSetup::from_env`] once per process and returns what that did (the same on
/// every call).
pub fn setup_cubecl() -> &'static Applied {
    static APPLIED: OnceLock<Applied> = OnceLock::new();
    APPLIED.get_or_init(|| CubeclSetup::from_env().apply())
}

/// The kernels compiled so far by a process whose [`CubeclSetup::kernel_log`] is `log`: its
/// lines `[Compiling kernel] ...`. CubeCL writes the log from a background task, so this
/// waits until the count has held for 200 ms (at most 5 s).
pub fn kernels_compiled(log: &Path) -> usize {
    let count = || {
        std::fs::read_to_string(log).map_or(0, |text| {
            text.lines()
                .filter(|line| line.starts_with("[Compiling kernel]"))
                .count()
        })
    };
    let mut last = count();
    for _ in 0..25 {
        std::thread::sleep(std::time::Duration::from_millis(200));
        let now = count();
        if now == last {
            break;
        }
        last = now;
    }
    last
}

/// The first CubeCL configuration file in `dir` or a folder above it, as CubeCL looks for one.
fn user_file(dir: &Path) -> Option<PathBuf> {
    dir.ancestors()
        .flat_map(|d| USER_FILES.iter().map(move |name| d.join(name)))
        .find(|path| path.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_files_are_found_above_the_working_directory() {
        let root = std::env::temp_dir().join(format!("cubecl-setup-{}", std::process::id()));
        let deep = root.join("a").join("b");
        std::fs::create_dir_all(&deep).unwrap();
        let before = user_file(&deep);
        std::fs::write(root.join("cubecl.toml"), "").unwrap();
        assert_eq!(user_file(&deep), Some(root.join("cubecl.toml")));
        std::fs::remove_dir_all(&root).unwrap();
        // whatever lies above the temporary folder is found without the file too
        assert_eq!(user_file(&deep), before);
    }

    #[test]
    fn the_cache_directory_is_the_crates_own() {
        let dir = CubeclSetup::default_cache_dir().expect("a cache directory on this platform");
        assert!(dir.ends_with("mamba2-burn/cubecl"), "{}", dir.display());
        let setup = CubeclSetup::from_env();
        assert!(matches!(setup.autotune_level, AutotuneLevel::Minimal));
        assert_eq!(setup.kernel_log, None);
    }
}
