//! Typed kernels: each op owns its pipeline, checks its arguments against the buffers and the
//! device limits when binding, and records its dispatch into a compute pass. This module holds
//! what every op shares (bindings, grids, per-step parameters, common defines); each kernel
//! family has its own file beside it.

pub mod embed;
pub mod linear;
pub mod matvec;
pub mod norm;

pub use embed::{EmbedSource, Embedding};
pub use linear::{Linear, LinearBinding, LinearKernel};
pub use matvec::{MatVecF32, MATVEC_ROWS_PER_WORKGROUP};
pub use norm::RmsNorm;

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::device::GpuContext;
use super::kernels::{Defines, KernelCache, ShaderFile};
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
pub(crate) fn reduce_defines(ctx: &GpuContext, reduction: Reduction) -> Result<Defines> {
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
pub(crate) fn dispatch_grid(ctx: &GpuContext, what: &str, groups: u32) -> Result<(u32, u32)> {
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
pub(crate) fn check_len(name: &'static str, buffer: &wgpu::Buffer, elements: u64) -> Result<()> {
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

pub(crate) fn positive(name: &'static str, value: u32) -> Result<()> {
    if value == 0 {
        return Err(Error::invalid(name, "must be at least 1"));
    }
    Ok(())
}

/// Values that change with every forward step, written once per step into one uniform buffer
/// that every token-dependent kernel binds at `@binding(1)`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct StepParams {
    /// Position of the step's first token in the sequence.
    pub pos0: u32,
    /// Tokens in this step (1 for decode, the chunk length for prefill).
    pub n_tokens: u32,
    /// Cached positions attention reads after this step's keys are written: `pos0 + n_tokens`.
    pub kv_len: u32,
    /// Padding to 16 bytes.
    pub _pad: u32,
}

impl StepParams {
    /// The parameters of a step of `n_tokens` tokens starting at `pos0`.
    pub fn new(pos0: u32, n_tokens: u32) -> Self {
        Self {
            pos0,
            n_tokens,
            kv_len: pos0 + n_tokens,
            _pad: 0,
        }
    }
}

/// How many workgroups a binding dispatches, possibly depending on the step's token count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grid {
    /// Always `(x, y, 1)`.
    Fixed(u32, u32),
    /// `(x, n_tokens, 1)`: one row of workgroups per token.
    PerToken(u32),
    /// `(x, ceil(n_tokens / tile), 1)`: one row of workgroups per tile of tokens.
    TokenTiles {
        /// Workgroups along x.
        x: u32,
        /// Tokens per tile.
        tile: u32,
    },
}

impl Grid {
    /// The dispatch size for a step of `n_tokens` tokens.
    pub fn size(self, n_tokens: u32) -> (u32, u32, u32) {
        match self {
            Grid::Fixed(x, y) => (x, y, 1),
            Grid::PerToken(x) => (x, n_tokens.max(1), 1),
            Grid::TokenTiles { x, tile } => (x, n_tokens.max(1).div_ceil(tile.max(1)), 1),
        }
    }
}

/// A bound kernel invocation: bind group, its parameter buffer and the workgroup grid.
/// Create once (at load time) and record as often as needed.
///
/// Binding layout every kernel follows: `@binding(0)` its own parameters (uniform, written
/// once here), then `@binding(1)` the shared [`StepParams`] uniform when the kernel depends on
/// the step, then its storage buffers in order.
#[derive(Debug)]
pub struct KernelBinding {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind_group: wgpu::BindGroup,
    grid: Grid,
    _params: wgpu::Buffer,
}

impl KernelBinding {
    /// Binds `params` (a new uniform buffer), the optional `step` uniform and `storage`.
    pub fn new<P: Pod>(
        ctx: &GpuContext,
        pipeline: &Arc<wgpu::ComputePipeline>,
        label: &str,
        params: &P,
        step: Option<&wgpu::Buffer>,
        storage: &[&wgpu::Buffer],
        grid: Grid,
    ) -> Self {
        let params_buffer = ctx.uniform_from(label, params);
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: params_buffer.as_entire_binding(),
        }];
        let first_storage = match step {
            Some(step) => {
                entries.push(wgpu::BindGroupEntry {
                    binding: 1,
                    resource: step.as_entire_binding(),
                });
                2u32
            }
            None => 1u32,
        };
        entries.extend(
            storage
                .iter()
                .zip(first_storage..)
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

    /// Records the dispatch into `pass` for a step of `n_tokens` tokens (ignored by fixed
    /// grids).
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        let (x, y, z) = self.grid.size(n_tokens);
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(x, y, z);
    }

    /// The grid this binding dispatches.
    pub fn grid(&self) -> Grid {
        self.grid
    }
}

pub(crate) async fn load(
    ctx: &GpuContext,
    cache: &KernelCache,
    file: &ShaderFile,
    entry: &'static str,
    defines: Defines,
) -> Result<Arc<wgpu::ComputePipeline>> {
    cache.pipeline(ctx, file, entry, &defines).await
}
