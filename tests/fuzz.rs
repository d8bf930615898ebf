//! Bad input never panics, measured: seeded mutations of valid files (flipped bits, cut and
//! repeated ranges, extreme integers in size fields, number tokens replaced by extremes,
//! non-numbers and wrong types, safetensors headers with wrong dtypes, shapes that do not
//! multiply out, offsets past the end and header lengths of terabytes), each read by the
//! crate's loader. Every input must give a model / config / series or a `Mamba2Error` whose
//! message names the file, never a panic, and no single allocation larger than 64 times the
//! files' size plus 1 MiB (a loader that trusted a declared size would ask for far more).
//!
//! Inputs per target (the first of each is the unmutated file): `config.json` of the three
//! formats 3,000 (read, and loaded with the weights when it reads), `model.safetensors` of the
//! two PyTorch formats 1,500, CSV 3,000. DBN files are fuzzed in `tests/market.rs`.
//!
//! And the coverage-guided fuzzers' inputs (`fuzz/`): every target's seeds and the inputs
//! saved from its runs, through the same target code as the fuzzers, with the same bound.

#[path = "common/loaders.rs"]
mod loaders;
#[path = "common/mutate.rs"]
mod mutate;

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use burn::backend::NdArray;
use mamba2_burn::checkpoint::read_config;
use mamba2_burn::data::timeseries::TimeSeries;
use mamba2_burn::{load_lm, Mamba2BackboneConfig, Mamba2Config, Mamba2LmConfig};
use mutate::{check, mutate_bytes, mutate_number, Tally, INTEGERS};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

type B = NdArray<f32>;

const CONFIG_INPUTS: usize = 3000;
const SAFETENSORS_INPUTS: usize = 1500;
const CSV_INPUTS: usize = 3000;

/// The allocation measurement is process-wide: one target at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn fixture(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/reference")
        .join(case)
}

/// The bound on one allocation while loading `bytes` bytes of files: 64× their size + 1 MiB.
fn bound(bytes: usize) -> usize {
    64 * bytes + (1 << 20)
}

/// This crate's own config format, as `save_lm` writes it.
fn burn_config() -> String {
    let mixer = Mamba2Config::new(32).with_d_state(8).with_headdim(16);
    let config = Mamba2LmConfig::new(Mamba2BackboneConfig::new(2, mixer), 64);
    serde_json::to_string_pretty(&config).unwrap()
}

#[test]
fn mutated_configs_are_read_or_refused_naming_the_file() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let weights = std::fs::read(fixture("tiny").join("model.safetensors")).unwrap();
    std::fs::write(dir.path().join("model.safetensors"), &weights).unwrap();
    let bases = [
        std::fs::read_to_string(fixture("tiny").join("config.json")).unwrap(),
        std::fs::read_to_string(fixture("tied_ss_format").join("config.json")).unwrap(),
        burn_config(),
    ];
    let file = dir.path().join("config.json");
    let mut rng = StdRng::seed_from_u64(17);
    let (mut read, mut loads) = (Tally::default(), Tally::default());
    for i in 0..CONFIG_INPUTS {
        let base = &bases[i % bases.len()];
        let text = match i {
            _ if i < bases.len() => base.as_bytes().to_vec(),
            _ if rng.random_bool(0.5) => mutate_number(&mut rng, base).into_bytes(),
            _ => mutate_bytes(&mut rng, base.as_bytes()),
        };
        std::fs::write(&file, &text).unwrap();
        let config = check(
            &mut read,
            "config.json",
            i,
            &["config.json"],
            bound(text.len()),
            || read_config(dir.path()),
        );
        // a config that reads is loaded with the tiny case's weights: a different model is an
        // error about the weights (or, for the Burn format, the missing record)
        if config.is_some() {
            check(
                &mut loads,
                "config.json (load_lm)",
                i,
                &["model.safetensors", "model.mpk", "config.json"],
                bound(text.len() + weights.len()),
                || load_lm::<B>(dir.path(), &Default::default()),
            );
        }
    }
    println!("config.json: read {read:?}; loaded {loads:?}");
    assert_eq!(read.inputs, CONFIG_INPUTS);
    // the unmutated files read, and the mutations are not all refused or all accepted
    assert!(
        read.accepted >= bases.len() && read.refused > CONFIG_INPUTS / 4,
        "{read:?}"
    );
    assert!(loads.accepted >= 1 && loads.refused >= 1, "{loads:?}");
}

/// A safetensors file with one header field mutated: the header length, a tensor's dtype, its
/// shape or its data offsets.
fn mutate_header(rng: &mut StdRng, file: &[u8]) -> Vec<u8> {
    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let (header, data) = (&file[8..8 + n], &file[8 + n..]);
    let mut prefix = (n as u64).to_le_bytes();
    let mut header: serde_json::Value = serde_json::from_slice(header).unwrap();
    let names: Vec<String> = header
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| *k != "__metadata__")
        .cloned()
        .collect();
    let tensor = &mut header[names.choose(rng).unwrap().as_str()];
    match rng.random_range(0..4) {
        0 => {
            let v = *[n as u64 + 1, n as u64 - 1, 1 << 40, 1 << 50]
                .choose(rng)
                .unwrap();
            prefix = (*[v, *INTEGERS.choose(rng).unwrap()].choose(rng).unwrap()).to_le_bytes();
        }
        1 => {
            let dtypes = [
                "F64", "F16", "BF16", "I64", "I32", "U8", "BOOL", "F8_E4M3", "XYZ",
            ];
            tensor["dtype"] = (*dtypes.choose(rng).unwrap()).into();
        }
        2 => {
            let shape = tensor["shape"].as_array_mut().unwrap();
            match rng.random_range(0..4) {
                0 if !shape.is_empty() => {
                    let k = rng.random_range(0..shape.len());
                    shape[k] = (*INTEGERS.choose(rng).unwrap()).into();
                }
                1 => shape.push(2.into()),
                2 => {
                    shape.pop();
                }
                _ => shape.reverse(),
            }
        }
        _ => {
            let offsets = tensor["data_offsets"].as_array_mut().unwrap();
            let k = rng.random_range(0..2);
            offsets[k] = match rng.random_range(0..3) {
                0 => (*INTEGERS.choose(rng).unwrap()).into(),
                1 => (offsets[k].as_u64().unwrap() + 4).into(),
                _ => (offsets[k].as_u64().unwrap().saturating_sub(4)).into(),
            };
        }
    }
    let header = serde_json::to_vec(&header).unwrap();
    if prefix == (n as u64).to_le_bytes() {
        prefix = (header.len() as u64).to_le_bytes();
    }
    [&prefix[..], &header, data].concat()
}

#[test]
fn mutated_safetensors_load_or_are_refused_naming_the_file() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut rng = StdRng::seed_from_u64(23);
    let mut tally = Tally::default();
    let cases = ["tiny", "tied_ss_format"];
    let dirs: Vec<_> = cases
        .iter()
        .map(|case| {
            let dir = tempfile::tempdir().unwrap();
            let config = std::fs::read(fixture(case).join("config.json")).unwrap();
            std::fs::write(dir.path().join("config.json"), config).unwrap();
            let weights = std::fs::read(fixture(case).join("model.safetensors")).unwrap();
            (dir, weights)
        })
        .collect();
    for i in 0..SAFETENSORS_INPUTS {
        let (dir, base) = &dirs[i % dirs.len()];
        let bytes = match i {
            _ if i < dirs.len() => base.clone(),
            _ if rng.random_bool(0.5) => mutate_header(&mut rng, base),
            _ => mutate_bytes(&mut rng, base),
        };
        let file = dir.path().join("model.safetensors");
        std::fs::write(&file, &bytes).unwrap();
        check(
            &mut tally,
            "model.safetensors",
            i,
            &["model.safetensors"],
            bound(bytes.len()),
            || load_lm::<B>(dir.path(), &Default::default()),
        );
    }
    println!("model.safetensors: {tally:?}");
    assert_eq!(tally.inputs, SAFETENSORS_INPUTS);
    assert!(
        tally.accepted >= cases.len() && tally.refused > SAFETENSORS_INPUTS / 4,
        "{tally:?}"
    );
}

/// A CSV file like the ETT data: a date column, then four numeric columns, 60 rows (the CSV
/// fuzz target's seed, written by `fuzz/src/bin/make_seeds.rs`).
fn csv_text() -> String {
    let seed = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/csv/ett_like.csv");
    std::fs::read_to_string(&seed).unwrap_or_else(|e| panic!("{}: {e}", seed.display()))
}

#[test]
fn mutated_csv_files_read_or_are_refused_naming_the_file() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("series.csv");
    let base = csv_text();
    let mut rng = StdRng::seed_from_u64(29);
    let mut tally = Tally::default();
    for i in 0..CSV_INPUTS {
        let bytes = match i {
            0 => base.clone().into_bytes(),
            _ if rng.random_bool(0.5) => mutate_number(&mut rng, &base).into_bytes(),
            _ => mutate_bytes(&mut rng, base.as_bytes()),
        };
        std::fs::write(&file, &bytes).unwrap();
        if let Some(series) = check(
            &mut tally,
            "CSV",
            i,
            &["series.csv"],
            bound(bytes.len()),
            || TimeSeries::from_csv(&file),
        ) {
            // what reads is whole: every row has every column, every value is finite
            assert!(series
                .values
                .iter()
                .all(|row| row.len() == series.columns.len()));
            assert!(series.values.iter().flatten().all(|v| v.is_finite()));
        }
    }
    println!("CSV: {tally:?}");
    assert_eq!(tally.inputs, CSV_INPUTS);
    assert!(
        tally.accepted >= 1 && tally.refused > CSV_INPUTS / 4,
        "{tally:?}"
    );
}

/// The coverage-guided fuzz targets' seeds (`fuzz/seeds/<target>`) and the inputs saved from
/// their runs (`fuzz/regressions/<target>`: what a fuzzer found, kept after the fix), each
/// through the fuzzers' own target code (`tests/common/loaders.rs`): a value or an error naming
/// the target's files, never a panic, and no allocation above 64× the folder's bytes + 1 MiB
/// (DBN: 256 MiB, as in its mutation test); at least one seed of each target loads. The
/// targets whose loader needs a feature this build lacks are skipped.
#[test]
fn fuzz_seeds_and_saved_inputs_load_or_are_refused() {
    use loaders::{Folder, Target};
    use mutate::largest_allocation;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut counts = Vec::new();
    for (name, target) in Target::ALL {
        if !target.built() {
            continue;
        }
        if let Some(dependency) = target.caught() {
            loaders::unwind_quietly(dependency);
        }
        let work = tempfile::tempdir().unwrap();
        let folder = Folder::new(target, &root.join("tests/fixtures"), work.path());
        let (mut inputs, mut loaded) = (0, 0);
        for kind in ["seeds", "regressions"] {
            let mut files: Vec<PathBuf> =
                std::fs::read_dir(root.join("fuzz").join(kind).join(name))
                    .into_iter()
                    .flatten()
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .collect();
            files.sort();
            for file in files {
                let bytes = std::fs::read(&file).unwrap();
                let limit = match target {
                    Target::Dbn => 256 << 20,
                    _ => bound(folder.bytes_with(&bytes)),
                };
                let (result, largest) =
                    largest_allocation(|| catch_unwind(AssertUnwindSafe(|| folder.run(&bytes))));
                let result = result.unwrap_or_else(|_| panic!("{} panicked", file.display()));
                assert!(
                    largest <= limit,
                    "{}: an allocation of {largest} bytes (at most {limit})",
                    file.display()
                );
                inputs += 1;
                loaded += usize::from(kind == "seeds" && result.is_ok());
            }
        }
        assert!(loaded >= 1, "{name}: no seed loads");
        counts.push((name, inputs));
    }
    println!("fuzz inputs per target: {counts:?}");
    assert!(!counts.is_empty());
}
