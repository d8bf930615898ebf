//! Which path the chunked SSD and the projections take: a backend's fused kernels or the tensor
//! operations ([`FusedKernels`], chosen per model in [`Mamba2Config`](crate::Mamba2Config) or
//! per call in [`SsdInput`](super::SsdInput)), and the scoped override that tests use to force
//! one path on models built elsewhere ([`override_fused_kernels`]); on the GPU backends, how
//! the fused kernels compute the intra-chunk products ([`ScanProducts`], per call or by
//! [`override_scan_products`]).

use std::cell::Cell;
use std::thread::LocalKey;

use serde::{Deserialize, Serialize};

/// Where the chunked SSD runs a backend's fused kernels, and the projections theirs.
///
/// Both paths agree to rounding (`f32`: 1e-5 relative in the tests). A model reads it from its
/// config at `init` ([`Mamba2Config::fused_kernels`](crate::Mamba2Config::fused_kernels)); a
/// loaded model changes it with [`Mamba2Backbone::set_fused_kernels`](
/// crate::Mamba2Backbone::set_fused_kernels), before building a graph, not between a forward
/// pass and its backward.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FusedKernels {
    /// The fused kernels where they were measured at least as fast as the tensor operations,
    /// per backend and type (the default): NdArray in `f32` and `f64`, Wgpu in `f32` and
    /// `f16` (measured on Mesa's lavapipe); the tensor operations elsewhere (Cuda and the
    /// other CubeCL runtimes, Wgpu in `bf16`) until a measurement there says otherwise
    /// (`docs/fused-scan.md`, "Default path").
    #[default]
    Measured,
    /// The fused kernels wherever a backend has them (any type and chunk length they take).
    Always,
    /// The tensor operations ([`ssd_chunked_tensor_ops`](super::ssd_chunked_tensor_ops)) and
    /// Burn's `linear` on every backend.
    Never,
}

impl FusedKernels {
    /// For a backend that has fused kernels for an input: whether they run in this mode, given
    /// whether they were `measured` at least as fast as the tensor operations for it.
    pub fn runs(self, measured: bool) -> bool {
        match self {
            FusedKernels::Measured => measured,
            FusedKernels::Always => true,
            FusedKernels::Never => false,
        }
    }

    /// This mode, or the calling thread's [`override_fused_kernels`] while one is held.
    pub(crate) fn in_effect(self) -> Self {
        OVERRIDE.with(Cell::get).unwrap_or(self)
    }
}

/// How the fused kernels of the CubeCL backends (Cuda, Wgpu, ...) compute the decay-weighted
/// intra-chunk products of the scan, each head's `M = (C·Bᵀ) ⊙ L ⊙ dt` times `x` and, in the
/// gradient, `Mᵀ · dy` and `dy · xᵀ`. Every variant computes the same values (to rounding); they
/// differ in speed, per device, and in memory. Other backends ignore it. Until a GPU has
/// measured the variants against each other (`scripts/cuda-check.sh`), the default is the one
/// that keeps no `q × q` matrix in memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ScanProducts {
    /// Tile by tile inside the scan's kernels, the decay applied in shared memory: no per-head
    /// `q × q` matrix reaches memory.
    #[default]
    Tiled,
    /// Each head's `q × q` matrices (`M`; in the gradient `M` without `dt` and `dy · xᵀ`)
    /// written to memory, used and dropped within the call, and the products through the
    /// backend's matmul (tensor cores where the device has them): for a 130m layer at batch
    /// 8 × 2,048 and chunk 256, `M` takes 201 MB in `bf16` and the gradient's `dy · xᵀ` 403 MB
    /// (`f32`).
    Transient,
    /// Tile by tile inside the scan's kernels as [`Tiled`](Self::Tiled), each tile's product
    /// on tensor cores (`cmma` fragments of `16 × 16 × 16`, operands staged in shared memory in
    /// the operand type) where the device has them for the operand type (`f16`, `bf16` on
    /// Cuda); elsewhere (`f32` operands, Vulkan without cooperative matrices) the same staging
    /// with the fragments' products on the ordinary cores, slower than `Tiled`.
    TensorCores,
}

impl ScanProducts {
    /// Every variant.
    pub const ALL: [Self; 3] = [Self::Tiled, Self::Transient, Self::TensorCores];

    /// The variant's name where a command line or a table names it: `tiled`, `transient`,
    /// `tensor-cores`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Tiled => "tiled",
            Self::Transient => "transient",
            Self::TensorCores => "tensor-cores",
        }
    }

    /// The variant [`ScanProducts::name`] names, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// This variant, or the calling thread's [`override_scan_products`] while one is held.
    pub(crate) fn in_effect(self) -> Self {
        PRODUCTS.with(Cell::get).unwrap_or(self)
    }
}

thread_local! {
    static OVERRIDE: Cell<Option<FusedKernels>> = const { Cell::new(None) };
    static PRODUCTS: Cell<Option<ScanProducts>> = const { Cell::new(None) };
}

/// Forces `mode` on every SSD and projection that the calling thread starts until the guard is
/// dropped, whatever the models' and inputs' own modes (for tests that compare both paths on a
/// model built elsewhere, a loaded checkpoint for instance). Guards nest; each restores what
/// it found. Work that a model hands to other threads (`train::Threaded`) keeps the model's
/// own mode.
#[must_use = "the override ends when the guard is dropped"]
pub fn override_fused_kernels(mode: FusedKernels) -> FusedKernelsOverride {
    Override::new(&OVERRIDE, mode)
}

/// Forces `products` on every SSD that the calling thread starts until the guard is dropped,
/// whatever the inputs' own choice (for benchmarks and tests of a model built elsewhere). Guards
/// nest as those of [`override_fused_kernels`] do.
#[must_use = "the override ends when the guard is dropped"]
pub fn override_scan_products(products: ScanProducts) -> ScanProductsOverride {
    Override::new(&PRODUCTS, products)
}

/// The guard of a thread's override of a setting: the override holds while it lives, and its
/// drop restores what the thread had before.
#[derive(Debug)]
pub struct Override<T: Copy + 'static> {
    slot: &'static LocalKey<Cell<Option<T>>>,
    previous: Option<T>,
}

impl<T: Copy + 'static> Override<T> {
    fn new(slot: &'static LocalKey<Cell<Option<T>>>, value: T) -> Self {
        Self {
            slot,
            previous: slot.with(|o| o.replace(Some(value))),
        }
    }
}

impl<T: Copy + 'static> Drop for Override<T> {
    fn drop(&mut self) {
        self.slot.with(|o| o.set(self.previous));
    }
}

/// The guard of [`override_fused_kernels`].
pub type FusedKernelsOverride = Override<FusedKernels>;

/// The guard of [`override_scan_products`].
pub type ScanProductsOverride = Override<ScanProducts>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_nest_and_restore() {
        assert_eq!(FusedKernels::Always.in_effect(), FusedKernels::Always);
        {
            let _outer = override_fused_kernels(FusedKernels::Never);
            assert_eq!(FusedKernels::Always.in_effect(), FusedKernels::Never);
            {
                let _inner = override_fused_kernels(FusedKernels::Measured);
                assert_eq!(FusedKernels::Never.in_effect(), FusedKernels::Measured);
            }
            assert_eq!(FusedKernels::Measured.in_effect(), FusedKernels::Never);
        }
        assert_eq!(FusedKernels::Never.in_effect(), FusedKernels::Never);
        let other = std::thread::spawn(|| {
            let _held = override_fused_kernels(FusedKernels::Never);
        });
        other.join().unwrap();
        assert_eq!(FusedKernels::Always.in_effect(), FusedKernels::Always);
        {
            let _products = override_scan_products(ScanProducts::Transient);
            assert_eq!(ScanProducts::Tiled.in_effect(), ScanProducts::Transient);
            // the settings' overrides are independent
            assert_eq!(FusedKernels::Always.in_effect(), FusedKernels::Always);
        }
        assert_eq!(ScanProducts::Tiled.in_effect(), ScanProducts::Tiled);
    }

    #[test]
    fn modes_decide_from_the_measurement() {
        for measured in [false, true] {
            assert_eq!(FusedKernels::Measured.runs(measured), measured);
            assert!(FusedKernels::Always.runs(measured));
            assert!(!FusedKernels::Never.runs(measured));
        }
    }
}
