//! `y = W · x` for a weight matrix kept in its stored format, over one or many tokens: each
//! weight row is unpacked once per call and multiplied with every token's activations, and the
//! rows are spread over the thread pool.

use super::f32_tiles;
use super::quant::{Q8Rows, UnpackedRow, QK};
use super::tiled::{self, Packed};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::model::file_bytes::WeightBytes;

/// What a quantized matrix is multiplied with on the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuPrecision {
    /// Activations quantized to 8 bits per block of 32 and integer dot products, as llama.cpp
    /// does (the default: fast, a little further from the float64 reference).
    #[default]
    Int8,
    /// Every row dequantized to f32 and multiplied with f32 activations: the GPU's f32 path's
    /// answers (within f32 rounding), at a fraction of the speed.
    F32,
}

impl CpuPrecision {
    /// `"int8"` or `"f32"`: what the activations of the matrix products are.
    pub fn as_str(self) -> &'static str {
        match self {
            CpuPrecision::Int8 => "int8",
            CpuPrecision::F32 => "f32",
        }
    }

    /// What `info()` says of products in this precision: why 8-bit activations differ from the
    /// GPU's answers, and how to have those; nothing for f32.
    pub fn notice(self) -> Option<&'static str> {
        (self == CpuPrecision::Int8).then_some(
            "the CPU backend multiplies quantized weights with activations quantized to 8 bits \
             per block of 32, as llama.cpp does; `precision: 'f32'` (`--precision f32`) runs \
             them in f32, as the GPU does, more slowly",
        )
    }
}

/// A weight matrix `[rows, cols]` in its stored type (row-major, each row a whole number of
/// blocks), or in tiles of 16 rows where the CPU multiplies in tiles ([`super::tiled`]).
#[derive(Debug, Clone)]
pub struct QMatrix {
    dtype: DType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    /// The rows as stored; empty when `packed` holds them.
    data: WeightBytes,
    /// The rows in tiles, when they are kept so.
    packed: Option<Packed>,
    /// Rows dequantized and multiplied with f32 activations, whatever the type.
    exact: bool,
}

impl QMatrix {
    /// `data` holds `rows × cols` values of `dtype`; `name` names the tensor in errors (a
    /// length that does not match, or rows that are not whole blocks). Kept in tiles where
    /// the CPU has them ([`super::tiled`]).
    pub fn new(
        dtype: DType,
        rows: usize,
        cols: usize,
        data: impl Into<WeightBytes>,
        name: &str,
    ) -> Result<Self> {
        Ok(Self::stored(dtype, rows, cols, data, name)?.into_tiles())
    }

    /// [`Self::new`] keeping the rows as stored, whatever the CPU: products of fewer than four
    /// tokens take the row-at-a-time path (which the tiles' bits are held to).
    pub fn stored(
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
            packed: None,
            exact: false,
        })
    }

    /// [`Self::new`] for products in `precision`: with [`CpuPrecision::F32`] the rows stay as
    /// stored (tiles hold them for 8-bit products only) and each is dequantized to f32 when it
    /// is multiplied.
    pub fn with_precision(
        dtype: DType,
        rows: usize,
        cols: usize,
        data: impl Into<WeightBytes>,
        name: &str,
        precision: CpuPrecision,
    ) -> Result<Self> {
        match precision {
            CpuPrecision::Int8 => Self::new(dtype, rows, cols, data, name),
            CpuPrecision::F32 => Ok(Self {
                exact: true,
                ..Self::stored(dtype, rows, cols, data, name)?
            }),
        }
    }

    /// The rows moved into tiles where the CPU has them and the copy replaces the rows: bytes
    /// of the matrix's own, or a mapped file's (whose pages are handed back once repacked);
    /// not rows that share a file read into memory, which would then be held twice.
    fn into_tiles(mut self) -> Self {
        if self.data.is_shared() && !self.data.is_mapped() {
            return self;
        }
        self.packed = Packed::new(self.dtype, self.rows, self.row_bytes, &self.data);
        if self.packed.is_some() {
            std::mem::replace(&mut self.data, WeightBytes::Owned(Vec::new())).release();
        }
        self
    }

    /// Whether the rows are kept in tiles (a copy of the matrix's own: its stored bytes are no
    /// longer read).
    pub fn is_tiled(&self) -> bool {
        self.packed.is_some()
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
        self.data.len() + self.packed.as_ref().map_or(0, Packed::bytes)
    }

    /// Row `r` dequantized to f32, `[cols]` (an embedding lookup).
    pub fn row_f32(&self, r: usize, out: &mut [f32]) -> Result<()> {
        if r >= self.rows {
            return Err(Error::invalid(
                "row",
                format!("{r} is not one of the {} rows", self.rows),
            ));
        }
        if let Some(p) = &self.packed {
            return p.row_f32(r, &mut out[..self.cols]);
        }
        let bytes = &self.data[r * self.row_bytes..][..self.row_bytes];
        crate::dtype::dequantize_into(self.dtype, bytes, &mut out[..self.cols], "row")
    }

    /// Whether the product runs on 8-bit activations (every quantized type, unless made for
    /// f32 products) or f32 (the float types).
    pub fn quantizes_activations(&self) -> bool {
        !self.exact
            && !matches!(self.dtype, DType::F32 | DType::F16 | DType::BF16)
            && self.cols.is_multiple_of(QK)
    }

    /// `y[t] = W · x[t] (+ bias)` for `x: [tokens, cols]` into `y: [tokens, rows]`.
    /// On the tiles where the rows are kept in them, in tiles repacked as it goes where the
    /// type, the CPU and the number of tokens make it pay, else row by row.
    pub fn matmul(&self, x: &[f32], bias: Option<&[f32]>, y: &mut [f32]) {
        let tokens = x.len() / self.cols.max(1);
        debug_assert_eq!(y.len(), tokens * self.rows);
        if tokens == 0 || self.rows == 0 {
            return;
        }
        let quantized = self.quantizes_activations();
        let tiled = self.packed.is_some() || (quantized && tiled::wanted(self.dtype, tokens));
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
            let done = match &self.packed {
                Some(p) => {
                    p.product(first, (&q8, &corrections), out);
                    n
                }
                None if tiled => {
                    let at = (&q8, corrections.as_slice());
                    tiled::rows(self.dtype, &self.data, self.row_bytes, first, at, out)
                }
                None => 0,
            };
            let out = &mut out[done * tokens..];
            let first = first + done;
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
                // rows unpacked to f32 a tile at a time, each tile multiplied with every token
                let cols = self.cols;
                let mut rows = vec![0.0f32; f32_tiles::ROWS * cols];
                for (i, out) in out.chunks_mut(f32_tiles::ROWS * tokens).enumerate() {
                    let k = out.len() / tokens;
                    for (j, row) in rows.chunks_exact_mut(cols).take(k).enumerate() {
                        let r = first + i * f32_tiles::ROWS + j;
                        let bytes = &self.data[r * self.row_bytes..][..self.row_bytes];
                        // The length was checked at construction.
                        let _ = crate::dtype::dequantize_into(self.dtype, bytes, row, "row");
                    }
                    f32_tiles::rows_times_tokens(&rows[..k * cols], cols, x, out);
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
