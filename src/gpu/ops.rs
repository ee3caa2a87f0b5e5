//! Typed kernels: each op owns its pipeline, checks its arguments against the buffers and the
//! device limits when binding, and records its dispatch into a compute pass.

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::device::GpuContext;
use super::kernels::{self, Defines, KernelCache, ShaderFile};
use crate::error::{Error, Result};

/// Largest workgroup the kernels are written for.
const MAX_WG_SIZE: u32 = 256;

/// How a kernel reduces across its workgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    /// Shared-memory tree; works everywhere.
    Workgroup,
    /// `subgroupAdd` first, shared memory for one partial per subgroup; needs `subgroups`.
    Subgroup,
}

impl Reduction {
    /// The fastest reduction the device supports.
    pub fn best(ctx: &GpuContext) -> Self {
        if ctx.has_subgroups() {
            Reduction::Subgroup
        } else {
            Reduction::Workgroup
        }
    }
}

/// Defines every reducing kernel needs: `WG_SIZE` (the largest power of two the device allows,
/// up to 256) and `SUBGROUPS` when asked for.
fn reduce_defines(ctx: &GpuContext, reduction: Reduction) -> Result<Defines> {
    if reduction == Reduction::Subgroup && !ctx.has_subgroups() {
        return Err(Error::invalid(
            "reduction",
            "subgroup reduction asked for, but the device has no `subgroups` feature",
        ));
    }
    let limits = ctx.limits();
    let cap = MAX_WG_SIZE
        .min(limits.max_compute_invocations_per_workgroup)
        .min(limits.max_compute_workgroup_size_x)
        .max(1);
    let wg_size = 1u32 << (31 - cap.leading_zeros());
    Ok(Defines::new()
        .value("WG_SIZE", format!("{wg_size}u"))
        .flag_if("SUBGROUPS", reduction == Reduction::Subgroup))
}

/// Spreads `groups` workgroups over x and y within `maxComputeWorkgroupsPerDimension`.
fn dispatch_grid(ctx: &GpuContext, what: &str, groups: u32) -> Result<(u32, u32)> {
    let max = ctx.limits().max_compute_workgroups_per_dimension.max(1);
    let x = groups.clamp(1, max);
    let y = groups.div_ceil(x);
    if y > max {
        return Err(Error::Limit {
            what: what.to_string(),
            limit: "maxComputeWorkgroupsPerDimension",
            needed: u64::from(y),
            allowed: u64::from(max),
        });
    }
    Ok((x, y))
}

/// Fails unless `buffer` holds at least `elements` f32 values.
fn check_len(name: &'static str, buffer: &wgpu::Buffer, elements: u64) -> Result<()> {
    let needed = elements * 4;
    if buffer.size() < needed {
        return Err(Error::invalid(
            name,
            format!(
                "buffer holds {} bytes but the shape needs {needed} ({elements} f32)",
                buffer.size()
            ),
        ));
    }
    Ok(())
}

fn positive(name: &'static str, value: u32) -> Result<()> {
    if value == 0 {
        return Err(Error::invalid(name, "must be at least 1"));
    }
    Ok(())
}

/// A bound kernel invocation: bind group, its parameter buffer and the workgroup grid.
/// Create once (at load time) and record as often as needed.
#[derive(Debug)]
pub struct KernelBinding {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind_group: wgpu::BindGroup,
    grid: (u32, u32),
    _params: wgpu::Buffer,
}

impl KernelBinding {
    fn new<P: Pod>(
        ctx: &GpuContext,
        pipeline: &Arc<wgpu::ComputePipeline>,
        label: &str,
        params: &P,
        storage: &[&wgpu::Buffer],
        grid: (u32, u32),
    ) -> Self {
        let params_buffer = ctx.uniform_from(label, params);
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: params_buffer.as_entire_binding(),
        }];
        entries.extend(
            storage
                .iter()
                .zip(1u32..)
                .map(|(b, i)| wgpu::BindGroupEntry {
                    binding: i,
                    resource: b.as_entire_binding(),
                }),
        );
        let bind_group = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(label),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        Self {
            pipeline: Arc::clone(pipeline),
            bind_group,
            grid,
            _params: params_buffer,
        }
    }

    /// Records the dispatch into `pass`.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>) {
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(self.grid.0, self.grid.1, 1);
    }
}

async fn load(
    ctx: &GpuContext,
    cache: &KernelCache,
    file: &ShaderFile,
    entry: &'static str,
    defines: Defines,
) -> Result<Arc<wgpu::ComputePipeline>> {
    cache.pipeline(ctx, file, entry, &defines).await
}

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
        match (self.has_bias, bias) {
            (true, Some(b)) => {
                check_len("bias", b, u64::from(rows))?;
                storage.push(b);
            }
            (false, None) => {}
            (true, None) => {
                return Err(Error::invalid("bias", "kernel built with bias, none given"))
            }
            (false, Some(_)) => {
                return Err(Error::invalid(
                    "bias",
                    "kernel built without bias, one given",
                ))
            }
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
            &storage,
            grid,
        ))
    }
}

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
            &[x, weight, y],
            grid,
        ))
    }
}
