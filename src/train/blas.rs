//! Thread control of the system OpenBLAS that burn-ndarray's matrix products call with the
//! `blas` feature.

use std::os::raw::c_int;

extern "C" {
    fn openblas_set_num_threads(num_threads: c_int);
    fn openblas_get_num_threads() -> c_int;
}

/// Sets how many threads OpenBLAS uses for each matrix product.
///
/// Where the work is already spread over threads (training steps or forwards split over the
/// batch, see [`parallel_map`](super::parallel_map)), each thread's products should run on one OpenBLAS
/// thread: OpenBLAS's own threads would otherwise compete with them for the same cores.
pub fn set_blas_threads(threads: usize) {
    let threads = threads.clamp(1, c_int::MAX as usize) as c_int;
    // SAFETY: plain setter of OpenBLAS's global thread count, callable at any time.
    unsafe { openblas_set_num_threads(threads) }
}

/// How many threads OpenBLAS uses for each matrix product.
pub fn blas_threads() -> usize {
    // SAFETY: plain getter of OpenBLAS's global thread count.
    unsafe { openblas_get_num_threads() }.max(1) as usize
}
