//! Model tensors on the GPU, in their stored format (a Q4_1 matrix stays Q4_1).

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::model::weights::Tensor;

use super::device::GpuContext;

/// A tensor in one storage buffer: its bytes as stored (padded with zeros to a multiple of 4,
/// so kernels can read `array<u32>`), with its logical shape and type.
#[derive(Debug)]
pub struct GpuTensor {
    /// The buffer (STORAGE | COPY_SRC | COPY_DST).
    pub buffer: wgpu::Buffer,
    /// Logical shape, outermost first (matrices `[out, in]`).
    pub shape: Vec<usize>,
    /// Storage type.
    pub dtype: DType,
}

impl GpuTensor {
    /// Uploads `tensor` as `name`; a tensor larger than one storage binding is an error that
    /// names it, its size and the limit (nothing is allocated then).
    pub fn upload(ctx: &GpuContext, name: &str, tensor: &Tensor<'_>) -> Result<Self> {
        let bytes = tensor.data.len() as u64;
        let limit = ctx.limits().max_storage_buffer_binding_size;
        if bytes > limit {
            return Err(Error::Limit {
                what: format!("tensor `{name}` ({} {:?})", tensor.dtype, tensor.shape),
                limit: "maxStorageBufferBindingSize",
                needed: bytes,
                allowed: limit,
            });
        }
        let buffer = if bytes.is_multiple_of(4) {
            ctx.storage_from(name, &tensor.data)?
        } else {
            let mut padded = tensor.data.to_vec();
            padded.resize(padded.len().div_ceil(4) * 4, 0);
            ctx.storage_from(name, &padded)?
        };
        Ok(Self {
            buffer,
            shape: tensor.shape.clone(),
            dtype: tensor.dtype,
        })
    }

    /// Number of values.
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }
}
