//! Typed kernels: each op owns its pipeline, checks its arguments against the buffers and the
//! device limits when binding, and records its dispatch into a compute pass. This module holds
//! what every op shares (bindings, grids, per-step parameters, common defines); each kernel
//! family has its own file beside it.

pub mod attention;
mod checks;
pub mod copy;
pub mod elementwise;
pub mod embed;
#[cfg(all(test, not(target_arch = "wasm32")))]
mod host_structs;
pub mod kv_store;
pub mod linear;
pub mod rope;
pub mod row_norm;
pub mod select;
mod weight_checks;

pub use super::key_split::Heads;
pub use attention::{Attention, AttentionBinding, AttentionKeys, KeySplit};
pub use copy::{copy_bandwidth, CopyBandwidth};
pub use elementwise::SwiGlu;
pub use embed::{EmbedSource, Embedding};
pub use kv_store::{KvSource, KvStore};
pub use linear::{
    Epilogue, InputNorm, KvWriteBinding, Linear, LinearBinding, LinearKernel, LinearOptions,
    NormBinding,
};
pub use rope::{Qkv, RopeKvWrite};
pub use row_norm::{RowNorm, RowNormKind};
pub use select::Select;

pub(crate) use checks::{
    check_distinct, check_f16_activations, check_len, check_max_tokens, check_step, elements,
    optional_input, positive,
};

use crate::backend::gpu::host_struct::host_struct;
use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::counters::{AliveBuffers, CounterCells};
use super::device::GpuContext;
use super::kernels::{Defines, KernelCache, ShaderFile};
use crate::error::{Error, Result};

/// Largest workgroup the kernels are written for.
const MAX_WG_SIZE: u32 = 256;

pub use super::variants::attention::MAX_HEAD_DIM;

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

/// The workgroup size kernels use: the largest power of two the device allows, up to 256.
pub(crate) fn wg_size(ctx: &GpuContext) -> u32 {
    pow2_invocations(ctx, MAX_WG_SIZE)
}

/// The largest power of two up to `max` that the device allows as a workgroup's invocations
/// (along x).
pub(crate) fn pow2_invocations(ctx: &GpuContext, max: u32) -> u32 {
    let limits = ctx.limits();
    let cap = max
        .min(limits.max_compute_invocations_per_workgroup)
        .min(limits.max_compute_workgroup_size_x)
        .max(1);
    1u32 << (31 - cap.leading_zeros())
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
    Ok(Defines::new()
        .value("WG_SIZE", format!("{}u", wg_size(ctx)))
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

/// Tokens a batched step holds at most (`STEP_ROWS` in `shaders/lib/step.wgsl`): one row of
/// the step uniform per token.
pub const STEP_ROWS: usize = 64;

host_struct! {
    /// Values that change with every forward step, written once per step into one uniform buffer
    /// that every token-dependent kernel binds at `@binding(1)`, followed by [`STEP_ROWS`]
    /// [`StepRow`]s.
    ///
    /// A step is either one run of one sequence (`batched == 0`: token `t` at position
    /// `pos0 + t`, its sequence's cache rows starting at row 0's `base`), or one token of each of
    /// several sequences (`batched == 1`: token `t` at row `t`'s position and base).
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Pod, Zeroable)]
    pub struct StepParams {
        /// Position of the step's first token in the sequence (unbatched steps).
        pub pos0: u32,
        /// Tokens in this step (1 for decode, the chunk length for prefill, the sequences of a
        /// batched step).
        pub n_tokens: u32,
        /// Cached positions attention reads after this step's keys are written: `pos0 + n_tokens`,
        /// the most of any sequence for a batched step.
        pub kv_len: u32,
        /// 1 when every token has its own [`StepRow`].
        pub batched: u32,
    }
}

host_struct! {
    /// Where one token of a step lives: its position in its sequence, the sequence's KV slot, and
    /// the first row of that slot in the caches of layers that keep every position (there,
    /// position `p` is cache row `base + p`; in a local layer's ring of `ring` rows it is row
    /// `slot · ring + p mod ring`).
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Pod, Zeroable)]
    pub struct StepRow {
        /// Position in the sequence.
        pub pos: u32,
        /// The sequence's first cache row in layers that keep every position.
        pub base: u32,
        /// The sequence's KV slot.
        pub slot: u32,
        /// Padding to 16 bytes.
        pub _pad: u32,
    }
}

impl StepRow {
    /// Position `pos` of the sequence in slot `slot`, whose rows start at `base` in layers that
    /// keep every position.
    pub fn new(pos: u32, slot: u32, base: u32) -> Self {
        Self {
            pos,
            base,
            slot,
            _pad: 0,
        }
    }
}

/// Bytes of the step uniform: the header and [`STEP_ROWS`] rows.
pub const STEP_UNIFORM_BYTES: u64 =
    (std::mem::size_of::<StepParams>() + STEP_ROWS * std::mem::size_of::<StepRow>()) as u64;

impl StepParams {
    /// The parameters of a step of `n_tokens` tokens starting at `pos0`.
    pub fn new(pos0: u32, n_tokens: u32) -> Self {
        Self {
            pos0,
            n_tokens,
            kv_len: pos0 + n_tokens,
            batched: 0,
        }
    }

    /// Like [`Self::new`], but checked against the buffers the step's kernels were bound
    /// with: `1 ≤ n_tokens ≤ max_tokens` and `pos0 + n_tokens ≤ max_positions` (the KV cache
    /// rows). Kernels cannot report errors, so out-of-range steps must be refused here: a
    /// kernel given one anyway skips the rows that do not exist rather than writing past them.
    pub fn checked(pos0: u32, n_tokens: u32, max_tokens: u32, max_positions: u32) -> Result<Self> {
        if n_tokens == 0 || n_tokens > max_tokens {
            return Err(Error::invalid(
                "n_tokens",
                format!("must be in 1..={max_tokens} (the bound max_tokens), got {n_tokens}"),
            ));
        }
        match pos0.checked_add(n_tokens) {
            Some(end) if end <= max_positions => Ok(Self::new(pos0, n_tokens)),
            _ => Err(Error::invalid(
                "pos0",
                format!(
                    "positions {pos0}..{pos0}+{n_tokens} do not fit in the {max_positions} cached positions"
                ),
            )),
        }
    }

    /// A batched step of one token per row (`rows.len()` tokens), checked like
    /// [`Self::checked`]: at most `max_tokens` and [`STEP_ROWS`] rows, every position below
    /// `max_positions` (the positions one sequence's cache holds).
    pub fn batched(rows: &[StepRow], max_tokens: u32, max_positions: u32) -> Result<Self> {
        let limit = max_tokens.min(STEP_ROWS as u32);
        if rows.is_empty() || rows.len() > limit as usize {
            return Err(Error::invalid(
                "batch",
                format!(
                    "a batched step holds 1..={limit} sequences, got {}",
                    rows.len()
                ),
            ));
        }
        if let Some(r) = rows.iter().find(|r| r.pos >= max_positions) {
            return Err(Error::invalid(
                "pos",
                format!(
                    "position {} does not fit in the {max_positions} cached positions",
                    r.pos
                ),
            ));
        }
        Ok(Self {
            pos0: 0,
            n_tokens: rows.len() as u32,
            kv_len: rows.iter().map(|r| r.pos + 1).max().unwrap_or(1),
            batched: 1,
        })
    }

    /// A uniform buffer for step parameters that [`Self::write`] can update every step.
    pub fn create_buffer(ctx: &GpuContext, label: &str) -> wgpu::Buffer {
        ctx.counter_cells().buffer_created(STEP_UNIFORM_BYTES);
        ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: STEP_UNIFORM_BYTES,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// Queues a write of these parameters into `buffer` (seen by the next submit), for a
    /// sequence whose cache rows start at row 0.
    pub fn write(&self, ctx: &GpuContext, buffer: &wgpu::Buffer) {
        self.write_rows(ctx, buffer, &[StepRow::new(self.pos0, 0, 0)]);
    }

    /// Queues a write of these parameters and `rows` (one per token of a batched step; for an
    /// unbatched step, one row whose `base` is the sequence's first cache row).
    pub fn write_rows(&self, ctx: &GpuContext, buffer: &wgpu::Buffer, rows: &[StepRow]) {
        let rows = &rows[..rows.len().min(STEP_ROWS)];
        let mut bytes = Vec::with_capacity(16 + 16 * rows.len());
        bytes.extend_from_slice(bytemuck::bytes_of(self));
        bytes.extend_from_slice(bytemuck::cast_slice(rows));
        ctx.queue.write_buffer(buffer, 0, &bytes);
    }
}

impl Heads {
    /// Checks the counts, the grouping and `head_dim ≤ max_head_dim`; errors name the field.
    pub(crate) fn check(&self, max_head_dim: u32) -> Result<()> {
        positive("n_heads", self.n_heads)?;
        positive("n_kv_heads", self.n_kv_heads)?;
        positive("head_dim", self.head_dim)?;
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(Error::invalid(
                "n_kv_heads",
                format!(
                    "must divide n_heads = {}, got {}",
                    self.n_heads, self.n_kv_heads
                ),
            ));
        }
        if self.head_dim > max_head_dim {
            return Err(Error::invalid(
                "head_dim",
                format!("at most {max_head_dim} supported, got {}", self.head_dim),
            ));
        }
        // Kernels index with u32: every row (q, fused qkv) must fit comfortably.
        if self.q_dim() + 2 * self.kv_dim() > u64::from(u32::MAX / 2) {
            return Err(Error::invalid(
                "n_heads",
                "q/k/v widths overflow u32 indexing",
            ));
        }
        Ok(())
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
    label: String,
    pipeline: Arc<wgpu::ComputePipeline>,
    bind_group: wgpu::BindGroup,
    grid: Grid,
    _params: wgpu::Buffer,
    weights: WeightRead,
    counters: Arc<CounterCells>,
    _alive: AliveBuffers,
}

/// Model weights a dispatch binds, for the `weight_bytes_bound` counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightRead {
    /// None (activations, the KV cache).
    None,
    /// A whole tensor of this many bytes (linear layers).
    Whole(u64),
    /// This many bytes per token of the step (embedding rows).
    PerToken(u64),
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
        let first = if step.is_some() { 2u32 } else { 1u32 };
        let numbered: Vec<(u32, &wgpu::Buffer)> = (first..).zip(storage.iter().copied()).collect();
        Self::new_at(ctx, pipeline, label, params, step, &numbered, grid)
    }

    /// [`KernelBinding::new`] with each storage buffer at the binding number given beside it
    /// (kernels whose optional buffers keep fixed numbers).
    pub fn new_at<P: Pod>(
        ctx: &GpuContext,
        pipeline: &Arc<wgpu::ComputePipeline>,
        label: &str,
        params: &P,
        step: Option<&wgpu::Buffer>,
        storage: &[(u32, &wgpu::Buffer)],
        grid: Grid,
    ) -> Self {
        let params_buffer = ctx.uniform_from(label, params);
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: params_buffer.as_entire_binding(),
        }];
        if let Some(step) = step {
            entries.push(wgpu::BindGroupEntry {
                binding: 1,
                resource: step.as_entire_binding(),
            });
        }
        entries.extend(storage.iter().map(|&(i, b)| wgpu::BindGroupEntry {
            binding: i,
            resource: b.as_entire_binding(),
        }));
        ctx.counter_cells().bind_group();
        let bind_group = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(label),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        Self {
            label: label.to_string(),
            pipeline: Arc::clone(pipeline),
            bind_group,
            grid,
            _alive: AliveBuffers::new(ctx.counter_cells(), [params_buffer.size()]),
            _params: params_buffer,
            weights: WeightRead::None,
            counters: Arc::clone(ctx.counter_cells()),
        }
    }

    /// Declares the model weights this binding reads (counted per dispatch).
    pub fn with_weights(mut self, weights: WeightRead) -> Self {
        self.weights = weights;
        self
    }

    /// Records the dispatch into `pass` for a step of `n_tokens` tokens (ignored by fixed
    /// grids).
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        self.record_size(pass, self.grid.size(n_tokens), n_tokens);
    }

    /// Records the dispatch with a grid the caller computed (kernels whose grid depends on
    /// more than the token count, such as split attention's splits along z).
    pub fn record_size(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        (x, y, z): (u32, u32, u32),
        n_tokens: u32,
    ) {
        self.counters.dispatch(self.weight_bytes(n_tokens));
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(x, y, z);
    }

    /// The grid this binding dispatches.
    pub fn grid(&self) -> Grid {
        self.grid
    }

    /// The label it was bound with (the kernel and its shape, `linear Q4_1 [960, 576]`).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Model-weight bytes one dispatch reads for a step of `n_tokens` tokens.
    pub fn weight_bytes(&self, n_tokens: u32) -> u64 {
        match self.weights {
            WeightRead::None => 0,
            WeightRead::Whole(bytes) => bytes,
            WeightRead::PerToken(bytes) => bytes * u64::from(n_tokens.max(1)),
        }
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
