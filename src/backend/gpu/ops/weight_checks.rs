//! Argument checks shared by the weight-reading kernels (linear layers, embeddings): the
//! weight type's shader flag, matrix shapes against their buffers, activation sizes and a Q/K/V
//! layer's KV-cache binding (the step uniform is checked by [`super::check_step`]).

use crate::backend::gpu::tensor::GpuTensor;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The `quant.wgsl` flag selecting `dtype`.
pub(crate) fn weight_flag(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "WEIGHT_F32",
        DType::F16 => "WEIGHT_F16",
        DType::BF16 => "WEIGHT_BF16",
        DType::Q8_0 => "WEIGHT_Q8_0",
        DType::Q4_0 => "WEIGHT_Q4_0",
        DType::Q4_1 => "WEIGHT_Q4_1",
        DType::Q5_0 => "WEIGHT_Q5_0",
        DType::Q5_1 => "WEIGHT_Q5_1",
        DType::Q4_K => "WEIGHT_Q4_K",
        DType::Q5_K => "WEIGHT_Q5_K",
        DType::Q6_K => "WEIGHT_Q6_K",
    }
}

/// Checks `w` against the kernel's type and returns `(rows, cols)` from its shape `[rows, cols]`:
/// both at least 1, `cols` a whole number of blocks, the buffer large enough, and every byte
/// offset within u32 (the kernels address the tensor in bytes).
pub(crate) fn matrix_shape(w: &GpuTensor, dtype: DType, name: &'static str) -> Result<(u32, u32)> {
    if w.dtype != dtype {
        return Err(Error::invalid(
            name,
            format!("tensor is {} but the kernel was built for {dtype}", w.dtype),
        ));
    }
    let &[rows, cols] = w.shape.as_slice() else {
        return Err(Error::invalid(
            name,
            format!("expected a matrix [rows, cols], got shape {:?}", w.shape),
        ));
    };
    let to_u32 = |what: &str, v: usize| {
        u32::try_from(v).map_err(|_| Error::invalid(name, format!("{what} {v} exceeds u32")))
    };
    let (rows, cols) = (to_u32("rows", rows)?, to_u32("cols", cols)?);
    if rows == 0 || cols == 0 {
        return Err(Error::invalid(
            name,
            format!("shape {:?} is empty", w.shape),
        ));
    }
    let block = dtype.block_elements();
    if !u64::from(cols).is_multiple_of(block) {
        return Err(Error::invalid(
            name,
            format!("cols {cols} is not a multiple of the {dtype} block size {block}"),
        ));
    }
    let bytes = dtype.bytes_for(u64::from(rows) * u64::from(cols), name)?;
    let mut next_row = 0u32;
    for (first_row, part_rows, buffer) in w.parts() {
        let part = dtype.bytes_for(u64::from(part_rows) * u64::from(cols), name)?;
        if first_row != next_row || buffer.size() < part {
            return Err(Error::invalid(
                name,
                format!(
                    "buffer of rows {first_row}..{} holds {} bytes but [{part_rows}, {cols}] \
                     {dtype} needs {part}",
                    first_row + part_rows,
                    buffer.size()
                ),
            ));
        }
        next_row += part_rows;
    }
    if next_row != rows {
        return Err(Error::invalid(
            name,
            format!("its parts hold {next_row} rows, the shape {rows}"),
        ));
    }
    // Byte addresses of blocks (and, for F32, element indices) are u32 in the kernels.
    if bytes > u64::from(u32::MAX) {
        return Err(Error::invalid(
            name,
            format!("{bytes} bytes: kernels address at most 4 GiB per tensor"),
        ));
    }
    Ok((rows, cols))
}

/// Fails unless `buffer` holds at least `elements` 4-byte values; `what` names the shape and
/// type for the message (`[8, 576] f32`).
pub(crate) fn check_words(
    name: &'static str,
    buffer: &wgpu::Buffer,
    elements: u64,
    what: &str,
) -> Result<()> {
    let needed = elements * 4;
    if buffer.size() < needed {
        return Err(Error::invalid(
            name,
            format!(
                "buffer holds {} bytes but {what} needs {needed}",
                buffer.size()
            ),
        ));
    }
    Ok(())
}
