//! `y = W · x` for a weight matrix kept in its stored format, over one or many tokens: each
//! weight row is unpacked once per call and multiplied with every token's activations, and the
//! rows are spread over the thread pool.

use super::quant::{Q8Rows, UnpackedRow, QK};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::model::file_bytes::WeightBytes;

/// A weight matrix `[rows, cols]` in its stored type (row-major, each row a whole number of
/// blocks).
#[derive(Debug, Clone)]
pub struct QMatrix {
    dtype: DType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    data: WeightBytes,
}

impl QMatrix {
    /// `data` holds `rows × cols` values of `dtype`; `name` names the tensor in errors (a
    /// length that does not match, or rows that are not whole blocks).
    pub fn new(
        dtype: DType,
        rows: usize,
        cols: usize,
        data: impl Into<WeightBytes>,
        name: &str,
    ) -> Result<Self> {
        let data = data.into();
        let block = dtype.block_elements() as usize;
        if !cols.is_multiple_of(block) {
            return Err(Error::invalid(
                "tensor",
                format!(
                    "`{name}`: rows of {cols} values are not whole {} blocks of {block}",
                    dtype.name()
                ),
            ));
        }
        let row_bytes = dtype.bytes_for(cols as u64, name)? as usize;
        if data.len() != rows * row_bytes {
            return Err(Error::invalid(
                "tensor",
                format!(
                    "`{name}`: {} bytes for {rows} rows of {row_bytes}",
                    data.len()
                ),
            ));
        }
        Ok(Self {
            dtype,
            rows,
            cols,
            row_bytes,
            data,
        })
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Values per row (the input width).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The storage type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Row `r` dequantized to f32, `[cols]` (an embedding lookup).
    pub fn row_f32(&self, r: usize, out: &mut [f32]) -> Result<()> {
        if r >= self.rows {
            return Err(Error::invalid(
                "row",
                format!("{r} is not one of the {} rows", self.rows),
            ));
        }
        let bytes = &self.data[r * self.row_bytes..][..self.row_bytes];
        crate::dtype::dequantize_into(self.dtype, bytes, &mut out[..self.cols], "row")
    }

    /// Whether the product runs on 8-bit activations (every quantized type) or f32 (the
    /// float types).
    pub fn quantizes_activations(&self) -> bool {
        !matches!(self.dtype, DType::F32 | DType::F16 | DType::BF16) && self.cols.is_multiple_of(QK)
    }

    /// `y[t] = W · x[t] (+ bias)` for `x: [tokens, cols]` into `y: [tokens, rows]`.
    pub fn matmul(&self, x: &[f32], bias: Option<&[f32]>, y: &mut [f32]) {
        let tokens = x.len() / self.cols.max(1);
        debug_assert_eq!(y.len(), tokens * self.rows);
        if tokens == 0 || self.rows == 0 {
            return;
        }
        // Rows per task: several tasks per thread so that uneven threads even out.
        let per = (self.rows / (super::threads() * 8)).clamp(8, 256);
        let mut q8 = Q8Rows::default();
        let quantized = self.quantizes_activations();
        if quantized {
            q8.quantize(x, self.cols);
        }
        let task = |first: usize, out: &mut [f32]| {
            // out: [n rows, tokens]
            let n = out.len() / tokens;
            if quantized {
                // Each row's blocks made into values in registers, once for up to four tokens
                // (one in a decode step, more in a batched step or a prompt chunk), where the
                // type has a fused path; otherwise each row unpacked once and dotted with every
                // token.
                // made only where the fused path declines: a decode step allocates nothing here
                let mut unpacked: Option<UnpackedRow> = None;
                let mut offsets = Vec::new();
                for (r, out) in out.chunks_exact_mut(tokens).enumerate() {
                    let bytes = &self.data[(first + r) * self.row_bytes..][..self.row_bytes];
                    if super::fused::row_dot_tokens(self.dtype, bytes, &q8, out, &mut offsets) {
                        continue;
                    }
                    let row = unpacked.get_or_insert_with(|| UnpackedRow::with_cols(self.cols));
                    row.unpack(self.dtype, bytes);
                    for (t, o) in out.iter_mut().enumerate() {
                        let (q, d, s) = q8.row(t);
                        *o = row.dot(q, d, s);
                    }
                }
            } else {
                let mut row = vec![0.0f32; self.cols];
                for r in 0..n {
                    let bytes = &self.data[(first + r) * self.row_bytes..][..self.row_bytes];
                    // The length was checked at construction.
                    let _ = crate::dtype::dequantize_into(self.dtype, bytes, &mut row, "row");
                    for t in 0..tokens {
                        out[r * tokens + t] = dot_f32(&row, &x[t * self.cols..][..self.cols]);
                    }
                }
            }
        };
        if tokens == 1 {
            super::for_each_chunk(y, per, |i, out| task(i * per, out));
        } else {
            let mut yt = vec![0.0f32; self.rows * tokens];
            super::for_each_chunk(&mut yt, per * tokens, |i, out| task(i * per, out));
            for (r, col) in yt.chunks_exact(tokens).enumerate() {
                for (t, &v) in col.iter().enumerate() {
                    y[t * self.rows + r] = v;
                }
            }
        }
        if let Some(b) = bias {
            for row in y.chunks_exact_mut(self.rows) {
                for (v, b) in row.iter_mut().zip(b) {
                    *v += b;
                }
            }
        }
    }
}

/// `Σ a·b` in f32 with eight partial sums (so that the compiler can vectorize it).
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let tail: f32 = ar.iter().zip(br).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}
