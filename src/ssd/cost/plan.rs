//! The builder of one pass's launches ([`Plan`]): each kind of launch the scan issues, with its
//! work from the shape's sizes.

use super::launch::{Launch, LaunchKind, Pass, ScanShape};
use super::occupancy::occupancy;
use crate::ssd::geometry::{BLOCK, CUBE_SIZE as KERNEL_CUBE, PER, TILE};

/// The FLOPs per output element of the decay-weighted tiles of one tile column (`rows` tiles of
/// a chunk, `pairs` tile pairs on and below the diagonal): each weight's segment sum from its
/// own terms on the diagonal tile (a loop over the tile); below it, from the tile's sums per
/// column (`BLOCK + 1` of them, a loop over the tile each, about 2 FLOPs a weight) and the
/// row's carry (an add); then an `exp`, the weight's products and the multiply-adds of the
/// tile.
pub(super) fn weighted_tiles(rows: usize, pairs: usize) -> usize {
    rows * (2 * BLOCK + 8) + (pairs - rows) * (2 * (BLOCK + 1) / BLOCK + 1 + 8) + pairs * 2 * BLOCK
}
/// The output tile of a product per cube, each side.
const PRODUCT_TILE: usize = 64;

/// Builds the launches of one pass, with the shape's sizes in scope. Sizes are in bytes:
/// [`Plan::e`] for tensors of the operand type, [`Plan::f`] for those in `f32`.
pub(super) struct Plan {
    pub(super) s: ScanShape,
    pass: Pass,
    pub(super) launches: Vec<Launch>,
}

impl Plan {
    pub(super) fn new(s: ScanShape, pass: Pass) -> Self {
        Self {
            s,
            pass,
            launches: Vec::new(),
        }
    }

    /// The launches, the scan's own kernels with their occupancy ([`super::occupancy::occupancy`]).
    pub(super) fn finish(self) -> Vec<Launch> {
        let s = self.s;
        self.launches
            .into_iter()
            .map(|launch| match launch.kind {
                LaunchKind::Product => launch,
                LaunchKind::Kernel | LaunchKind::Tiled => Launch {
                    occupancy: occupancy(launch.name, s.products, s.element_bytes),
                    ..launch
                },
            })
            .collect()
    }

    /// The bytes of `elements` of the operand type.
    pub(super) fn e(&self, elements: usize) -> usize {
        elements * self.s.element_bytes
    }

    /// The bytes of `elements` in `f32`.
    pub(super) fn f(&self, elements: usize) -> usize {
        elements * 4
    }

    /// The bytes of a recurrence's second copy of `elements` in the operand type, written only
    /// where that type is not `f32` (`forward::operand_copy`).
    pub(super) fn operand_copy(&self, elements: usize) -> usize {
        if self.s.element_bytes == 4 {
            0
        } else {
            self.e(elements)
        }
    }

    /// A product of `batch` matrices `[m, k] · [k, n]` of the operand type, written in `f32`.
    pub(super) fn product(
        &mut self,
        name: &'static str,
        batch: usize,
        m: usize,
        n: usize,
        k: usize,
    ) {
        self.product_to(name, batch, m, n, k, 4);
    }

    /// [`Plan::product`] written with `out_bytes` per element.
    pub(super) fn product_to(
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
            occupancy: None,
        });
    }

    /// One of the scan's kernels: `threads` threads, `flops` off tensor cores, `read` and
    /// `written` bytes, a chain of `serial` steps per thread.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn kernel(
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
            occupancy: None,
        });
    }

    /// One of the scan's tiled kernels or scans: `cubes` cubes, `flops` off tensor
    /// cores, `read` and `written` bytes, a chain of `serial` steps per thread; of `kind`
    /// [`LaunchKind::Tiled`] where it computes products tile by tile (its chain is then its
    /// contractions), [`LaunchKind::Kernel`] otherwise.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn tiled(
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
            occupancy: None,
        });
    }

    /// The forward's steps 1 to 5, which the gradient recomputes (`forward::recompute`); the
    /// gradient also lays out `dy` in the first launch.
    pub(super) fn recompute(&mut self) {
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
        // layouts of x·dt·to_end (and in the gradient of dy·exp(cs)) per group, and a share of
        // the group's B and C (the group's heads split them), the cube's threads striding over
        // them
        let dy = usize::from(self.pass == Pass::Backward);
        let scan_steps = (TILE * TILE).ilog2() as usize;
        let cubes = b * c * h;
        // the head's columns of x (and dy), then its share of the group's B and C
        let chain =
            2 * scan_steps + (q * p).div_ceil(TILE * TILE) + (q * n).div_ceil(TILE * TILE * r);
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
    pub(super) fn head_parts(&mut self, name: &'static str, stack: usize) {
        let (b, g, p, n, q) = (self.s.b, self.s.g, self.s.p, self.s.n, self.s.q);
        let (c, r) = (self.s.c(), self.s.r());
        let bytes = self.s.element_bytes;
        self.product_to(name, stack * b * c * g, q, r * p, n, bytes);
    }

    /// With [`ScanProducts::TensorCores`], the multiply-adds `mads` of the tiled kernel `name`
    /// (the last launch of that name) as FLOPs on tensor cores, not off them.
    pub(super) fn on_tensor_cores(&mut self, name: &str, mads: usize) {
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
    pub(super) fn intra_weights(&mut self) {
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
            occupancy: None,
        });
    }

    /// A tensor `[b, l, h, p]` of the operand type in the chunk layout `[b, c, h, q, p]`.
    pub(super) fn chunk_rows(&mut self, name: &'static str) {
        let (b, l, h, p, q) = (self.s.b, self.s.l, self.s.h, self.s.p, self.s.q);
        let big = b * self.s.c() * h * q * p;
        self.kernel(name, big, 0, self.e(b * l * h * p), self.e(big), 1, false);
    }

    /// A per-head product over the chunk, `[q, k] · [k, n]` per `(b, j, h)`, of the transient
    /// products, written in `f32`; `square` where it writes `b·c·h·q²` elements.
    pub(super) fn head_product(&mut self, name: &'static str, n: usize, k: usize, square: bool) {
        let (b, h, q) = (self.s.b, self.s.h, self.s.q);
        self.product(name, b * self.s.c() * h, q, n, k);
        if let Some(last) = self.launches.last_mut() {
            last.per_head_square = square;
        }
    }
}
