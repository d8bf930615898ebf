//! Every loader of the crate as one function of an input's bytes, for the coverage-guided fuzz
//! targets (`fuzz/fuzz_targets/`) and for the test that runs their seeds and saved inputs
//! (`tests/fuzz.rs`). Each target writes the input as its file in a folder of its own, beside
//! the fixture files it needs (a config, weights), and reads it with the crate's loader. An
//! input gives a value or a `Mamba2Error` whose message names one of the target's files; a
//! panic, or an error that names none of them, is a finding.
//!
//! Included by path (`#[path]`) from both crates: it uses only `mamba2_burn`, `burn` and the
//! standard library.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use burn::backend::NdArray;

/// What a target reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// `config.json` in any format the crate reads (transformers', state-spaces', this crate's),
    /// with the `tiny` case's weights: read, then loaded.
    ConfigJson,
    /// `model.safetensors` (header and data) with the `tiny` case's config.
    Safetensors,
    /// `pytorch_model.bin` (a `torch.save` zip with its pickle) with the `tiny` case's config.
    PytorchBin,
    /// `model.safetensors.index.json` with the `tiny` case's config, its weights as the one
    /// shard `model-00001-of-00001.safetensors`.
    ShardIndex,
    /// `tokenizer.json`: read, then a text encoded and decoded.
    TokenizerJson,
    /// A time-series CSV file.
    Csv,
    /// A Databento DBN file (plain or zstd), as market data.
    Dbn,
}

impl Target {
    /// Every target with its name (the fuzz target's and its folders' under `fuzz/`).
    pub const ALL: [(&'static str, Target); 7] = [
        ("config_json", Target::ConfigJson),
        ("safetensors", Target::Safetensors),
        ("pytorch_bin", Target::PytorchBin),
        ("shard_index", Target::ShardIndex),
        ("tokenizer_json", Target::TokenizerJson),
        ("csv", Target::Csv),
        ("dbn", Target::Dbn),
    ];

    /// The file the input is written to.
    pub fn file(self) -> &'static str {
        match self {
            Target::ConfigJson => "config.json",
            Target::Safetensors => "model.safetensors",
            Target::PytorchBin => "pytorch_model.bin",
            Target::ShardIndex => "model.safetensors.index.json",
            Target::TokenizerJson => "tokenizer.json",
            Target::Csv => "series.csv",
            Target::Dbn => "market.dbn",
        }
    }

    /// The dependency (a part of its source path) whose panics the crate catches for this
    /// target and returns as errors: the `tokenizers` crate's deserializers `expect` on some
    /// malformed files (`src/tokenizer.rs`). See [`unwind_quietly`].
    pub fn caught(self) -> Option<&'static str> {
        match self {
            Target::TokenizerJson => Some("/tokenizers-"),
            _ => None,
        }
    }

    /// Whether this build has the crate feature the target's loader needs.
    // a `match` of `cfg!` values: without those features it reads like `matches!`
    #[allow(clippy::match_like_matches_macro)]
    pub fn built(self) -> bool {
        match self {
            Target::PytorchBin => cfg!(feature = "pytorch"),
            Target::TokenizerJson => cfg!(feature = "tokenizer"),
            Target::Dbn => cfg!(feature = "dbn"),
            _ => true,
        }
    }
}

/// Lets the panics raised inside `dependency` (a part of their source path: a target's
/// [`Target::caught`]) unwind to the crate's catch without a word, and hands every other panic
/// to the hook installed before: libFuzzer's, which aborts (a finding), or the test harness's.
/// Without it, libFuzzer's hook would abort on a panic the crate catches, and the default
/// hook's backtrace (with `RUST_BACKTRACE` set) would allocate megabytes that the allocation
/// bound counts against the loader. Once per process; the hook is the process's.
pub fn unwind_quietly(dependency: &'static str) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let other = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let caught = info
                .location()
                .is_some_and(|at| at.file().contains(dependency));
            if !caught {
                other(info);
            }
        }));
    });
}

/// The folder a target reads in, with the fixture files it needs.
pub struct Folder {
    target: Target,
    dir: PathBuf,
}

/// The `tiny` reference case (a transformers Mamba-2 LM): its config and weights.
fn tiny(fixtures: &Path) -> PathBuf {
    fixtures.join("reference/tiny")
}

impl Folder {
    /// `dir` (created) prepared for `target`, the fixtures taken from `fixtures` (the crate's
    /// `tests/fixtures`).
    pub fn new(target: Target, fixtures: &Path, dir: &Path) -> Self {
        std::fs::create_dir_all(dir).expect("the target's folder");
        let copy = |from: &str, to: &str| {
            std::fs::copy(tiny(fixtures).join(from), dir.join(to))
                .unwrap_or_else(|e| panic!("fixture {from}: {e}"));
        };
        match target {
            Target::ConfigJson => copy("model.safetensors", "model.safetensors"),
            Target::Safetensors | Target::PytorchBin => copy("config.json", "config.json"),
            Target::ShardIndex => {
                copy("config.json", "config.json");
                copy("model.safetensors", "model-00001-of-00001.safetensors");
            }
            Target::TokenizerJson | Target::Csv | Target::Dbn => {}
        }
        Self {
            target,
            dir: dir.to_path_buf(),
        }
    }

    /// The bytes of the folder's files with `input` as the target's file: what a bound on the
    /// loader's allocations is a multiple of.
    pub fn bytes_with(&self, input: &[u8]) -> usize {
        let others: u64 = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name() != self.target.file())
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum();
        others as usize + input.len()
    }

    /// Writes `input` as the target's file and reads it: `Ok` with what was read, or the
    /// loader's error message. Panics where the error names none of the target's files (the
    /// input's, the folder, the fixtures beside it).
    pub fn run(&self, input: &[u8]) -> Result<(), String> {
        let file = self.dir.join(self.target.file());
        std::fs::write(&file, input).expect("the input's file");
        let result = self.load(&file);
        if let Err(message) = &result {
            let dir = self.dir.to_string_lossy();
            let names = [
                self.target.file(),
                dir.as_ref(),
                "config.json",
                ".safetensors",
                "model.mpk",
            ];
            assert!(
                names.iter().any(|name| message.contains(name)),
                "{:?}: the error names none of {names:?}: {message}",
                self.target
            );
        }
        result
    }

    fn load(&self, file: &Path) -> Result<(), String> {
        type B = NdArray<f32>;
        let device = Default::default();
        let text = |e: mamba2_burn::Mamba2Error| e.to_string();
        match self.target {
            Target::ConfigJson => {
                mamba2_burn::checkpoint::read_config(&self.dir).map_err(text)?;
                mamba2_burn::load_lm::<B>(&self.dir, &device).map_err(text)?;
            }
            Target::Safetensors | Target::PytorchBin | Target::ShardIndex => {
                mamba2_burn::load_lm::<B>(&self.dir, &device).map_err(text)?;
            }
            Target::TokenizerJson => {
                #[cfg(feature = "tokenizer")]
                {
                    let tokenizer =
                        mamba2_burn::tokenizer::Tokenizer::from_file(file).map_err(text)?;
                    let ids = tokenizer.encode("Mamba-2 reads a tick.").map_err(text)?;
                    tokenizer.decode(&ids).map_err(text)?;
                }
            }
            Target::Csv => {
                mamba2_burn::data::timeseries::TimeSeries::from_csv(file).map_err(text)?;
            }
            Target::Dbn => {
                #[cfg(feature = "dbn")]
                mamba2_burn::data::market::market_series(&[file.to_path_buf()], 3_600_000_000_000)
                    .map_err(text)?;
            }
        }
        let _ = file;
        Ok(())
    }
}
