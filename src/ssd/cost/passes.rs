//! The launches of the fused scan's forward and gradient, in order, as `ssd/cubecl/forward.rs`
//! and `backward.rs` issue them.

use super::launch::{Launch, LaunchKind, Pass, ScanShape};
use super::plan::{weighted_tiles, Plan};
use crate::ssd::geometry::{BLOCK, CUBE_SIZE as KERNEL_CUBE, PER, SPAN_WIDTH, TILE};

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
        return plan.finish();
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
    plan.finish()
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
        let flops = b * c * g * r * tile * score_grad_weights(rows, pairs);
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
        let flops =
            b * c * g * r * tile * (pairs * 2 * BLOCK * cols + score_grad_weights(rows, pairs));
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
    plan.finish()
}

/// The FLOPs per element of `score_grads`' tile, per head, but its `dy·xᵀ` (`rows` tiles of a
/// chunk, `pairs` tile pairs on and below the diagonal): the weights of every tile pair (below
/// the diagonal also each row's terms of its tile up to `i`, one sum per row as for the
/// columns) and the pairs' sums (a loop over the tile per element on the diagonal, sums of rows
/// and columns below).
fn score_grad_weights(rows: usize, pairs: usize) -> usize {
    weighted_tiles(rows, pairs) - pairs * 2 * BLOCK
        + (pairs - rows) * 2 * (BLOCK + 1) / BLOCK
        + rows * 2 * BLOCK
        + (pairs - rows) * 4
}
