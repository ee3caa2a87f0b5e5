//! Candidate selection for sampling (`shaders/select.wgsl`): one workgroup reads a logits row,
//! applies the step's sparse bias and penalties, and writes the top `k` adjusted logits with
//! their ids and raw values, the raw max and `Σ exp`, and the tail sums: a result of at most
//! [`MAX_RESULT_BYTES`] that a decode step reads back instead of the row.

use crate::backend::gpu::host_struct::host_struct;
use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::{load, wg_size, Grid, KernelBinding, Reduction};
use crate::backend::gpu::counters::AliveBuffers;
use crate::backend::gpu::device::GpuContext;
use crate::backend::gpu::kernels::{self, KernelCache};
use crate::candidates::{
    Candidates, LogitAdjustment, SelectRequest, MAX_ADJUSTMENTS, MAX_CANDIDATES, MAX_RESULT_BYTES,
};
use crate::error::{Error, Result};

/// Invocations of the selection workgroup (one histogram bin and one sort slot each).
const SELECT_WG: u32 = 256;

host_struct! {
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Pod, Zeroable)]
    pub(crate) struct SelectParams {
        capacity: u32,
        offset: u32,
        _pad: [u32; 2],
    }
}

host_struct! {
    /// The per-step uniform (`Request` in the shader).
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
    pub(crate) struct RequestUniform {
        n: u32,
        k: u32,
        n_adjust: u32,
        inv_temp: f32,
        /// 1: `allow` holds the constraint's bitset.
        masked: u32,
        _pad: [u32; 3],
    }
}

host_struct! {
    /// One adjustment as the kernel applies it, in f32: `x + bias`, then `x · pos_scale` when
    /// positive else `x · neg_scale`, then `x − delta`, saturating after each step.
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
    pub(crate) struct GpuAdjust {
        id: u32,
        bias: f32,
        pos_scale: f32,
        neg_scale: f32,
        delta: f32,
        _pad: [u32; 3],
    }
}

impl From<&LogitAdjustment> for GpuAdjust {
    fn from(a: &LogitAdjustment) -> Self {
        let (pos_scale, neg_scale) = match a.repetition {
            Some(r) => ((1.0 / f64::from(r)) as f32, r),
            None => (1.0, 1.0),
        };
        let delta = a.penalty.map_or(0.0, |p| {
            (f64::from(p.presence) + f64::from(p.frequency) * f64::from(p.count)) as f32
        });
        Self {
            id: a.id,
            bias: a.bias.unwrap_or(0.0),
            pos_scale,
            neg_scale,
            delta,
            _pad: [0; 3],
        }
    }
}

/// The selection kernel for rows of up to `capacity` logits, with its buffers: the per-step
/// request uniform, the adjustment list (`[MAX_ADJUSTMENTS]`), the adjusted-row scratch
/// (`[capacity]` f32), the constraint's bitset (`[capacity.div_ceil(32)]` u32) and the result
/// (`MAX_RESULT_BYTES`). Everything is allocated here, once;
/// a step only writes the request and records the dispatch.
#[derive(Debug)]
pub struct Select {
    binding: KernelBinding,
    request: wgpu::Buffer,
    adjust: wgpu::Buffer,
    _work: wgpu::Buffer,
    allow: wgpu::Buffer,
    result: wgpu::Buffer,
    capacity: u32,
    _alive: AliveBuffers,
}

impl Select {
    /// Builds the kernel and its buffers and binds `logits` (read from element 0, at least
    /// `capacity` f32). Devices whose workgroups cannot hold 256 invocations -> Error::Limit.
    pub async fn new(
        ctx: &GpuContext,
        cache: &KernelCache,
        logits: &wgpu::Buffer,
        capacity: u32,
    ) -> Result<Self> {
        Self::for_row(ctx, cache, logits, capacity, 0).await
    }

    /// [`Select::new`] over row `row` of `logits` (`[rows, capacity]`: elements from
    /// `row · capacity` on), for one sequence of a batched step.
    pub async fn for_row(
        ctx: &GpuContext,
        cache: &KernelCache,
        logits: &wgpu::Buffer,
        capacity: u32,
        row: u32,
    ) -> Result<Self> {
        if capacity == 0 {
            return Err(Error::invalid("capacity", "must be at least 1"));
        }
        let offset = row.checked_mul(capacity).ok_or_else(|| {
            Error::invalid("row", format!("row {row} of {capacity} logits overflows"))
        })?;
        super::check_len("logits", logits, u64::from(offset) + u64::from(capacity))?;
        if wg_size(ctx) < SELECT_WG {
            return Err(Error::Limit {
                what: "candidate selection workgroup".to_string(),
                limit: "maxComputeInvocationsPerWorkgroup",
                needed: u64::from(SELECT_WG),
                allowed: u64::from(ctx.limits().max_compute_invocations_per_workgroup),
            });
        }
        let defines = super::reduce_defines(ctx, Reduction::Workgroup)?;
        let pipeline: Arc<wgpu::ComputePipeline> =
            load(ctx, cache, &kernels::SELECT, "select_top_k", defines).await?;
        ctx.counter_cells()
            .buffer_created(std::mem::size_of::<RequestUniform>() as u64);
        let request = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("select request"),
            size: std::mem::size_of::<RequestUniform>() as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let adjust = ctx.storage_zeroed(
            "select adjustments",
            (MAX_ADJUSTMENTS * std::mem::size_of::<GpuAdjust>()) as u64,
        )?;
        let work = ctx.storage_zeroed("select work", u64::from(capacity) * 4)?;
        let result = ctx.storage_zeroed("select result", MAX_RESULT_BYTES as u64)?;
        let allow = ctx.storage_zeroed("select mask", mask_words(capacity) * 4)?;
        let params = SelectParams {
            capacity,
            offset,
            _pad: [0; 2],
        };
        let binding = KernelBinding::new(
            ctx,
            &pipeline,
            "select_top_k",
            &params,
            Some(&request),
            &[logits, &adjust, &work, &result, &allow],
            Grid::Fixed(1, 1),
        );
        let alive = AliveBuffers::new(
            ctx.counter_cells(),
            [
                request.size(),
                adjust.size(),
                work.size(),
                result.size(),
                allow.size(),
            ],
        );
        Ok(Self {
            binding,
            request,
            adjust,
            _work: work,
            allow,
            result,
            capacity,
            _alive: alive,
        })
    }

    /// Bytes of GPU memory the selection allocated (request, adjustments, scratch, mask,
    /// result).
    pub fn bytes(&self) -> u64 {
        self.request.size()
            + self.adjust.size()
            + self._work.size()
            + self.allow.size()
            + self.result.size()
    }

    /// Checks `request` and queues its upload (seen by the next submit). Errors name the field.
    pub fn write(&self, ctx: &GpuContext, request: &SelectRequest) -> Result<()> {
        check_request(request, self.capacity)?;
        let gpu: Vec<GpuAdjust> = request.adjustments.iter().map(GpuAdjust::from).collect();
        let inv_temp = (1.0 / f64::from(request.temperature)).min(f64::from(f32::MAX)) as f32;
        let uniform = RequestUniform {
            n: request.n,
            k: request.k,
            n_adjust: gpu.len() as u32,
            inv_temp,
            masked: u32::from(request.mask.is_some()),
            _pad: [0; 3],
        };
        if let Some(words) = &request.mask {
            ctx.queue
                .write_buffer(&self.allow, 0, bytemuck::cast_slice(words));
        }
        ctx.queue
            .write_buffer(&self.request, 0, bytemuck::bytes_of(&uniform));
        if !gpu.is_empty() {
            ctx.queue
                .write_buffer(&self.adjust, 0, bytemuck::cast_slice(&gpu));
        }
        Ok(())
    }

    /// Records the dispatch (one workgroup).
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>) {
        self.binding.record(pass, 1);
    }

    /// The result buffer (`MAX_RESULT_BYTES`); a step copies its first
    /// [`SelectRequest::result_bytes`] to the CPU.
    pub fn result(&self) -> &wgpu::Buffer {
        &self.result
    }

    /// Parses result bytes read back for `request`.
    pub fn parse(bytes: &[u8], request: &SelectRequest) -> Result<Candidates> {
        let words: Vec<u32> = bytemuck::pod_collect_to_vec(bytes);
        Candidates::from_words(&words, request).ok_or_else(|| Error::Readback {
            buffer: "select result".to_string(),
            message: format!(
                "{} bytes do not hold {} candidates and {} adjustments",
                bytes.len(),
                request.k,
                request.adjustments.len()
            ),
        })
    }
}

/// Rejects requests the kernel cannot serve: `n` in `1..=capacity`, `k` in
/// `1..=min(n, MAX_CANDIDATES)`, a finite temperature > 0, at most `MAX_ADJUSTMENTS`
/// adjustments with strictly increasing ids below `n`.
fn check_request(r: &SelectRequest, capacity: u32) -> Result<()> {
    if r.n == 0 || r.n > capacity {
        return Err(Error::invalid(
            "n",
            format!("must be in 1..={capacity} (the bound row), got {}", r.n),
        ));
    }
    let max_k = r.n.min(MAX_CANDIDATES as u32);
    if r.k == 0 || r.k > max_k {
        return Err(Error::invalid(
            "k",
            format!("must be in 1..={max_k}, got {}", r.k),
        ));
    }
    if !(r.temperature.is_finite() && r.temperature > 0.0) {
        return Err(Error::invalid(
            "temperature",
            format!("must be finite and > 0, got {}", r.temperature),
        ));
    }
    if r.adjustments.len() > MAX_ADJUSTMENTS {
        return Err(Error::invalid(
            "adjustments",
            format!(
                "at most {MAX_ADJUSTMENTS} supported, got {}",
                r.adjustments.len()
            ),
        ));
    }
    if let Some(w) = r.adjustments.windows(2).find(|w| w[0].id >= w[1].id) {
        return Err(Error::invalid(
            "adjustments",
            format!(
                "ids must be strictly increasing, got {} then {}",
                w[0].id, w[1].id
            ),
        ));
    }
    if let Some(a) = r.adjustments.iter().find(|a| a.id >= r.n) {
        return Err(Error::invalid(
            "adjustments",
            format!("id {} is outside the row of {}", a.id, r.n),
        ));
    }
    if let Some(words) = &r.mask {
        if words.len() as u64 != mask_words(r.n) {
            return Err(Error::invalid(
                "mask",
                format!(
                    "{} words do not cover a row of {} (want {})",
                    words.len(),
                    r.n,
                    mask_words(r.n)
                ),
            ));
        }
        if words.iter().all(|&w| w == 0) {
            return Err(Error::invalid("mask", "allows no token"));
        }
    }
    Ok(())
}

/// Words of a bitset over `n` tokens.
fn mask_words(n: u32) -> u64 {
    u64::from(n).div_ceil(32)
}
