//! The bounds `dt` is clamped to.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Bounds that `dt` is clamped to after the softplus, in every path (chunked and step).
///
/// The default `(0, ∞)` clamps nothing. In JSON an infinite bound is written `null`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DtLimit {
    /// Lower bound (≥ 0).
    pub min: f64,
    /// Upper bound (may be `f64::INFINITY`).
    pub max: f64,
}

impl DtLimit {
    /// No clamping: `(0, ∞)`.
    pub const NONE: DtLimit = DtLimit {
        min: 0.0,
        max: f64::INFINITY,
    };

    /// Whether the clamp can change a softplus output (which is always > 0).
    pub fn is_active(&self) -> bool {
        self.min > 0.0 || self.max.is_finite()
    }

    /// One `dt` clamped to the bounds (the CPU step's; the tensor path folds the clamp into
    /// the softplus, `activation::softplus_clamped`).
    pub(crate) fn clamp_f32(&self, dt: f32) -> f32 {
        if self.is_active() {
            // a validated limit has min < max (and `clamp` keeps a NaN a NaN)
            dt.clamp(self.min as f32, self.max as f32)
        } else {
            dt
        }
    }
}

impl Default for DtLimit {
    fn default() -> Self {
        Self::NONE
    }
}

impl Serialize for DtLimit {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let max = self.max.is_finite().then_some(self.max);
        (self.min, max).serialize(s)
    }
}

impl<'de> Deserialize<'de> for DtLimit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (min, max) = <(f64, Option<f64>)>::deserialize(d)?;
        Ok(DtLimit {
            min,
            max: max.unwrap_or(f64::INFINITY),
        })
    }
}
