//! One scan's sizes, the launches of its passes and their totals: what the cost model
//! describes (`cost/mod.rs`).

use serde::Serialize;

use super::rates::Rates;
use crate::ssd::fused::ScanProducts;

/// The sizes of one scan: batch `b`, length `l`, heads `h`, groups `g`, head dimension `p`,
/// state dimension `n`, chunk length `q`, and whether it has an initial state, document
/// starts, the bytes of one element of its products' operands and transient buffers, and how
/// its intra-chunk products are computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ScanShape {
    /// Batch.
    pub b: usize,
    /// Length.
    pub l: usize,
    /// Heads.
    pub h: usize,
    /// Groups of `B` and `C`.
    pub g: usize,
    /// Head dimension.
    pub p: usize,
    /// State dimension.
    pub n: usize,
    /// Chunk length.
    pub q: usize,
    /// Whether the scan starts from a given state.
    pub initial_state: bool,
    /// Whether rows hold several documents (the decays read their starts).
    pub documents: bool,
    /// Bytes per element of the products' operands and the layouts (the model's type: 2 in
    /// `f16` or `bf16`, 4 in `f32`); decays, states, sums and the products' outputs are `f32`.
    pub element_bytes: usize,
    /// How the intra-chunk products are computed.
    pub products: ScanProducts,
}

impl ScanShape {
    /// A scan of `b` rows of `l` steps, `h` heads of dimension `p`, `g` groups of state
    /// dimension `n`, chunks of `q`; no initial state, no documents, `f32`.
    pub fn new(b: usize, l: usize, h: usize, g: usize, p: usize, n: usize, q: usize) -> Self {
        Self {
            b,
            l,
            h,
            g,
            p,
            n,
            q,
            initial_state: false,
            documents: false,
            element_bytes: 4,
            products: ScanProducts::Tiled,
        }
    }

    /// Whether the intra-chunk products go through the matmul.
    pub(super) fn transient(&self) -> bool {
        self.products == ScanProducts::Transient
    }

    /// Whether the tiled kernels' tile products run on tensor cores.
    pub(super) fn tensor_cores(&self) -> bool {
        self.products == ScanProducts::TensorCores
    }

    /// The chunks, `c = ⌈l / q⌉`.
    pub fn c(&self) -> usize {
        self.l.div_ceil(self.q)
    }

    /// Heads per group, `r = h / g`.
    pub fn r(&self) -> usize {
        self.h / self.g
    }
}

/// The forward or the gradient.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pass {
    /// The forward: `y` and the states.
    Forward,
    /// The gradient, which recomputes what it needs of the forward.
    Backward,
}

/// What issues a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LaunchKind {
    /// A matrix product through Burn's matmul.
    Product,
    /// One of the scan's own kernels.
    Kernel,
    /// One of the scan's own tiled kernels (a cube per tile of a chunk's `q × q` or `q × p`
    /// matrices), on the cores that are not tensor cores: its chain is its loop over tiles and
    /// its contractions, as a product's, and is not modelled.
    Tiled,
}

/// One launch and its work.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Launch {
    /// The step it computes, in the code's words.
    pub name: &'static str,
    /// The forward or the gradient.
    pub pass: Pass,
    /// A product or a kernel of the scan.
    pub kind: LaunchKind,
    /// FLOPs on tensor cores (the products' multiply-adds, 2 each).
    pub product_flops: f64,
    /// FLOPs off tensor cores (the kernels' arithmetic, `exp` as one).
    pub other_flops: f64,
    /// Bytes read from memory.
    pub bytes_read: f64,
    /// Bytes written to memory.
    pub bytes_written: f64,
    /// Cubes of the launch's grid.
    pub cubes: usize,
    /// The longest chain of dependent steps one thread runs (a product's: its inner dimension).
    pub serial: usize,
    /// Whether the launch writes a buffer of `b·c·h·q²` elements.
    pub per_head_square: bool,
    /// The theoretical occupancy of the scan's kernel on an sm_90 GPU, from ptxas's figures
    /// (`docs/cuda-kernels.md`, [`occupancy()`](crate::ssd::cost::occupancy())); `None` for the products (cubek's).
    pub occupancy: Option<f64>,
}

impl Launch {
    /// The estimated time on a GPU of `rates`: the fixed cost of a launch plus the largest of
    /// compute time, memory time and, for the scan's plain kernels ([`LaunchKind::Kernel`]),
    /// the time of their longest thread's chain of dependent steps.
    ///
    /// Where the rates were fitted at an occupancy ([`Rates::occupancy`]), a kernel's arithmetic
    /// off tensor cores runs at those rates times its own occupancy over that one: the tiled
    /// kernels are latency-bound (a few warps of long dependent multiply-add chains), so what
    /// they achieve grows with the warps a multiprocessor holds.
    pub fn seconds(&self, rates: &Rates) -> f64 {
        let other_flops = match self.occupancy {
            Some(occupancy) if rates.occupancy > 0.0 => {
                rates.other_flops * occupancy / rates.occupancy
            }
            _ => rates.other_flops,
        };
        let compute = self.product_flops / rates.product_flops + self.other_flops / other_flops;
        let memory = (self.bytes_read + self.bytes_written) / rates.bytes;
        let chain = match self.kind {
            LaunchKind::Kernel => self.serial as f64 * rates.chain_step,
            LaunchKind::Product | LaunchKind::Tiled => 0.0,
        };
        rates.launch + compute.max(memory).max(chain)
    }
}

/// The totals of a list of launches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Totals {
    /// Launches.
    pub launches: usize,
    /// FLOPs on tensor cores.
    pub product_flops: f64,
    /// FLOPs off tensor cores.
    pub other_flops: f64,
    /// Bytes read and written.
    pub bytes: f64,
    /// The estimated time.
    pub seconds: f64,
}

/// The totals of `launches` on a GPU of `rates`.
pub fn totals(launches: &[Launch], rates: &Rates) -> Totals {
    launches.iter().fold(Totals::default(), |t, x| Totals {
        launches: t.launches + 1,
        product_flops: t.product_flops + x.product_flops,
        other_flops: t.other_flops + x.other_flops,
        bytes: t.bytes + x.bytes_read + x.bytes_written,
        seconds: t.seconds + x.seconds(rates),
    })
}

/// The launches of `launches` that carry more than `share` of the FLOPs or of the bytes of all
/// of them.
pub fn heavy(launches: &[Launch], share: f64) -> Vec<&Launch> {
    let all = totals(launches, &Rates::h100(4));
    let flops = all.product_flops + all.other_flops;
    launches
        .iter()
        .filter(|x| {
            (x.product_flops + x.other_flops) > share * flops
                || (x.bytes_read + x.bytes_written) > share * all.bytes
        })
        .collect()
}
