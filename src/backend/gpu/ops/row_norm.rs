//! Norms of whole rows outside a linear layer (`shaders/row_norm.wgsl`): for Gemma 3 the RMS
//! norm of each query and key head (QK-norm, in place) and of a sub-layer's output added into
//! the residual stream; for BERT the LayerNorm of the residual stream in place (its
//! post-norms). One invocation per row.

use crate::backend::gpu::host_struct::host_struct;
use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::{
    check_distinct, check_len, check_max_tokens, check_step, dispatch_grid, elements, load,
    positive, Grid, KernelBinding,
};
use crate::backend::gpu::device::GpuContext;
use crate::backend::gpu::kernels::{self, Defines, KernelCache};
use crate::error::{Error, Result};

/// Invocations per workgroup: small, since decode has a handful of rows per token.
const ROW_NORM_WG: u32 = 8;

host_struct! {
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Pod, Zeroable)]
    pub(crate) struct RowNormParams {
        width: u32,
        rows: u32,
        stride: u32,
        eps: f32,
    }
}

/// Which row norm a [`RowNorm`] computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowNormKind {
    /// `data[t, h, :] = rms(data[t, h, :]) · w` in place, for every head `h` of every token.
    Heads,
    /// `dst[t, :] += rms(src[t, :]) · w`.
    AddInto,
    /// `data[t, :] = layer_norm(data[t, :]) · w + b` in place (BERT's post-norms).
    Layer,
}

/// A norm over rows of `width` values with a `[width]` gain, in the kind it was built for.
#[derive(Debug, Clone)]
pub struct RowNorm {
    pipeline: Arc<wgpu::ComputePipeline>,
    kind: RowNormKind,
}

impl RowNorm {
    /// Builds (or fetches from `cache`) the kernel of `kind`.
    pub async fn new(ctx: &GpuContext, cache: &KernelCache, kind: RowNormKind) -> Result<Self> {
        let defines = Defines::new()
            .value("WG_SIZE", format!("{ROW_NORM_WG}u"))
            .flag_if("ADD", kind == RowNormKind::AddInto)
            .flag_if("LAYER", kind == RowNormKind::Layer);
        let pipeline = load(ctx, cache, &kernels::ROW_NORM, "row_norm", defines).await?;
        Ok(Self { pipeline, kind })
    }

    fn params(
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        weight: &wgpu::Buffer,
        (width, rows, stride): (u32, u32, u32),
        eps: f32,
        max_tokens: u32,
    ) -> Result<(RowNormParams, u64)> {
        check_step(step)?;
        check_max_tokens(ctx, max_tokens)?;
        positive("width", width)?;
        positive("rows", rows)?;
        if u64::from(rows) * u64::from(width) > u64::from(stride) {
            return Err(Error::invalid(
                "stride",
                format!("{rows} rows of {width} do not fit a token's {stride} values"),
            ));
        }
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(Error::invalid(
                "eps",
                format!("{eps} must be finite and >= 0"),
            ));
        }
        check_len("weight", weight, u64::from(width))?;
        let total = elements("stride", max_tokens, u64::from(stride))?;
        let params = RowNormParams {
            width,
            rows,
            stride,
            eps,
        };
        Ok((params, total))
    }

    fn binding(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        params: RowNormParams,
        storage: &[&wgpu::Buffer],
    ) -> Result<KernelBinding> {
        let (x, y) = dispatch_grid(ctx, "row_norm", params.rows.div_ceil(ROW_NORM_WG))?;
        if y != 1 {
            return Err(Error::invalid("rows", "too many rows per token"));
        }
        let label = match self.kind {
            RowNormKind::Heads => "head_norm",
            RowNormKind::AddInto => "add_normed",
            RowNormKind::Layer => "layer_norm",
        };
        Ok(KernelBinding::new(
            ctx,
            &self.pipeline,
            label,
            &params,
            Some(step),
            storage,
            Grid::PerToken(x),
        ))
    }

    /// Binds the in-place norm of `heads` heads of `head_dim` values per token in
    /// `data: [max_tokens, stride]` f32 (heads at offsets `h · head_dim`), gain
    /// `weight: [head_dim]`. Built as [`RowNormKind::Heads`].
    #[allow(clippy::too_many_arguments)]
    pub fn bind_heads(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        data: &wgpu::Buffer,
        weight: &wgpu::Buffer,
        (heads, head_dim, stride): (u32, u32, u32),
        eps: f32,
        max_tokens: u32,
    ) -> Result<KernelBinding> {
        if self.kind != RowNormKind::Heads {
            return Err(Error::invalid("kind", "not built to normalise heads"));
        }
        let (params, total) = Self::params(
            ctx,
            step,
            weight,
            (head_dim, heads, stride),
            eps,
            max_tokens,
        )?;
        check_len("data", data, total)?;
        check_distinct("data", data, "weight", weight)?;
        self.binding(ctx, step, params, &[weight, data])
    }

    /// Binds `dst[t, :] += rms(src[t, :]) · weight` over `src, dst: [max_tokens, width]` f32,
    /// `weight: [width]`. Built as [`RowNormKind::AddInto`].
    #[allow(clippy::too_many_arguments)]
    pub fn bind_add(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        src: &wgpu::Buffer,
        dst: &wgpu::Buffer,
        weight: &wgpu::Buffer,
        (width, eps): (u32, f32),
        max_tokens: u32,
    ) -> Result<KernelBinding> {
        if self.kind != RowNormKind::AddInto {
            return Err(Error::invalid("kind", "not built to add into a residual"));
        }
        let (params, total) = Self::params(ctx, step, weight, (width, 1, width), eps, max_tokens)?;
        check_len("src", src, total)?;
        check_len("dst", dst, total)?;
        check_distinct("dst", dst, "src", src)?;
        check_distinct("dst", dst, "weight", weight)?;
        self.binding(ctx, step, params, &[weight, src, dst])
    }

    /// Binds the in-place LayerNorm of every token's row of `data: [max_tokens, width]` f32,
    /// gain `weight` and shift `bias` `[width]` f32. Built as [`RowNormKind::Layer`].
    #[allow(clippy::too_many_arguments)]
    pub fn bind_layer(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        data: &wgpu::Buffer,
        weight: &wgpu::Buffer,
        bias: &wgpu::Buffer,
        (width, eps): (u32, f32),
        max_tokens: u32,
    ) -> Result<KernelBinding> {
        if self.kind != RowNormKind::Layer {
            return Err(Error::invalid("kind", "not built as a LayerNorm"));
        }
        let (params, total) = Self::params(ctx, step, weight, (width, 1, width), eps, max_tokens)?;
        check_len("data", data, total)?;
        check_len("bias", bias, u64::from(width))?;
        check_distinct("data", data, "weight", weight)?;
        check_distinct("data", data, "bias", bias)?;
        self.binding(ctx, step, params, &[weight, data, bias])
    }
}
