//! Allocator set-up and the `--device` choices shared by the examples.

/// mimalloc, tuned for a tensor workload: large temporary buffers are allocated and freed at
/// every operation, so freed memory is kept for reuse rather than purged back to the OS (fresh
/// pages still have to be faulted in and zeroed when the process grows).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

// mimalloc option numbers (`mi_option_e` in mimalloc.h, the version libmimalloc-sys 0.1.49
// builds); libmimalloc-sys names only some of them.
const ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
const ARENA_RESERVE: libmimalloc_sys::mi_option_t = 23;

/// Applies the tuning; call first thing in `main`. An option set in the environment
/// (`MIMALLOC_PURGE_DELAY`, ...) is left as the environment says.
pub fn tune_allocator() {
    // commit arena memory when it is reserved, never purge freed memory, and reserve arenas
    // of 8 GiB of address space (committed only as used)
    let settings = [
        (ARENA_EAGER_COMMIT, "MIMALLOC_ARENA_EAGER_COMMIT", 1),
        (PURGE_DELAY, "MIMALLOC_PURGE_DELAY", -1),
        (ARENA_RESERVE, "MIMALLOC_ARENA_RESERVE", 8 * 1024 * 1024), // KiB
    ];
    for (option, env, value) in settings {
        if std::env::var_os(env).is_none() {
            // SAFETY: mimalloc's option setter only stores the value for later allocations.
            unsafe { libmimalloc_sys::mi_option_set(option, value) };
        }
    }
}

/// The error for a `--device` this build does not have, listing the ones it has.
#[allow(dead_code)]
pub fn unknown_device(name: &str) -> Box<dyn std::error::Error> {
    let mut built = vec!["cpu"];
    if cfg!(feature = "wgpu") {
        built.push("wgpu");
    }
    if cfg!(feature = "cuda") {
        built.push("cuda");
    }
    format!(
        "unknown --device {name:?}: this build has {} (wgpu and cuda come with the cargo \
         features of those names)",
        built.join(", ")
    )
    .into()
}

/// `--step-threads` when given, else the available cores on the cpu and 1 on a GPU (a batch
/// spread over threads helps CPU backends only).
#[allow(dead_code)]
pub fn step_threads(given: Option<usize>, device: &str) -> usize {
    given
        .unwrap_or_else(|| match device {
            "cpu" => std::thread::available_parallelism().map_or(1, |n| n.get()),
            _ => 1,
        })
        .max(1)
}
