//! Normalisations (`shaders/norm.wgsl`).

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::{
    check_len, dispatch_grid, load, positive, reduce_defines, Grid, KernelBinding, Reduction,
};
use crate::error::{Error, Result};
use crate::gpu::device::GpuContext;
use crate::gpu::kernels::{self, KernelCache};

#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
struct NormParams {
    n: u32,
    n_rows: u32,
    eps: f32,
    _pad: u32,
}

/// RMSNorm over the last dimension: `y[i, :] = x[i, :] / sqrt(mean(x[i, :]²) + eps) * weight`.
/// `x, y: [n_rows, n]`, `weight: [n]`.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    pipeline: Arc<wgpu::ComputePipeline>,
}

impl RmsNorm {
    /// Builds (or fetches from `cache`) the kernel for the given reduction.
    pub async fn new(ctx: &GpuContext, cache: &KernelCache, reduction: Reduction) -> Result<Self> {
        let defines = reduce_defines(ctx, reduction)?;
        let pipeline = load(ctx, cache, &kernels::NORM, "rms_norm", defines).await?;
        Ok(Self { pipeline })
    }

    /// Binds buffers for `n_rows` rows of length `n`; checks shapes and `eps`.
    #[allow(clippy::too_many_arguments)]
    pub fn bind(
        &self,
        ctx: &GpuContext,
        x: &wgpu::Buffer,
        weight: &wgpu::Buffer,
        y: &wgpu::Buffer,
        n_rows: u32,
        n: u32,
        eps: f32,
    ) -> Result<KernelBinding> {
        positive("n_rows", n_rows)?;
        positive("n", n)?;
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(Error::invalid(
                "eps",
                format!("must be finite and >= 0, got {eps}"),
            ));
        }
        let total = u64::from(n_rows) * u64::from(n);
        check_len("x", x, total)?;
        check_len("weight", weight, u64::from(n))?;
        check_len("y", y, total)?;
        let grid = dispatch_grid(ctx, "rms_norm", n_rows)?;
        let params = NormParams {
            n,
            n_rows,
            eps,
            _pad: 0,
        };
        Ok(KernelBinding::new(
            ctx,
            &self.pipeline,
            "rms_norm",
            &params,
            None,
            &[x, weight, y],
            Grid::Fixed(grid.0, grid.1),
        ))
    }
}
