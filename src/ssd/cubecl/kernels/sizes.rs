//! The sizes of a scan as the kernels take them.

use cubecl::prelude::*;

/// The sizes of a scan, which every kernel takes (`super::forward::Dims` at launch): batch,
/// length, heads, groups, the head and state dimensions, chunks and chunk length.
#[derive(CubeLaunch, CubeType)]
pub(crate) struct Sizes {
    pub(crate) batch: usize,
    pub(crate) len: usize,
    pub(crate) heads: usize,
    pub(crate) groups: usize,
    pub(crate) dim_p: usize,
    pub(crate) dim_n: usize,
    pub(crate) chunks: usize,
    pub(crate) q: usize,
}
