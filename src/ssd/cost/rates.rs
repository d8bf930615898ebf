//! The rates of a GPU: a data sheet's peaks, or what the scan's launches achieved on one.

use serde::Serialize;

use super::occupancy::calibration_occupancy;

/// The rates of a GPU: a data sheet's peaks ([`Rates::h100`]), or what the scan's launches
/// achieved on one ([`Rates::h200_calibrated`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Rates {
    /// The GPU.
    pub name: &'static str,
    /// Dense tensor-core FLOP/s for the products' operand type.
    pub product_flops: f64,
    /// FLOP/s off tensor cores (`f32`).
    pub other_flops: f64,
    /// Memory bytes per second.
    pub bytes: f64,
    /// Seconds per launch that overlap nothing (submission, a kernel's ramp).
    pub launch: f64,
    /// Seconds per dependent step of a plain kernel's longest thread chain (a global load and
    /// what depends on it); 0 where the chain is not modelled.
    pub chain_step: f64,
    /// The theoretical occupancy of the kernels whose achieved rate off tensor cores
    /// `other_flops` is ([`calibration_occupancy`](crate::ssd::cost::calibration_occupancy)); 0 for a data sheet's
    /// peaks, which do not scale.
    pub occupancy: f64,
}

/// What the scan's launches achieved on an NVIDIA H200, as fractions of its data sheet's
/// rates, fitted to CubeCL's per-launch profile of one 130m layer in bf16 (batch 8 × 2,048,
/// 2026-12-04, `docs/fused-scan.md`, "Cost model"): every launch's estimate then lies within
/// 1.4× of its measured time, and their sum within 1.1× (`tests/ssd_cost.rs` holds 1.5×).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Calibration {
    /// Of the tensor-core peak, for Burn's matmul on the scan's batched products (0.08).
    pub product: f64,
    /// Of the `f32` peak off tensor cores, for the tiled kernels' arithmetic (0.14).
    pub off_tensor_cores: f64,
    /// Of the memory bandwidth (0.5).
    pub bytes: f64,
    /// Seconds a launch costs beyond its work, as the profiler saw it (25 µs).
    pub launch: f64,
    /// Seconds per dependent step of a plain kernel's longest chain (0.55 µs).
    pub chain_step: f64,
}

/// The fit of [`Calibration`] to the H200 profile.
pub const H200_CALIBRATION: Calibration = Calibration {
    product: 0.08,
    off_tensor_cores: 0.14,
    bytes: 0.5,
    launch: 25e-6,
    chain_step: 0.55e-6,
};

impl Rates {
    /// An H100 SXM at its data sheet's dense rates: 989 TFLOP/s in bf16 and f16, 494 in TF32
    /// (the products of `f32` operands), 67 TFLOP/s `f32` off tensor cores, 3.35 TB/s; 4 µs a
    /// launch. A lower bound for the scan's structure, not a prediction.
    pub fn h100(element_bytes: usize) -> Self {
        Self {
            name: "h100",
            product_flops: if element_bytes <= 2 { 989e12 } else { 494e12 },
            other_flops: 67e12,
            bytes: 3.35e12,
            launch: 4e-6,
            chain_step: 0.0,
            occupancy: 0.0,
        }
    }

    /// An H200 at what the scan's launches achieved there ([`H200_CALIBRATION`] of its data
    /// sheet's rates: 989 TFLOP/s bf16 and f16, 494 TF32, 67 TFLOP/s `f32` off tensor cores,
    /// 4.8 TB/s), the rate off tensor cores at the occupancy of the kernels it was fitted on:
    /// the estimate of the code as it is.
    pub fn h200_calibrated(element_bytes: usize) -> Self {
        let c = H200_CALIBRATION;
        Self {
            name: "h200-calibrated",
            product_flops: c.product * if element_bytes <= 2 { 989e12 } else { 494e12 },
            other_flops: c.off_tensor_cores * 67e12,
            bytes: c.bytes * 4.8e12,
            launch: c.launch,
            chain_step: c.chain_step,
            occupancy: calibration_occupancy(),
        }
    }
}
