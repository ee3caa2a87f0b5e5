//! Model tensors on the GPU, in their stored format (a Q4_1 matrix stays Q4_1).
//!
//! A matrix larger than one storage binding ([`GpuContext::binding_limit`]: 128 MiB on many
//! adapters, while a 262,144-token vocabulary's embedding is 178 MB in Q8_0) is uploaded as
//! several buffers of whole rows. Kernels that read such a matrix (the LM head, the embedding
//! gather) dispatch once per part; every other kernel refuses a split tensor by name.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::model::weights::Tensor;

use super::device::GpuContext;

/// One buffer of a tensor: rows `first_row .. first_row + rows` of a matrix (the whole tensor
/// for a tensor that fits one binding).
#[derive(Debug)]
pub struct RowPart {
    /// The part's bytes as stored, padded with zeros to a multiple of 4.
    pub buffer: wgpu::Buffer,
    /// The matrix row the part starts at.
    pub first_row: u32,
    /// Rows the part holds.
    pub rows: u32,
}

/// A tensor in storage buffers: its bytes as stored (padded with zeros to a multiple of 4,
/// so kernels can read `array<u32>`), with its logical shape and type.
#[derive(Debug)]
pub struct GpuTensor {
    /// The buffer (STORAGE | COPY_SRC | COPY_DST): the whole tensor, or the first row part of
    /// a split one.
    pub buffer: wgpu::Buffer,
    /// Logical shape, outermost first (matrices `[out, in]`).
    pub shape: Vec<usize>,
    /// Storage type.
    pub dtype: DType,
    /// The row parts after the first, for a matrix split across bindings (empty otherwise).
    pub rest: Vec<RowPart>,
    /// Rows in [`Self::buffer`] (all of them unless split).
    pub first_rows: u32,
}

/// `data` padded with zeros to a multiple of 4 bytes.
fn padded(data: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    if data.len().is_multiple_of(4) {
        std::borrow::Cow::Borrowed(data)
    } else {
        let mut v = data.to_vec();
        v.resize(data.len().div_ceil(4) * 4, 0);
        std::borrow::Cow::Owned(v)
    }
}

/// Rows per part of a matrix whose rows hold `row_bytes` bytes each, under a binding limit of
/// `limit` bytes (padding included): whole rows, as many as fit, an even number where more
/// than one fits (interleaved gate and up rows stay in one part).
pub fn rows_per_part(row_bytes: u64, limit: u64) -> u64 {
    if row_bytes == 0 {
        return u64::MAX;
    }
    // the last part is padded by up to 3 bytes
    let fit = limit.saturating_sub(3) / row_bytes;
    if fit > 1 {
        fit & !1
    } else {
        fit
    }
}

impl GpuTensor {
    /// Uploads `tensor` as `name`. A matrix larger than one storage binding is split by rows
    /// into parts that fit; a tensor that cannot be split (a vector, or a single row larger
    /// than a binding) is an error that names it, its size and the limit (nothing is allocated
    /// then).
    pub fn upload(ctx: &GpuContext, name: &str, tensor: &Tensor<'_>) -> Result<Self> {
        let bytes = tensor.data.len() as u64;
        let limit = ctx.binding_limit();
        let too_large = |needed: u64| Error::Limit {
            what: format!("tensor `{name}` ({} {:?})", tensor.dtype, tensor.shape),
            limit: "maxStorageBufferBindingSize",
            needed,
            allowed: limit,
        };
        let rows = match tensor.shape.as_slice() {
            [rows, _] => *rows as u64,
            _ => 1,
        };
        if bytes <= limit {
            return Ok(Self {
                buffer: ctx.storage_from(name, &padded(&tensor.data))?,
                shape: tensor.shape.clone(),
                dtype: tensor.dtype,
                rest: Vec::new(),
                first_rows: rows as u32,
            });
        }
        if tensor.shape.len() != 2 || rows == 0 || !bytes.is_multiple_of(rows) {
            return Err(too_large(bytes));
        }
        let row_bytes = bytes / rows;
        let per_part = rows_per_part(row_bytes, limit);
        if per_part == 0 {
            return Err(too_large(row_bytes));
        }
        let mut parts = Vec::new();
        let mut first = 0u64;
        while first < rows {
            let n = per_part.min(rows - first);
            let range = (first * row_bytes) as usize..((first + n) * row_bytes) as usize;
            let label = format!("{name} rows {first}..{}", first + n);
            parts.push(RowPart {
                buffer: ctx.storage_from(&label, &padded(&tensor.data[range]))?,
                first_row: first as u32,
                rows: n as u32,
            });
            first += n;
        }
        let head = parts.remove(0);
        Ok(Self {
            buffer: head.buffer,
            shape: tensor.shape.clone(),
            dtype: tensor.dtype,
            rest: parts,
            first_rows: head.rows,
        })
    }

    /// Number of values.
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the tensor is split across several buffers.
    pub fn is_split(&self) -> bool {
        !self.rest.is_empty()
    }

    /// Every part as `(first row, rows, buffer)`, in row order.
    pub fn parts(&self) -> Vec<(u32, u32, &wgpu::Buffer)> {
        std::iter::once((0, self.first_rows, &self.buffer))
            .chain(self.rest.iter().map(|p| (p.first_row, p.rows, &p.buffer)))
            .collect()
    }

    /// Bytes of every buffer together.
    pub fn buffer_bytes(&self) -> u64 {
        self.buffer.size() + self.rest.iter().map(|p| p.buffer.size()).sum::<u64>()
    }

    /// An error for a kernel that reads `what` as one binding when the tensor is split.
    pub fn whole(&self, what: &'static str) -> Result<&wgpu::Buffer> {
        match self.is_split() {
            false => Ok(&self.buffer),
            true => Err(Error::invalid(
                what,
                format!(
                    "a {} {:?} tensor split across {} bindings cannot be read by this kernel",
                    self.dtype,
                    self.shape,
                    self.rest.len() + 1
                ),
            )),
        }
    }
}
