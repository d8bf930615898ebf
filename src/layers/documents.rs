//! Packed sequences: several documents back to back in one batch row, as the reference's
//! `seq_idx`. No state crosses a document boundary: neither the SSM state nor the convolution
//! window, so a packed row gives the outputs (and gradients) of its documents run one by one.

use burn::tensor::{backend::Backend, Int, Tensor, TensorData};

use crate::error::{Mamba2Error, Result};

/// The document of every token of a batch: `seq_idx[b, t]`, the same for the tokens of one
/// document and growing by one at each new document of a row.
///
/// A state passed with a packed batch continues each row's first document.
#[derive(Clone, Debug)]
pub struct Documents<B: Backend> {
    seq_idx: Tensor<B, 2, Int>,
}

impl<B: Backend> Documents<B> {
    /// The documents of each row from their lengths (`cu_seqlens`-style): row `i` holds
    /// documents of `rows[i][0]`, `rows[i][1]`, ... tokens. Every row must have the same total
    /// length and every document at least one token.
    pub fn from_lengths(rows: &[Vec<usize>], device: &B::Device) -> Result<Self> {
        let bad = |reason: String| Mamba2Error::InvalidInput {
            name: "document lengths",
            reason,
        };
        let l: usize = rows
            .first()
            .ok_or_else(|| bad("no rows".into()))?
            .iter()
            .sum();
        let mut ids = Vec::with_capacity(rows.len() * l);
        for (i, row) in rows.iter().enumerate() {
            if let Some(j) = row.iter().position(|&n| n == 0) {
                return Err(bad(format!("row {i}: document {j} is empty")));
            }
            let total: usize = row.iter().sum();
            if total != l {
                return Err(bad(format!(
                    "row {i} holds {total} tokens, row 0 holds {l}"
                )));
            }
            for (doc, &n) in row.iter().enumerate() {
                ids.extend(std::iter::repeat_n(doc as i64, n));
            }
        }
        if l == 0 {
            return Err(bad("rows of no tokens".into()));
        }
        let seq_idx = Tensor::from_data(TensorData::new(ids, [rows.len(), l]), device);
        Ok(Self { seq_idx })
    }

    /// From a per-token document index `[b, l]` already on the device (not read back: each
    /// row must be non-decreasing, a new document wherever the index changes).
    pub fn from_seq_idx(seq_idx: Tensor<B, 2, Int>) -> Self {
        Self { seq_idx }
    }

    /// The per-token document index.
    ///
    /// # Shapes
    /// - returns `[b, l]`
    pub fn seq_idx(&self) -> Tensor<B, 2, Int> {
        self.seq_idx.clone()
    }

    /// The documents of rows `start..start + len`.
    pub fn narrow_rows(&self, start: usize, len: usize) -> Self {
        Self {
            seq_idx: self.seq_idx.clone().narrow(0, start, len),
        }
    }

    /// `[b, l]`.
    pub fn dims(&self) -> [usize; 2] {
        self.seq_idx.dims()
    }

    /// 1 at the first token of every document but a row's first, else 0, as floats.
    ///
    /// # Shapes
    /// - returns `[b, l]`
    pub fn starts(&self) -> Tensor<B, 2> {
        self.same_as_shifted(1).neg() + 1.0
    }

    /// 1 where token `t` is in the same document as token `t - shift`, else 0; for
    /// `t - shift < 0` (a token of the state carried in), whether `t` is in the row's first
    /// document.
    ///
    /// # Shapes
    /// - returns `[b, l]`
    pub fn same_as_shifted(&self, shift: usize) -> Tensor<B, 2> {
        let [b, l] = self.dims();
        let first = self.seq_idx.clone().narrow(1, 0, 1);
        let earlier = if shift == 0 {
            self.seq_idx.clone()
        } else if shift >= l {
            first.expand([b, l])
        } else {
            Tensor::cat(
                vec![
                    first.expand([b, shift]),
                    self.seq_idx.clone().narrow(1, 0, l - shift),
                ],
                1,
            )
        };
        self.seq_idx.clone().equal(earlier).float()
    }

    /// Checks that these are the documents of a batch of `b` rows of `l` tokens.
    pub(crate) fn check(&self, b: usize, l: usize) -> Result<()> {
        if self.dims() != [b, l] {
            return Err(Mamba2Error::Shape {
                name: "documents",
                expected: format!("[b, l] = [{b}, {l}]"),
                actual: self.dims().to_vec(),
            });
        }
        Ok(())
    }
}
