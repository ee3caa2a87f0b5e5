//! Normalisations over the last dimension (`shaders/norm.wgsl`), one workgroup per token of
//! the step: RMSNorm (Llama) and LayerNorm with bias (GPT-2).

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::{
    check_distinct, check_len, check_max_tokens, check_step, elements, load, positive,
    reduce_defines, Grid, KernelBinding, Reduction,
};
use crate::error::{Error, Result};
use crate::gpu::device::GpuContext;
use crate::gpu::kernels::{self, KernelCache};

#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
struct NormParams {
    n: u32,
    eps: f32,
    _pad: [u32; 2],
}

/// Checks what both norms share and returns their parameters.
fn norm_params(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    n: u32,
    eps: f32,
    max_tokens: u32,
) -> Result<(NormParams, u64)> {
    check_step(step)?;
    check_max_tokens(ctx, max_tokens)?;
    positive("n", n)?;
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(Error::invalid(
            "eps",
            format!("must be finite and >= 0, got {eps}"),
        ));
    }
    let total = elements("x", max_tokens, u64::from(n))?;
    let params = NormParams {
        n,
        eps,
        _pad: [0; 2],
    };
    Ok((params, total))
}

/// RMSNorm over the last dimension, for the step's tokens:
/// `y[t, :] = x[t, :] / sqrt(mean(x[t, :]²) + eps) · weight` for `t < step.n_tokens`.
/// `x, y: [max_tokens, n]`, `weight: [n]`; `y` is a different buffer from `x` (a buffer
/// bound writable cannot be bound again in the same dispatch).
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

    /// Binds `x, y: [max_tokens, n]` and `weight: [n]` with the [`super::StepParams`] uniform
    /// `step`; checks shapes against the buffers, and `eps`.
    #[allow(clippy::too_many_arguments)]
    pub fn bind(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        x: &wgpu::Buffer,
        weight: &wgpu::Buffer,
        y: &wgpu::Buffer,
        n: u32,
        eps: f32,
        max_tokens: u32,
    ) -> Result<KernelBinding> {
        let (params, total) = norm_params(ctx, step, n, eps, max_tokens)?;
        check_len("x", x, total)?;
        check_len("weight", weight, u64::from(n))?;
        check_len("y", y, total)?;
        check_distinct("y", y, "x", x)?;
        check_distinct("y", y, "weight", weight)?;
        Ok(KernelBinding::new(
            ctx,
            &self.pipeline,
            "rms_norm",
            &params,
            Some(step),
            &[x, weight, y],
            Grid::PerToken(1),
        ))
    }
}

/// LayerNorm over the last dimension, for the step's tokens:
/// `y[t, :] = (x[t, :] − mean) / sqrt(var + eps) · weight + bias` (population variance, from
/// the deviations in a second pass) for `t < step.n_tokens`.
/// `x, y: [max_tokens, n]`, `weight, bias: [n]`; `y` is a different buffer from `x`.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    pipeline: Arc<wgpu::ComputePipeline>,
}

impl LayerNorm {
    /// Builds (or fetches from `cache`) the kernel for the given reduction.
    pub async fn new(ctx: &GpuContext, cache: &KernelCache, reduction: Reduction) -> Result<Self> {
        let defines = reduce_defines(ctx, reduction)?;
        let pipeline = load(ctx, cache, &kernels::NORM, "layer_norm", defines).await?;
        Ok(Self { pipeline })
    }

    /// Binds `x, y: [max_tokens, n]`, `weight, bias: [n]` with the [`super::StepParams`]
    /// uniform `step`; checks shapes against the buffers, and `eps`.
    #[allow(clippy::too_many_arguments)]
    pub fn bind(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        x: &wgpu::Buffer,
        weight: &wgpu::Buffer,
        bias: &wgpu::Buffer,
        y: &wgpu::Buffer,
        n: u32,
        eps: f32,
        max_tokens: u32,
    ) -> Result<KernelBinding> {
        let (params, total) = norm_params(ctx, step, n, eps, max_tokens)?;
        check_len("x", x, total)?;
        check_len("weight", weight, u64::from(n))?;
        check_len("bias", bias, u64::from(n))?;
        check_len("y", y, total)?;
        for (name, other) in [("x", x), ("weight", weight), ("bias", bias)] {
            check_distinct("y", y, name, other)?;
        }
        Ok(KernelBinding::new(
            ctx,
            &self.pipeline,
            "layer_norm",
            &params,
            Some(step),
            &[x, weight, y, bias],
            Grid::PerToken(1),
        ))
    }
}
