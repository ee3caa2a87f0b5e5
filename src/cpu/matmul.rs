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
        self.product(x, bias, y, true)
    }

    /// [`Self::matmul`] one weight row at a time (never in tiles): what the tiles are held to.
    #[cfg(test)]
    pub(crate) fn matmul_by_rows(&self, x: &[f32], bias: Option<&[f32]>, y: &mut [f32]) {
        self.product(x, bias, y, false)
    }

    /// [`Self::matmul`], in tiles of rows × tokens where `tiles` allows it and the type and
    /// CPU have them.
    fn product(&self, x: &[f32], bias: Option<&[f32]>, y: &mut [f32], tiles: bool) {
        let tokens = x.len() / self.cols.max(1);
        debug_assert_eq!(y.len(), tokens * self.rows);
        if tokens == 0 || self.rows == 0 {
            return;
        }
        let quantized = self.quantizes_activations();
        let tiled = tiles && quantized && tiled::wanted(self.dtype, tokens);
        // Rows per task: several tasks per thread so that uneven threads even out (whole
        // tiles where the product is tiled).
        let mut per = (self.rows / (super::threads() * 8)).clamp(8, 256);
        if tiled {
            per = per.next_multiple_of(tiled::ROWS);
        }
        let mut q8 = Q8Rows::default();
        if quantized {
            q8.quantize(x, self.cols);
        }
        let corrections = if tiled {
            tiled::corrections(self.dtype, &q8)
        } else {
            Vec::new()
        };
        let task = |first: usize, out: &mut [f32]| {
            // out: [n rows, tokens]
            let n = out.len() / tokens;
            // whole tiles first, the rows past them one at a time
            let done = if tiled {
                tiled::rows(
                    self.dtype,
                    &self.data,
                    self.row_bytes,
                    first,
                    (&q8, &corrections),
                    out,
                )
            } else {
                0
            };
            let out = &mut out[done * tokens..];
            let first = first + done;
            let n = n - done;
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
            // back to one row per token, spread over the team too
            let rows = self.rows;
            super::for_each_chunk(y, rows, |t, row| {
                for (r, v) in row.iter_mut().enumerate() {
                    *v = yt[r * tokens + t];
                }
            });
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

/// The product in tiles of rows × tokens where the target has them (AVX-512 VNNI,
/// [`super::tiles_vnni`]); elsewhere nothing is tiled.
mod tiled {
    use super::Q8Rows;
    use crate::dtype::DType;

    /// Rows per tile.
    #[cfg(target_arch = "x86_64")]
    pub(super) const ROWS: usize = crate::cpu::tiles_vnni::ROWS;
    #[cfg(not(target_arch = "x86_64"))]
    pub(super) const ROWS: usize = 16;

    /// What the tiles start each half-block's sum with (empty where nothing is tiled).
    pub(super) fn corrections(dtype: DType, q8: &Q8Rows) -> Vec<i32> {
        #[cfg(target_arch = "x86_64")]
        return crate::cpu::tiles_vnni::corrections(dtype, q8);
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (dtype, q8);
            Vec::new()
        }
    }

    /// Whether a product of `dtype` over `tokens` tokens runs in tiles on this CPU.
    pub(super) fn wanted(dtype: DType, tokens: usize) -> bool {
        #[cfg(target_arch = "x86_64")]
        return tokens >= crate::cpu::tiles_vnni::MIN_TOKENS
            && crate::cpu::tiles_vnni::available(dtype);
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (dtype, tokens);
            false
        }
    }

    /// The whole tiles of the rows from `first` on that `out` (`[n rows, tokens]`) holds,
    /// computed into it; the rows done (a multiple of [`ROWS`], the rest left to the caller).
    pub(super) fn rows(
        dtype: DType,
        data: &[u8],
        row_bytes: usize,
        first: usize,
        (q8, corrections): (&Q8Rows, &[i32]),
        out: &mut [f32],
    ) -> usize {
        #[cfg(target_arch = "x86_64")]
        {
            let tokens = q8.q.len() / q8.cols.max(1);
            let Some(mut tile) = crate::cpu::tiles_vnni::Tile::new(dtype) else {
                return 0;
            };
            let groups = out.len() / tokens.max(1) / ROWS;
            for (g, out) in out.chunks_exact_mut(ROWS * tokens).take(groups).enumerate() {
                let rows = &data[(first + g * ROWS) * row_bytes..][..ROWS * row_bytes];
                tile.fill(rows, row_bytes);
                tile.product(q8, corrections, out);
            }
            groups * ROWS
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (dtype, data, row_bytes, first, q8, corrections, out);
            0
        }
    }
}
