//! [`SsdBackend`] for `Fusion<B>`, what `burn::backend::Wgpu` and `Cuda` are.

use burn_fusion::{Fusion, FusionBackend};

use crate::SsdBackend;

impl<B: FusionBackend + SsdBackend> SsdBackend for Fusion<B> {}
