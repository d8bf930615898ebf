//! A cost model of the fused CubeCL scan (`ssd::cubecl`): one [`Launch`] per kernel and matrix
//! product that its forward and its gradient issue, in their order, with
//! the work each does, and an estimate of its time on a GPU at stated peak rates
//! ([`Rates`]). It mirrors `ssd/cubecl/forward.rs` and `backward.rs` step by step and changes
//! with them; `bench --mode ssd-cost` prints it, and tests hold its budgets.
//!
//! Lavapipe proves the scan correct but says nothing of a GPU's speed; the model says where the
//! time of a GPU goes: FLOPs on tensor cores (the products) and off them (the kernels), bytes
//! read and written, cubes (how much of the GPU a launch fills) and the longest serial chain of
//! one thread. A launch's time is its fixed cost plus the largest of its compute time, its
//! memory time (the roofline) and, for the plain kernels, its longest chain. At a data sheet's
//! peaks ([`Rates::h100`]) the estimate is a lower bound for this structure; at the rates the
//! launches achieved on an H200 ([`Rates::h200_calibrated`], [`H200_CALIBRATION`]) it is the
//! code's time as measured there, launch by launch within 1.5×.
//!
//! What it assumes, where the code cannot tell it:
//! - bytes: every tensor a launch reads is read once from memory and every one it writes is
//!   written once (caches serve the re-reads, for example a group's scores read by each of its
//!   heads);
//! - products: Burn's matmul in tiles of 64 × 64 of the output per cube, the operands' type on
//!   tensor cores (`f32` as TF32), `f32` outputs but for the per-head parts the tiled kernels
//!   read (`C·S_inᵀ`, `B·G_outᵀ`), in the operand type;
//! - the scan's tiled kernels: a cube of `UNITS × UNITS` threads per `BLOCK × BLOCK` tile of the output
//!   (`4 × 4` elements each), their multiply-adds on the
//!   cores that are not tensor cores (no `cmma` yet);
//! - with the tensor-core tiles ([`ScanProducts::TensorCores`]), the tiled kernels'
//!   multiply-adds run on tensor cores at the products' rate, their other work as before (the
//!   staging in shared memory is not counted);
//! - with the transient products ([`ScanProducts::Transient`]), the intra-chunk products are
//!   products as the others, over the whole `q × q` matrices (the matmul does not skip the
//!   zeros above the diagonal), on each head's matrices written and read once; the tiled
//!   kernels keep their element-wise work.
//!
//! Dimension letters as in [`crate::ssd`].

use serde::Serialize;

use super::fused::ScanProducts;
use super::geometry::{BLOCK, CUBE_SIZE as KERNEL_CUBE, PER, SPAN_WIDTH, TILE};

/// The FLOPs per output element of the decay-weighted tiles of one tile column (`rows` tiles of
/// a chunk, `pairs` tile pairs on and below the diagonal): each weight's segment sum from its
/// own terms on the diagonal tile (a loop over the tile); below it, from the tile's sums per
/// column (`BLOCK + 1` of them, a loop over the tile each, about 2 FLOPs a weight) and the
/// row's carry (an add); then an `exp`, the weight's products and the multiply-adds of the
/// tile.
fn weighted_tiles(rows: usize, pairs: usize) -> usize {
    rows * (2 * BLOCK + 8) + (pairs - rows) * (2 * (BLOCK + 1) / BLOCK + 1 + 8) + pairs * 2 * BLOCK
}
/// The output tile of a product per cube, each side.
const PRODUCT_TILE: usize = 64;

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
    fn transient(&self) -> bool {
        self.products == ScanProducts::Transient
    }

    /// Whether the tiled kernels' tile products run on tensor cores.
    fn tensor_cores(&self) -> bool {
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
}

impl Launch {
    /// The estimated time on a GPU of `rates`: the fixed cost of a launch plus the largest of
    /// compute time, memory time and, for the scan's plain kernels ([`LaunchKind::Kernel`]),
    /// the time of their longest thread's chain of dependent steps.
    pub fn seconds(&self, rates: &Rates) -> f64 {
        let compute =
            self.product_flops / rates.product_flops + self.other_flops / rates.other_flops;
        let memory = (self.bytes_read + self.bytes_written) / rates.bytes;
        let chain = match self.kind {
            LaunchKind::Kernel => self.serial as f64 * rates.chain_step,
            LaunchKind::Product | LaunchKind::Tiled => 0.0,
        };
        rates.launch + compute.max(memory).max(chain)
    }
}

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
        }
    }

    /// An H200 at what the scan's launches achieved there ([`H200_CALIBRATION`] of its data
    /// sheet's rates: 989 TFLOP/s bf16 and f16, 494 TF32, 67 TFLOP/s `f32` off tensor cores,
    /// 4.8 TB/s): the estimate of the code as it is.
    pub fn h200_calibrated(element_bytes: usize) -> Self {
        let c = H200_CALIBRATION;
        Self {
            name: "h200-calibrated",
            product_flops: c.product * if element_bytes <= 2 { 989e12 } else { 494e12 },
            other_flops: c.off_tensor_cores * 67e12,
            bytes: c.bytes * 4.8e12,
            launch: c.launch,
            chain_step: c.chain_step,
        }
    }
}

/// Builds the launches of one pass, with the shape's sizes in scope. Sizes are in bytes:
/// [`Plan::e`] for tensors of the operand type, [`Plan::f`] for those in `f32`.
struct Plan {
    s: ScanShape,
    pass: Pass,
    launches: Vec<Launch>,
}

impl Plan {
    fn new(s: ScanShape, pass: Pass) -> Self {
        Self {
            s,
            pass,
            launches: Vec::new(),
        }
    }

    /// The bytes of `elements` of the operand type.
    fn e(&self, elements: usize) -> usize {
        elements * self.s.element_bytes
    }

    /// The bytes of `elements` in `f32`.
    fn f(&self, elements: usize) -> usize {
        elements * 4
    }

    /// The bytes of a recurrence's second copy of `elements` in the operand type, written only
    /// where that type is not `f32` (`forward::operand_copy`).
    fn operand_copy(&self, elements: usize) -> usize {
        if self.s.element_bytes == 4 {
            0
        } else {
            self.e(elements)
        }
    }

    /// A product of `batch` matrices `[m, k] · [k, n]` of the operand type, written in `f32`.
    fn product(&mut self, name: &'static str, batch: usize, m: usize, n: usize, k: usize) {
        self.product_to(name, batch, m, n, k, 4);
    }

    /// [`Plan::product`] written with `out_bytes` per element.
    fn product_to(
        &mut self,
        name: &'static str,
        batch: usize,
        m: usize,
        n: usize,
        k: usize,
        out_bytes: usize,
    ) {
        let read = self.e(batch * (m * k + k * n));
        self.launches.push(Launch {
            name,
            pass: self.pass,
            kind: LaunchKind::Product,
            product_flops: 2.0 * (batch * m * n * k) as f64,
            other_flops: 0.0,
            bytes_read: read as f64,
            bytes_written: (batch * m * n * out_bytes) as f64,
            cubes: batch * m.div_ceil(PRODUCT_TILE) * n.div_ceil(PRODUCT_TILE),
            serial: k,
            per_head_square: false,
        });
    }

    /// One of the scan's kernels: `threads` threads, `flops` off tensor cores, `read` and
    /// `written` bytes, a chain of `serial` steps per thread.
    #[allow(clippy::too_many_arguments)]
    fn kernel(
        &mut self,
        name: &'static str,
        threads: usize,
        flops: usize,
        read: usize,
        written: usize,
        serial: usize,
        per_head_square: bool,
    ) {
        self.launches.push(Launch {
            name,
            pass: self.pass,
            kind: LaunchKind::Kernel,
            product_flops: 0.0,
            other_flops: flops as f64,
            bytes_read: read as f64,
            bytes_written: written as f64,
            cubes: threads.div_ceil(KERNEL_CUBE),
            serial,
            per_head_square,
        });
    }

    /// One of the scan's tiled kernels or scans: `cubes` cubes, `flops` off tensor
    /// cores, `read` and `written` bytes, a chain of `serial` steps per thread; of `kind`
    /// [`LaunchKind::Tiled`] where it computes products tile by tile (its chain is then its
    /// contractions), [`LaunchKind::Kernel`] otherwise.
    #[allow(clippy::too_many_arguments)]
    fn tiled(
        &mut self,
        name: &'static str,
        kind: LaunchKind,
        cubes: usize,
        flops: usize,
        read: usize,
        written: usize,
        serial: usize,
    ) {
        self.launches.push(Launch {
            name,
            pass: self.pass,
            kind,
            product_flops: 0.0,
            other_flops: flops as f64,
            bytes_read: read as f64,
            bytes_written: written as f64,
            cubes,
            serial,
            per_head_square: false,
        });
    }

    /// The forward's steps 1 to 5, which the gradient recomputes (`forward::recompute`); the
    /// gradient also lays out `dy` in the first launch.
    fn recompute(&mut self) {
        let ScanShape {
            b,
            l,
            h,
            g,
            p,
            n,
            q,
            ..
        } = self.s;
        let (c, r) = (self.s.c(), self.s.r());
        let big_l = c * q;
        let starts = if self.s.documents { b * l } else { 0 };
        // a cube of TILE² threads per (b, chunk, h): dA, its sums in the chunk and the decay to
        // the chunk's end (two scans of log₂ TILE² steps), then the head's columns of the
        // layouts of x·dt·to_end (and in the gradient of dy·exp(cs)) per group, and from the
        // first head of each group B and C, the cube's threads striding over them
        let dy = usize::from(self.pass == Pass::Backward);
        let scan_steps = (TILE * TILE).ilog2() as usize;
        let cubes = b * c * h;
        let chain = 2 * scan_steps + (q * p).div_ceil(TILE * TILE) + (q * n).div_ceil(TILE * TILE);
        self.tiled(
            "chunk_prep",
            LaunchKind::Kernel,
            cubes,
            cubes * TILE * TILE * (2 * scan_steps + 6) + (2 + 2 * dy) * b * big_l * h * p,
            self.f(b * l * h + h + starts) + self.e((1 + dy) * b * l * h * p + 2 * b * l * g * n),
            self.f(3 * b * h * big_l)
                + self.e((1 + dy) * b * big_l * h * p + 2 * b * big_l * g * n),
            chain,
        );
        self.product("C·Bᵀ", b * c * g, q, q, n);
        // with dy, the entering states' gradients (dy·exp(cs))ᵀ·C in the same product, the
        // layouts stacked
        if self.pass == Pass::Backward {
            self.product(
                "chunk states (x·dt·to_end)ᵀ·B and (dy·exp(cs))ᵀ·C",
                2 * b * c * g,
                r * p,
                n,
                q,
            );
        } else {
            self.product("chunk states (x·dt·to_end)ᵀ·B", b * c * g, r * p, n, q);
        }
        let initial = if self.s.initial_state {
            b * h * p * n
        } else {
            0
        };
        let states = b * (c + 1) * h * p * n;
        // the states in f32 (and in the forward, of a half operand type: the operand of
        // C·S_inᵀ), and the final state alone
        let copy = if self.pass == Pass::Forward {
            self.operand_copy(states)
        } else {
            0
        };
        self.kernel(
            "pass_states",
            b * h * p * n,
            3 * b * c * h * p * n,
            self.f(b * c * h * p * n + b * h * c + initial),
            self.f(states + b * h * p * n) + copy,
            c,
            false,
        );
    }

    /// `stack` per-head parts `[q, n] · [n, r·p]` per group that a tiled kernel reads once,
    /// written in the operand type: `C·S_inᵀ`, `B·G_outᵀ`.
    fn head_parts(&mut self, name: &'static str, stack: usize) {
        let (b, g, p, n, q) = (self.s.b, self.s.g, self.s.p, self.s.n, self.s.q);
        let (c, r) = (self.s.c(), self.s.r());
        let bytes = self.s.element_bytes;
        self.product_to(name, stack * b * c * g, q, r * p, n, bytes);
    }

    /// With [`ScanProducts::TensorCores`], the multiply-adds `mads` of the tiled kernel `name`
    /// (the last launch of that name) as FLOPs on tensor cores, not off them.
    fn on_tensor_cores(&mut self, name: &str, mads: usize) {
        if !self.s.tensor_cores() {
            return;
        }
        if let Some(x) = self.launches.iter_mut().rev().find(|x| x.name == name) {
            x.other_flops -= mads as f64;
            x.product_flops += mads as f64;
        }
    }

    /// The transient products' per-head matrix `M` `[b, c, h, q, q]` in the operand type
    /// ([`ScanProducts::Transient`]): a cube per tile pair of each `(b, j, h)`, the weights of
    /// the tiles on and below the diagonal (those above write zeros).
    fn intra_weights(&mut self) {
        let (b, h, g, q, l) = (self.s.b, self.s.h, self.s.g, self.s.q, self.s.l);
        let c = self.s.c();
        let rows = q.div_ceil(BLOCK);
        let pairs = rows * (rows + 1) / 2;
        let tile = BLOCK * BLOCK;
        // the weights of weighted_tiles without the tile's multiply-adds
        let flops = b * c * h * tile * (weighted_tiles(rows, pairs) - pairs * 2 * BLOCK);
        let square = b * c * h * q * q;
        self.launches.push(Launch {
            name: "intra_weights",
            pass: self.pass,
            kind: LaunchKind::Tiled,
            product_flops: 0.0,
            other_flops: flops as f64,
            bytes_read: self.f(b * c * g * q * q + b * h * c * q + b * l * h) as f64,
            bytes_written: self.e(square) as f64,
            cubes: b * c * h * rows * rows,
            serial: 2 * BLOCK + PER * PER,
            per_head_square: true,
        });
    }

    /// A tensor `[b, l, h, p]` of the operand type in the chunk layout `[b, c, h, q, p]`.
    fn chunk_rows(&mut self, name: &'static str) {
        let (b, l, h, p, q) = (self.s.b, self.s.l, self.s.h, self.s.p, self.s.q);
        let big = b * self.s.c() * h * q * p;
        self.kernel(name, big, 0, self.e(b * l * h * p), self.e(big), 1, false);
    }

    /// A per-head product over the chunk, `[q, k] · [k, n]` per `(b, j, h)`, of the transient
    /// products, written in `f32`; `square` where it writes `b·c·h·q²` elements.
    fn head_product(&mut self, name: &'static str, n: usize, k: usize, square: bool) {
        let (b, h, q) = (self.s.b, self.s.h, self.s.q);
        self.product(name, b * self.s.c() * h, q, n, k);
        if let Some(last) = self.launches.last_mut() {
            last.per_head_square = square;
        }
    }
}

/// The launches of the fused scan's forward (`ssd/cubecl/forward.rs`), in order.
pub fn forward_launches(s: ScanShape) -> Vec<Launch> {
    let mut plan = Plan::new(s, Pass::Forward);
    let ScanShape {
        b, l, h, g, p, q, ..
    } = s;
    let c = s.c();
    plan.recompute();
    plan.head_parts("C·S_inᵀ", 1);
    let (rows, cols) = (q.div_ceil(BLOCK), p.div_ceil(BLOCK));
    let cubes = b * c * h * rows * cols;
    let tile = BLOCK * BLOCK;
    if s.transient() {
        // M per head, x in the chunk layout, M·x through the matmul; then a cube per tile of
        // (i, p) adds the entering state's part (an exp, a multiply-add)
        plan.intra_weights();
        plan.chunk_rows("chunk_rows x");
        plan.head_product("M·x", p, q, false);
        plan.tiled(
            "chunk_scan",
            LaunchKind::Tiled,
            cubes,
            cubes * tile * 3,
            plan.e(b * c * h * q * p) + plan.f(b * c * h * q * p + b * h * c * q),
            plan.e(b * l * h * p),
            PER * PER,
        );
        return plan.launches;
    }
    // the output, a cube per tile of (i, p) of each (b, j, h): the weights and the intra-chunk
    // product of each tile of s up to the diagonal, then the entering state's part added
    let pairs = rows * (rows + 1) / 2;
    // per tile column of (b, j, h): the tile pairs on and below the diagonal (a weight: its
    // segment's terms within the tile, an exp, two products; then the multiply-adds), and the
    // entering state's part (an exp, a multiply-add)
    let columns = b * c * h * cols;
    let flops = columns * tile * (weighted_tiles(rows, pairs) + 3 * rows);
    plan.tiled(
        "chunk_scan",
        LaunchKind::Tiled,
        cubes,
        flops,
        plan.e(2 * b * l * h * p) + plan.f(b * l * h + b * c * g * q * q + 2 * b * h * c * q),
        plan.e(b * l * h * p),
        rows * 2 * BLOCK,
    );
    plan.on_tensor_cores("chunk_scan", columns * tile * pairs * 2 * BLOCK);
    plan.launches
}

/// The multiply-adds' FLOPs of [`forward_launches`]' `chunk_scan`: the intra-chunk product
/// `M·x` over the tiles on and below the diagonal, at the tiles' sizes.
pub fn chunk_scan_product_flops(s: ScanShape) -> f64 {
    let (rows, cols) = (s.q.div_ceil(BLOCK), s.p.div_ceil(BLOCK));
    let columns = s.b * s.c() * s.h * cols;
    let pairs = rows * (rows + 1) / 2;
    (columns * pairs * 2 * BLOCK * BLOCK * BLOCK) as f64
}

/// The launches of the fused scan's gradient (`ssd/cubecl/backward.rs`), in order.
pub fn backward_launches(s: ScanShape) -> Vec<Launch> {
    let mut plan = Plan::new(s, Pass::Backward);
    let ScanShape {
        b,
        l,
        h,
        g,
        p,
        n,
        q,
        ..
    } = s;
    let (c, r) = (s.c(), s.r());
    let big_l = c * q;
    let states = b * (c + 1) * h * p * n;
    plan.recompute();
    // the adjoints in f32, and the products' operands G_out and S_in
    plan.kernel(
        "pass_adjoints",
        b * h * p * n,
        3 * b * c * h * p * n,
        plan.f(2 * b * c * h * p * n + b * h * p * n + b * h * c),
        plan.f(states + b * h * p * n) + plan.e(2 * b * c * h * p * n),
        c,
        false,
    );
    plan.head_parts("[B; C]·[G_out; S_in]ᵀ", 2);
    let (rows, cols) = (q.div_ceil(BLOCK), p.div_ceil(BLOCK));
    let tile = BLOCK * BLOCK;
    let pairs = rows * (rows + 1) / 2;
    let cubes = b * c * h * rows * cols;
    if s.transient() {
        // M without dt per head, dy and x in the chunk layout, Mᵀ·dy and dy·xᵀ through the
        // matmul
        plan.intra_weights();
        plan.chunk_rows("chunk_rows dy");
        plan.chunk_rows("chunk_rows x");
        plan.head_product("Mᵀ·dy", p, q, false);
        plan.head_product("dy·xᵀ", q, p, true);
        // dx and the terms as in the other variant, Mᵀ·dy read
        plan.tiled(
            "chunk_scan_grads",
            LaunchKind::Tiled,
            cubes,
            cubes * tile * 12 + 2 * b * c * h * p * n,
            plan.e(4 * b * l * h * p)
                + plan.f(b * l * h + b * c * h * q * p + 3 * b * h * big_l + 2 * b * c * h * p * n),
            plan.e(b * l * h * p) + plan.f(3 * b * h * big_l * cols + b * c * h * cols),
            (BLOCK * n).div_ceil(KERNEL_CUBE) + KERNEL_CUBE,
        );
        // the scores' gradient and the pairs' sums as in the other variant, dy·xᵀ read
        let flops = b
            * c
            * g
            * r
            * tile
            * (weighted_tiles(rows, pairs) - pairs * 2 * BLOCK
                + (pairs - rows) * 2 * (BLOCK + 1) / BLOCK
                + rows * 2 * BLOCK
                + (pairs - rows) * 4);
        plan.tiled(
            "score_grads",
            LaunchKind::Tiled,
            b * c * g * rows * rows,
            flops,
            plan.f(b * c * h * q * q + b * l * h + b * c * g * q * q + b * h * big_l),
            plan.e(b * c * g * q * q) + plan.f(b * c * h * pairs * SPAN_WIDTH),
            r * 3 * BLOCK,
        );
    } else {
        // dx and the log-decays' terms per position, a cube per tile of (s, p) of each (b, j, h):
        // the weights and Mᵀ·dy over the tiles of i from the diagonal on, then with the per-head
        // parts the terms, summed over each tile's columns; the cubes of the first tile of s also
        // sum ⟨G_out, S_in⟩ over their rows of p
        let columns = b * c * h * cols;
        let flops = columns * tile * weighted_tiles(rows, pairs)
            + cubes * tile * 12
            + 2 * b * c * h * p * n;
        plan.tiled(
            "chunk_scan_grads",
            LaunchKind::Tiled,
            cubes,
            flops,
            plan.e(4 * b * l * h * p)
                + plan.f(b * l * h + b * c * g * q * q + 3 * b * h * big_l + 2 * b * c * h * p * n),
            plan.e(b * l * h * p) + plan.f(3 * b * h * big_l * cols + b * c * h * cols),
            rows * 2 * BLOCK + (BLOCK * n).div_ceil(KERNEL_CUBE) + KERNEL_CUBE,
        );
        plan.on_tensor_cores("chunk_scan_grads", columns * tile * pairs * 2 * BLOCK);
        // the scores' gradient and the pairs within each chunk, a cube per tile pair of each
        // (b, j, g) (those above the diagonal write zeros), looping over the group's heads: dy·xᵀ
        // over the tiles of p, the weights, the pairs' sums
        // per head: dy·xᵀ over the tiles of p and the weights of every tile pair (below the
        // diagonal also each row's terms of its tile up to i, one sum per row as for the columns),
        // the pairs' sums (a loop over the tile per element on the diagonal, sums of rows and
        // columns below)
        let flops = b
            * c
            * g
            * r
            * tile
            * (pairs * 2 * BLOCK * cols + weighted_tiles(rows, pairs) - pairs * 2 * BLOCK
                + (pairs - rows) * 2 * (BLOCK + 1) / BLOCK
                + rows * 2 * BLOCK
                + (pairs - rows) * 4);
        plan.tiled(
            "score_grads",
            LaunchKind::Tiled,
            b * c * g * rows * rows,
            flops,
            plan.e(2 * b * l * h * p) + plan.f(b * l * h + b * c * g * q * q + b * h * big_l),
            plan.e(b * c * g * q * q) + plan.f(b * c * h * pairs * SPAN_WIDTH),
            r * (cols * BLOCK + 3 * BLOCK),
        );
        plan.on_tensor_cores(
            "score_grads",
            b * c * g * r * tile * pairs * 2 * BLOCK * cols,
        );
    }
    plan.product(
        "dB, dC: [x·dt·to_end; dy·exp(cs)]·[G_out; S_in]",
        2 * b * c * g,
        q,
        n,
        r * p,
    );
    plan.product("dC: d(C·Bᵀ)·B", b * c * g, q, n, q);
    plan.product("dB: d(C·Bᵀ)ᵀ·C", b * c * g, q, n, q);
    // a cube of TILE² threads per (b, h, chunk), a thread per step: two scans, the pairs' sums
    // of its tile pairs, a tree sum for A
    let steps = (TILE * TILE).ilog2() as usize;
    let chain = 3 * cols + 3 * steps + 2 * rows + rows * rows / 4;
    let cubes = b * h * c;
    plan.tiled(
        "decay_scans",
        LaunchKind::Kernel,
        cubes,
        cubes * TILE * TILE * (chain + 8),
        plan.f(h
            + b * h * big_l * (1 + 3 * cols)
            + b * c * h * pairs * SPAN_WIDTH
            + b * c * h * cols
            + b * l * h),
        plan.f(2 * b * l * h + b * c * h),
        chain,
    );
    // B and C in their layout, and the sum of A's parts
    plan.kernel(
        "unchunk",
        (b * l * g * n).max(h),
        2 * b * l * g * n + b * c * h,
        plan.f(4 * b * big_l * g * n + b * c * h),
        plan.e(2 * b * l * g * n) + plan.f(h),
        (b * c).max(1),
        false,
    );
    plan.launches
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
