//! The tiled kernels' tile products on tensor cores (`ScanProducts::TensorCores`): operand
//! tiles staged in shared memory in the operand type, row-major, multiplied by the cube's two
//! planes in `FRAG × FRAG × FRAG` fragments (`cmma`) into an `f32` accumulator tile in shared
//! memory, from which each thread reads its `PER × PER` elements. Where the device has no
//! tensor cores for the operand type (`f32` operands; Vulkan without cooperative matrices, such
//! as lavapipe) the same staging runs with the fragments' products on the ordinary cores,
//! element by element in the planes' layout: everything but the three `cmma` calls is the
//! same code in both.

use cubecl::prelude::*;

use crate::ssd::geometry::{BLOCK, PER, UNITS};

/// The side of a tensor-core fragment: CUDA's `m16n16k16` for `f16` and `bf16` operands.
pub(crate) const FRAG: usize = 16;

/// The threads of a plane the fragments are laid out for (a CUDA warp); the launch checks the
/// device's planes have it where it runs `cmma`.
pub(crate) const PLANE: usize = 32;

// the cube's `UNITS²` threads are two planes, each holding `FRAG` rows of the output tile
const _: () = assert!(UNITS * UNITS == 2 * PLANE && BLOCK == 2 * FRAG);

/// A `BLOCK × BLOCK` tile in shared memory, row-major, of the operand type (`E`) for the
/// operands, of `f32` for the accumulator; aligned to 32 bytes, as the fragments' loads and
/// stores need (every fragment starts a multiple of 16 elements into it).
#[cube]
pub(super) fn fragment_tile<T: Float>() -> SharedMemory<T> {
    SharedMemory::<T>::new_aligned(BLOCK * BLOCK, 32usize)
}

/// Sets the accumulator tile to zero (each thread its `PER × PER` elements).
#[cube]
pub(super) fn zero_tile<F: Float>(acc: &mut SharedMemory<F>, ty: usize, tx: usize) {
    #[unroll]
    for u in 0..PER {
        #[unroll]
        for v in 0..PER {
            acc[(ty * PER + u) * BLOCK + tx * PER + v] = F::new(0.0);
        }
    }
}

/// Loads an operand tile from a matrix of `src`: element `(r, c)` from `src[first +
/// r·row_stride + c]` where `first_row + r < row_end` and `first_col + c < col_end`, zero
/// elsewhere, into `tile[r·BLOCK + c]`. Adjacent threads read adjacent elements of a row.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn load_tile<E: Float>(
    src: &Tensor<E>,
    tile: &mut SharedMemory<E>,
    first: usize,
    row_stride: usize,
    first_row: usize,
    row_end: usize,
    first_col: usize,
    col_end: usize,
    unit: usize,
) {
    #[unroll]
    for m in 0..BLOCK * BLOCK / (UNITS * UNITS) {
        let e = unit + m * UNITS * UNITS;
        let (r, c) = (e / BLOCK, e % BLOCK);
        let mut value = E::new(0.0);
        if first_row + r < row_end && first_col + c < col_end {
            value = src[first + r * row_stride + c];
        }
        tile[e] = value;
    }
}

/// Writes a thread's `PER × PER` values `w[u][v]` (rows `ty·PER + u`, columns `tx·PER + v`)
/// into an operand tile, rounded to its type.
#[cube]
pub(super) fn store_tile<F: Float, E: Float>(
    tile: &mut SharedMemory<E>,
    w: &Array<Vector<F, Const<PER>>>,
    ty: usize,
    tx: usize,
) {
    #[unroll]
    for u in 0..PER {
        let row = w[u];
        #[unroll]
        for v in 0..PER {
            tile[(ty * PER + u) * BLOCK + tx * PER + v] = E::cast_from(row[v]);
        }
    }
}

/// A thread's `PER × PER` elements of the accumulator tile, as the register tiles hold them.
#[cube]
pub(super) fn read_tile<F: Float>(
    acc: &SharedMemory<F>,
    out: &mut Array<Vector<F, Const<PER>>>,
    ty: usize,
    tx: usize,
) {
    #[unroll]
    for u in 0..PER {
        let mut row = Vector::<F, Const<PER>>::new(F::new(0.0));
        #[unroll]
        for v in 0..PER {
            row[v] = acc[(ty * PER + u) * BLOCK + tx * PER + v];
        }
        out[u] = row;
    }
}

/// `acc += lhs · rhs` over one `BLOCK × BLOCK` tile of each (`lhs` row-major `[m][k]`; `rhs`
/// row-major `[k][n]`, or with `rhs_col_major` its transpose `[n][k]`): plane `unit / PLANE`
/// computes rows `plane·FRAG …` of `acc` as two fragments along `n`, each over `BLOCK / FRAG`
/// fragments along `k`, on tensor cores with `cmma`; without, each of the plane's threads the
/// same elements' sums, `k` in the same order, on the ordinary cores. The cube synchronises
/// before (the operand tiles written) and the caller after (before `acc` is read or the
/// operand tiles are written again).
#[cube]
pub(super) fn fragment_product<F: Float, E: Float>(
    lhs: &SharedMemory<E>,
    rhs: &SharedMemory<E>,
    acc: &mut SharedMemory<F>,
    unit: usize,
    #[comptime] rhs_col_major: bool,
    #[comptime] cmma: bool,
) {
    let plane = unit / PLANE;
    let rows = plane * FRAG * BLOCK;
    if cmma {
        #[unroll]
        for half in 0..BLOCK / FRAG {
            let out = rows + half * FRAG;
            let c = unsafe {
                cmma::Matrix::<F>::uninitialized(
                    cmma::MatrixIdent::Accumulator,
                    FRAG,
                    FRAG,
                    FRAG,
                    cmma::MatrixLayout::Undefined,
                )
            };
            cmma::load_with_layout(
                &c,
                &acc.slice(out, out + (FRAG - 1) * BLOCK + FRAG),
                BLOCK as u32,
                cmma::MatrixLayout::RowMajor,
            );
            #[unroll]
            for kk in 0..BLOCK / FRAG {
                let a_first = rows + kk * FRAG;
                let a = cmma::Matrix::<E>::from_slice(
                    cmma::MatrixIdent::A,
                    FRAG,
                    FRAG,
                    FRAG,
                    cmma::MatrixLayout::RowMajor,
                    &lhs.slice(a_first, a_first + (FRAG - 1) * BLOCK + FRAG),
                    BLOCK as u32,
                );
                if rhs_col_major {
                    let b_first = half * FRAG * BLOCK + kk * FRAG;
                    let b = cmma::Matrix::<E>::from_slice(
                        cmma::MatrixIdent::B,
                        FRAG,
                        FRAG,
                        FRAG,
                        cmma::MatrixLayout::ColMajor,
                        &rhs.slice(b_first, b_first + (FRAG - 1) * BLOCK + FRAG),
                        BLOCK as u32,
                    );
                    cmma::execute::<E, E, F, F>(&a, &b, &c, &c);
                } else {
                    let b_first = kk * FRAG * BLOCK + half * FRAG;
                    let b = cmma::Matrix::<E>::from_slice(
                        cmma::MatrixIdent::B,
                        FRAG,
                        FRAG,
                        FRAG,
                        cmma::MatrixLayout::RowMajor,
                        &rhs.slice(b_first, b_first + (FRAG - 1) * BLOCK + FRAG),
                        BLOCK as u32,
                    );
                    cmma::execute::<E, E, F, F>(&a, &b, &c, &c);
                }
            }
            cmma::store(
                &mut acc.slice_mut(out, out + (FRAG - 1) * BLOCK + FRAG),
                &c,
                BLOCK as u32,
                cmma::MatrixLayout::RowMajor,
            );
        }
    } else {
        // the plane's FRAG × BLOCK elements, PLANE threads striding over them
        let lane = unit % PLANE;
        #[unroll]
        for m in 0..FRAG * BLOCK / PLANE {
            let e = lane + m * PLANE;
            let (r, n) = (e / BLOCK, e % BLOCK);
            let mut sum = acc[rows + r * BLOCK + n];
            for k in 0..BLOCK {
                let mut b_at = k * BLOCK + n;
                if rhs_col_major {
                    b_at = n * BLOCK + k;
                }
                sum += F::cast_from(lhs[rows + r * BLOCK + k]) * F::cast_from(rhs[b_at]);
            }
            acc[rows + r * BLOCK + n] = sum;
        }
    }
}
