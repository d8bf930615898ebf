//! The fused SSD on CubeCL backends: [`SsdBackend`] for `CubeBackend` (the kernels) and for
//! `Fusion<B>` (a custom operation of the fusion stream that runs `B`'s kernels).

mod fusion;

use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use crate::SsdBackend;

impl<R, F, I, BT> SsdBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
}
