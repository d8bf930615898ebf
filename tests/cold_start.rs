//! The cold start on a CubeCL backend, as a regression guard: the kernels that the first
//! training steps of a small language model compile on Wgpu from empty caches (every one a JIT
//! compilation at a process's start: NVRTC on Cuda), and none after the third step.
//!
//! The steps run in a child process (this binary again, running the ignored test
//! `cold_start::child` with `MAMBA2_COLD_START_CHILD` set): they give CubeCL its configuration
//! (a compilation log and caches in a temporary folder), which a process can do once, before
//! any device client starts, and the suite's other Wgpu tests start clients of their own.
//! Ignored by default as it needs a Vulkan driver; without a GPU, Mesa's lavapipe:
//!
//! ```text
//! cargo test --release --features wgpu --test suite cold_start -- --ignored --nocapture
//! ```

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use burn::backend::{Autodiff, Wgpu};
use burn::optim::{AdamWConfig, Optimizer};
use burn::tensor::{Int, Tensor, TensorData};
use burn::train::TrainStep;
use mamba2_burn::cubecl_setup::{kernels_compiled, Applied, CubeclSetup};
use mamba2_burn::train::LmBatch;
use mamba2_burn::{Mamba2BackboneConfig, Mamba2Config, Mamba2Lm, Mamba2LmConfig};

type B = Autodiff<Wgpu<f32, i32>>;

/// The most kernels the model's initialisation and first three training steps may compile:
/// the count measured on lavapipe (docs/performance.md, "Cold start"). A change that adds
/// kernels to a step raises it, with the reason in its commit.
const THREE_STEPS_KERNELS: usize = 160;

/// The steps run: three to the steady state, then three that must compile nothing.
const STEPS: usize = 6;

/// The kernels compiled so far, by name (the log's lines), for the failure message.
fn by_name(log: &Path) -> BTreeMap<String, usize> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut names = BTreeMap::new();
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("[Compiling kernel]") {
            *names.entry(name.trim().to_string()).or_insert(0) += 1;
        }
    }
    names
}

fn batch(device: &burn::backend::wgpu::WgpuDevice) -> LmBatch<B> {
    // 2 rows of 40 tokens: not a multiple of the chunk (16), so the padding runs too
    let (b, l, vocab) = (2, 40, 64);
    let ids: Vec<i64> = (0..b * (l + 1)).map(|i| (i * 7 % vocab) as i64).collect();
    let rows = |offset: usize| -> Vec<i64> {
        (0..b)
            .flat_map(|r| ids[r * (l + 1) + offset..r * (l + 1) + offset + l].to_vec())
            .collect()
    };
    let tensor = |v: Vec<i64>| Tensor::<B, 2, Int>::from_data(TensorData::new(v, [b, l]), device);
    LmBatch {
        inputs: tensor(rows(0)),
        targets: tensor(rows(1)),
        ignore_index: None,
        documents: None,
    }
}

/// The environment variable that makes [`child`] run the steps.
const CHILD_VAR: &str = "MAMBA2_COLD_START_CHILD";

/// Runs [`child`] in a new process of this binary, whose CubeCL nothing has configured yet.
#[test]
#[ignore = "needs a Vulkan driver (lavapipe without a GPU): -- --ignored"]
fn training_compiles_a_bounded_set_of_kernels_and_none_after_the_third_step() {
    let status = Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "cold_start::child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_VAR, "1")
        .status()
        .expect("a child process");
    assert!(status.success(), "the cold-start steps failed: {status}");
}

/// The child: the model's initialisation and six training steps from empty caches, the kernels
/// each compiles counted. Without `MAMBA2_COLD_START_CHILD`, nothing.
#[test]
#[ignore = "the child process of the cold-start guard above"]
fn child() {
    if std::env::var_os(CHILD_VAR).is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary folder");
    let log = dir.path().join("kernels.log");
    let setup = CubeclSetup::from_env()
        .with_cache_dir(Some(dir.path().join("cache")))
        .with_kernel_log(Some(log.clone()));
    assert!(
        matches!(setup.apply(), Applied::Set(_)),
        "CubeCL was configured before the test"
    );

    let device = Default::default();
    let mixer = Mamba2Config::new(64)
        .with_d_state(16)
        .with_headdim(16)
        .with_chunk_size(16);
    let mut model: Mamba2Lm<B> = Mamba2LmConfig::new(Mamba2BackboneConfig::new(2, mixer), 64)
        .init(&device)
        .expect("a valid config");
    let mut optim = AdamWConfig::new().init::<B, Mamba2Lm<B>>();
    let mut step = |model: Mamba2Lm<B>| {
        let output = TrainStep::step(&model, batch(&device));
        let loss = output.item.loss.clone().into_scalar();
        assert!(loss.is_finite(), "loss {loss}");
        optim.step(1e-3, model, output.grads)
    };

    // the model's initialisation and the first step; the second, where AdamW first has
    // moments to update; the third, whose forward follows such an update in the fusion
    // stream (AdamW's operations of a step run with the next step's first ones); then steady
    let mut counts = Vec::new();
    let mut seen = BTreeMap::new();
    for k in 1..=STEPS {
        model = step(model);
        let total = kernels_compiled(&log);
        let names = by_name(&log);
        println!("step {k}: {total} kernels compiled so far");
        for (name, count) in &names {
            let new = count - seen.get(name).copied().unwrap_or(0);
            if new > 0 {
                println!("  {new:3} {name}");
            }
        }
        counts.push(total);
        seen = names;
    }
    assert!(
        counts[0] > 0,
        "no compilation logged: the log is not working"
    );
    assert!(
        counts[2] <= THREE_STEPS_KERNELS,
        "the first three training steps compiled {} kernels, more than the \
         {THREE_STEPS_KERNELS} measured: {seen:?}",
        counts[2]
    );
    for k in 3..STEPS {
        assert_eq!(
            counts[k],
            counts[2],
            "step {} compiled {} kernels: {seen:?}",
            k + 1,
            counts[k] - counts[k - 1]
        );
    }
}
