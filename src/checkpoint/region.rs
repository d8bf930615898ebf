//! A tensor's bytes in a safetensors file, read into a parameter's storage: cast to the
//! parameter's float type, cut to a block of its first axis and transposed on the way, a few
//! rows at a time.
//!
//! Reading the whole tensor and then casting, cutting and transposing it makes up to three
//! full-size temporaries per parameter. The allocator keeps such freed buffers for reuse, so a
//! load's peak memory grew by a tenth of the weights; read this way, the only buffer besides the
//! parameter is one chunk of rows.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::Path;

use burn::store::TensorSnapshotError;
use burn::tensor::{bf16, f16, DType, Element, TensorData};

/// Bytes of the file read at a time (whole rows, at least one).
const CHUNK_BYTES: usize = 1 << 20;

/// Source rows transposed together: their elements of one column are written side by side,
/// and their bytes stay in cache while every column is visited.
const TILE_ROWS: usize = 32;

/// Where a tensor lies in a safetensors file.
#[derive(Clone, Debug)]
pub(super) struct Region {
    /// The first byte of its data in the file.
    pub(super) offset: u64,
    /// Its shape, as the file stores it.
    pub(super) shape: Vec<usize>,
    /// Its element type in the file (a float type; others are refused when read).
    pub(super) dtype: DType,
}

type ReadResult = Result<TensorData, TensorSnapshotError>;

impl Region {
    /// The tensor's length along its first axis (1 for a scalar).
    pub(super) fn rows(&self) -> usize {
        self.shape.first().copied().unwrap_or(1)
    }

    /// Elements per row: the product of the shape after the first axis.
    fn row_len(&self) -> usize {
        self.shape.iter().skip(1).product()
    }

    /// Reads `rows` (a range of the first axis) of the tensor in `path`, as `dtype`, transposed
    /// when `transpose` (a matrix's `[rows, cols]` becomes `[cols, rows]`).
    ///
    /// # Shapes
    /// - the file's tensor: `[R, ...]`
    /// - result: `[rows.len(), ...]`, or `[cols, rows.len()]` transposed
    pub(super) fn read(
        &self,
        path: &Path,
        rows: Range<usize>,
        transpose: bool,
        dtype: DType,
    ) -> ReadResult {
        if rows.end > self.rows() || rows.start > rows.end || (transpose && self.shape.len() != 2) {
            return Err(TensorSnapshotError::DataError(format!(
                "rows {rows:?} of a tensor of shape {:?}{}",
                self.shape,
                if transpose { ", transposed" } else { "" }
            )));
        }
        match dtype {
            DType::F64 => self.read_as::<f64>(path, rows, transpose),
            DType::F32 => self.read_as::<f32>(path, rows, transpose),
            DType::F16 => self.read_as::<f16>(path, rows, transpose),
            DType::BF16 => self.read_as::<bf16>(path, rows, transpose),
            other => Err(not_float(other)),
        }
    }

    /// [`Self::read`] into elements of type `E`, for each float type of the file.
    fn read_as<E: Element>(&self, path: &Path, rows: Range<usize>, transpose: bool) -> ReadResult {
        let io =
            |e: std::io::Error| TensorSnapshotError::IoError(format!("{}: {e}", path.display()));
        let mut file = File::open(path).map_err(io)?;
        let row_bytes = self.row_len() * self.dtype.size();
        file.seek(SeekFrom::Start(
            self.offset + (rows.start * row_bytes) as u64,
        ))
        .map_err(io)?;
        let mut shape = self.shape.clone();
        if shape.is_empty() {
            shape.push(1);
        }
        shape[0] = rows.len();
        if transpose {
            shape.reverse();
        }
        let scalar = self.shape.is_empty();
        let copy = RowCopy {
            file: &mut file,
            rows: rows.len(),
            cols: self.row_len(),
            transpose,
        };
        let mut data = match self.dtype {
            DType::F64 => copy.run::<f64, E>(),
            DType::F32 => copy.run::<f32, E>(),
            DType::F16 => copy.run::<f16, E>(),
            DType::BF16 => copy.run::<bf16, E>(),
            other => return Err(not_float(other)),
        }
        .map_err(io)?;
        data.shape = if scalar { Vec::new() } else { shape }.into();
        Ok(data)
    }
}

/// The error for a tensor that is not of a float type.
fn not_float(dtype: DType) -> TensorSnapshotError {
    TensorSnapshotError::DataError(format!("{dtype:?} is not a float type"))
}

/// One read of `rows` rows of `cols` elements from where `file` stands.
struct RowCopy<'a> {
    file: &'a mut File,
    rows: usize,
    cols: usize,
    transpose: bool,
}

impl RowCopy<'_> {
    /// Reads file elements `S` into a buffer of `E` (flat; the caller sets the shape).
    fn run<S: Element, E: Element>(self) -> std::io::Result<TensorData> {
        let (rows, cols) = (self.rows, self.cols);
        if S::dtype() == E::dtype() && !self.transpose {
            // the parameter's own type and layout: straight into its storage
            let mut data = TensorData::zeros::<E, _>([rows * cols]);
            self.file.read_exact(&mut data.bytes)?;
            from_little_endian(&mut data, S::dtype().size());
            return Ok(data);
        }
        let mut out = vec![E::default(); rows * cols];
        let chunk_rows = (CHUNK_BYTES / (cols * S::dtype().size()).max(1)).clamp(1, rows.max(1));
        let mut start = 0;
        while start < rows {
            let n = chunk_rows.min(rows - start);
            let mut chunk = TensorData::zeros::<S, _>([n * cols]);
            self.file.read_exact(&mut chunk.bytes)?;
            from_little_endian(&mut chunk, S::dtype().size());
            let src = chunk.as_slice::<S>().expect("the chunk's own type");
            if self.transpose {
                // out[j, start + i] = src[i, j], TILE_ROWS source rows at a time
                for tile in (0..n).step_by(TILE_ROWS) {
                    let tile_end = (tile + TILE_ROWS).min(n);
                    for j in 0..cols {
                        let column = &mut out[j * rows + start..];
                        for i in tile..tile_end {
                            column[i] = E::from_elem(src[i * cols + j]);
                        }
                    }
                }
            } else {
                let dst = &mut out[start * cols..(start + n) * cols];
                for (d, s) in dst.iter_mut().zip(src) {
                    *d = E::from_elem(*s);
                }
            }
            start += n;
        }
        Ok(TensorData::new(out, [rows * cols]))
    }
}

/// Safetensors files are little-endian.
fn from_little_endian(data: &mut TensorData, size: usize) {
    if cfg!(target_endian = "big") {
        data.bytes.chunks_exact_mut(size).for_each(<[u8]>::reverse);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Reads through several chunks and tiles (a matrix of 1.2 MiB, with a header before it)
    /// equal the plain cast, cut and transpose of the whole tensor.
    #[test]
    fn pieces_equal_the_whole() {
        let (rows, cols) = (301, 1003);
        let values: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(&[7u8; 24]).unwrap();
        for v in &values {
            file.write_all(&v.to_le_bytes()).unwrap();
        }
        file.flush().unwrap();
        let region = Region {
            offset: 24,
            shape: vec![rows, cols],
            dtype: DType::F32,
        };
        let at = |r: usize, c: usize| values[r * cols + c];
        for (part, transpose) in [
            (0..rows, false),
            (0..rows, true),
            (100..201, true),
            (7..300, false),
        ] {
            for dtype in [DType::F32, DType::BF16, DType::F64] {
                let data = region
                    .read(file.path(), part.clone(), transpose, dtype)
                    .unwrap();
                let n = part.len();
                let shape = if transpose {
                    vec![cols, n]
                } else {
                    vec![n, cols]
                };
                assert_eq!(data.shape.to_vec(), shape);
                let got = data.convert::<f64>().to_vec::<f64>().unwrap();
                for i in 0..n {
                    for j in 0..cols {
                        let want = at(part.start + i, j);
                        let want = match dtype {
                            DType::BF16 => bf16::from_f32(want).to_f64(),
                            _ => want as f64,
                        };
                        let index = if transpose { j * n + i } else { i * cols + j };
                        assert_eq!(
                            got[index], want,
                            "{part:?} {transpose} {dtype:?} ({i}, {j})"
                        );
                    }
                }
            }
        }
        assert!(region
            .read(file.path(), 0..rows + 1, false, DType::F32)
            .is_err());
        assert!(region
            .read(file.path(), 0..rows, false, DType::I32)
            .is_err());
    }
}
