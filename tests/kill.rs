//! Training that survives a kill at any moment: a short `train_lm` in a child process (this
//! binary again, running the ignored test `kill::child` with `MAMBA2_KILL_DIR` naming its
//! artifacts), killed with SIGKILL at random moments and resumed each time from its last
//! complete checkpoint, ends with the weights of an uninterrupted run, bit for bit; after every
//! kill each model checkpoint on disk loads, and the next run resumes from the last one.
//!
//! `MAMBA2_KILL_SEED` draws other kill moments (default 11); `MAMBA2_KILL_COUNT` kills more
//! often (default 6).

use crate::common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;
use mamba2_burn::checkpoint::load_module_record;
use mamba2_burn::train::{checkpoint_epochs, train_lm, LmTrainingConfig, ProgressMode};
use mamba2_burn::{load_lm, Mamba2Lm};
use rand::{rngs::StdRng, Rng, SeedableRng};

type B = Autodiff<NdArray<f32>>;
type Inner = NdArray<f32>;

/// The environment variable that makes [`child`] train, into the folder it names.
const DIR_VAR: &str = "MAMBA2_KILL_DIR";

/// The run of every process: 4 epochs of the copy task, a checkpoint after each.
fn config() -> LmTrainingConfig {
    common::copy_lm_config(4, 5e-3)
}

/// All float parameters, in visiting order.
struct Flatten(Vec<f32>);

impl ModuleVisitor<Inner> for Flatten {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Inner, D>>) {
        self.0
            .extend(param.val().into_data().to_vec::<f32>().unwrap());
    }
}

/// The final model's weights of the run in `dir`.
fn final_weights(dir: &Path) -> Vec<f32> {
    let model = load_lm::<Inner>(dir.join("model"), &Default::default())
        .unwrap_or_else(|e| panic!("the final model of {}: {e}", dir.display()));
    let mut flat = Flatten(Vec::new());
    model.visit(&mut flat);
    flat.0
}

/// The child: trains into `MAMBA2_KILL_DIR`, resuming where a complete checkpoint is there (what
/// a user's script that restarts a killed run does). Without the variable, nothing.
#[test]
#[ignore = "the child process of training_survives_a_kill_at_any_moment"]
fn child() {
    let Some(dir) = std::env::var_os(DIR_VAR) else {
        return;
    };
    let dir = Path::new(&dir);
    let config = config();
    let resume = !checkpoint_epochs(&dir.join("checkpoint")).is_empty();
    let _rng = common::seeded(config.run.seed);
    train_lm::<B, _, _, _>(
        &config,
        common::copy_data(1, 64),
        common::copy_data(2, 32),
        dir,
        resume,
        ProgressMode::Plain,
        &burn::backend::ndarray::NdArrayDevice::default(),
    )
    .unwrap_or_else(|e| panic!("training in {} (resume: {resume}): {e}", dir.display()));
}

/// This binary running [`child`] into `dir`.
fn spawn(dir: &Path) -> Child {
    Command::new(std::env::current_exe().expect("the test binary"))
        .args(["kill::child", "--exact", "--ignored", "--test-threads=1"])
        .env(DIR_VAR, dir)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("a child process")
}

/// Waits for `child` at most `limit`: whether it exited, successfully (it panics otherwise).
fn exited_within(child: &mut Child, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("the child's status") {
            assert!(status.success(), "the child failed: {status}");
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Every model checkpoint in `dir` loads into the run's model.
fn checkpoints_load(dir: &Path) -> usize {
    let epochs = checkpoint_epochs(&dir.join("checkpoint"));
    for e in &epochs {
        let path = dir.join("checkpoint").join(format!("model-{e}"));
        let model: Mamba2Lm<Inner> = config().model.init(&Default::default()).unwrap();
        load_module_record(model, &path, &Default::default())
            .unwrap_or_else(|err| panic!("checkpoint {} after a kill: {err}", path.display()));
    }
    epochs.len()
}

#[test]
fn training_survives_a_kill_at_any_moment() {
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (seed, kills) = (env("MAMBA2_KILL_SEED", 11), env("MAMBA2_KILL_COUNT", 6));
    let full = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let mut run = spawn(full.path());
    assert!(exited_within(&mut run, Duration::from_secs(600)));
    let whole = start.elapsed();
    let reference = final_weights(full.path());

    // each child killed at a moment drawn from the first half of an uninterrupted run's time
    // (so that some kills land before the first checkpoint, some in later epochs, some in
    // saves), until `kills` kills; then the last one runs to its end
    let mut rng = StdRng::seed_from_u64(seed);
    let cut = tempfile::tempdir().unwrap();
    let mut moments = Vec::new();
    let mut saved = Vec::new();
    loop {
        let mut run = spawn(cut.path());
        if moments.len() as u64 == kills {
            assert!(exited_within(&mut run, Duration::from_secs(600)));
            break;
        }
        let moment = whole.mul_f64(rng.random_range(0.0..0.5));
        if exited_within(&mut run, moment) {
            break;
        }
        run.kill().expect("SIGKILL");
        run.wait().expect("the killed child");
        moments.push(moment.as_millis());
        saved.push(checkpoints_load(cut.path()));
    }
    eprintln!(
        "uninterrupted run {} ms; killed at {moments:?} ms into each run, with {saved:?} \
         complete checkpoints on disk after each kill",
        whole.as_millis()
    );
    assert_eq!(
        final_weights(cut.path()),
        reference,
        "the resumed run ends with other weights"
    );
}
