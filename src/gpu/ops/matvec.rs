//! f32 matrix × vector (`shaders/matvec.wgsl`).

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::{
    check_len, dispatch_grid, load, optional_input, positive, reduce_defines, Grid, KernelBinding,
    Reduction,
};
use crate::error::Result;
use crate::gpu::device::GpuContext;
use crate::gpu::kernels::{self, KernelCache};

#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
struct MatVecParams {
    rows: u32,
    cols: u32,
    _pad: [u32; 2],
}

/// Rows one `matvec_f32` workgroup computes (must match `ROWS` in `shaders/matvec.wgsl`).
pub const MATVEC_ROWS_PER_WORKGROUP: u32 = 4;

/// `y = W·x (+ bias)` for f32 weights. `w: [rows, cols]` row-major, `x: [cols]`,
/// `y: [rows]`, `bias: [rows]`.
#[derive(Debug, Clone)]
pub struct MatVecF32 {
    pipeline: Arc<wgpu::ComputePipeline>,
    has_bias: bool,
}

impl MatVecF32 {
    /// Builds (or fetches from `cache`) the kernel for the given reduction and bias option.
    pub async fn new(
        ctx: &GpuContext,
        cache: &KernelCache,
        reduction: Reduction,
        has_bias: bool,
    ) -> Result<Self> {
        let defines = reduce_defines(ctx, reduction)?.flag_if("HAS_BIAS", has_bias);
        let pipeline = load(ctx, cache, &kernels::MATVEC, "matvec_f32", defines).await?;
        Ok(Self { pipeline, has_bias })
    }

    /// Binds buffers for one `[rows, cols]` product; checks shapes against buffer sizes.
    #[allow(clippy::too_many_arguments)]
    pub fn bind(
        &self,
        ctx: &GpuContext,
        w: &wgpu::Buffer,
        x: &wgpu::Buffer,
        bias: Option<&wgpu::Buffer>,
        y: &wgpu::Buffer,
        rows: u32,
        cols: u32,
    ) -> Result<KernelBinding> {
        positive("rows", rows)?;
        positive("cols", cols)?;
        check_len("w", w, u64::from(rows) * u64::from(cols))?;
        check_len("x", x, u64::from(cols))?;
        check_len("y", y, u64::from(rows))?;
        let mut storage = vec![w, x, y];
        if let Some(b) = optional_input("bias", "bias", self.has_bias, bias)? {
            check_len("bias", b, u64::from(rows))?;
            storage.push(b);
        }
        let grid = dispatch_grid(ctx, "matvec_f32", rows.div_ceil(MATVEC_ROWS_PER_WORKGROUP))?;
        let params = MatVecParams {
            rows,
            cols,
            _pad: [0; 2],
        };
        Ok(KernelBinding::new(
            ctx,
            &self.pipeline,
            "matvec_f32",
            &params,
            None,
            &storage,
            Grid::Fixed(grid.0, grid.1),
        ))
    }
}
