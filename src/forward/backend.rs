//! [`Backend`]: the forward pass a session runs, on the GPU ([`Forward`] with its device and
//! pipelines) or on the CPU ([`CpuForward`]). Every call the session makes goes through here,
//! so nothing above this layer knows which one runs.

use std::rc::Rc;

use super::cpu::{CpuForward, CpuPrecision};
use super::readback::{MemoryReport, Output, Readback, StepLogits};
use super::{BatchToken, Forward, Profile, DEFAULT_CHUNK};
use crate::candidates::SelectRequest;
use crate::config::{FillMark, KvLayout, ModelConfig};
use crate::dtype::kv::KvKinds;
use crate::error::{Error, Result};
use crate::gpu::{GpuContext, KernelCache, KernelPlan};
use crate::model::weights::ModelWeights;

/// Which kind of backend runs a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// WebGPU in the browser, Vulkan/Metal/DX12 natively.
    #[default]
    Gpu,
    /// The CPU (wasm in the browser, native code otherwise).
    Cpu,
}

impl BackendKind {
    /// `"gpu"` or `"cpu"`.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Gpu => "gpu",
            BackendKind::Cpu => "cpu",
        }
    }
}

/// A model on the GPU: its device, its forward pass and the pipelines it was built with.
#[derive(Debug)]
pub struct GpuModel {
    /// The device (shared with a draft model's).
    pub ctx: Rc<GpuContext>,
    /// The forward pass.
    pub forward: Forward,
    /// Pipelines, reused when the KV cache is rebuilt (and by a draft model).
    pub kernels: Rc<KernelCache>,
}

/// The forward pass of a loaded model, on either backend.
#[derive(Debug)]
pub enum Backend {
    /// On the GPU.
    Gpu(Box<GpuModel>),
    /// On the CPU.
    Cpu(Box<CpuForward>),
}

impl Backend {
    /// Loads `weights` onto the GPU of `ctx` with a KV cache of `context` positions.
    pub async fn gpu(
        ctx: GpuContext,
        weights: &ModelWeights<'_>,
        context: usize,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self> {
        let kernels = Rc::new(KernelCache::new());
        let forward =
            Forward::new_with_progress(&ctx, &kernels, weights, context, DEFAULT_CHUNK, progress)
                .await?;
        Ok(Backend::Gpu(Box::new(GpuModel {
            ctx: Rc::new(ctx),
            forward,
            kernels,
        })))
    }

    /// [`Backend::gpu`] for a model described by `layout` whose tensors `reader` reads a group
    /// at a time as they go to the GPU (see [`Forward::new_read`]).
    pub async fn gpu_read(
        ctx: GpuContext,
        layout: &ModelWeights<'_>,
        reader: &dyn crate::model::byte_source::TensorReader,
        context: usize,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self> {
        let kernels = Rc::new(KernelCache::new());
        let forward = Forward::new_read(
            &ctx,
            &kernels,
            layout,
            reader,
            context,
            DEFAULT_CHUNK,
            progress,
        )
        .await?;
        Ok(Backend::Gpu(Box::new(GpuModel {
            ctx: Rc::new(ctx),
            forward,
            kernels,
        })))
    }

    /// Loads `weights` for the CPU with a KV cache of `context` positions.
    pub fn cpu(weights: &ModelWeights<'_>, context: usize) -> Result<Self> {
        Self::cpu_with(weights, context, CpuPrecision::Int8)
    }

    /// [`Backend::cpu`] with the matrix products in `precision`.
    pub fn cpu_with(
        weights: &ModelWeights<'_>,
        context: usize,
        precision: CpuPrecision,
    ) -> Result<Self> {
        Ok(Backend::Cpu(Box::new(CpuForward::with_precision(
            weights,
            context,
            DEFAULT_CHUNK,
            precision,
        )?)))
    }

    /// What the matrix products run in: the GPU's precision (`f32`, `f16`), or on the CPU
    /// `int8` (8-bit activations) or `f32` (exact).
    pub fn precision_name(&self) -> &'static str {
        match self {
            Backend::Gpu(g) => g.ctx.precision().as_str(),
            Backend::Cpu(c) => c.precision().as_str(),
        }
    }

    /// The CPU backend's precision (`None` on the GPU).
    pub fn cpu_precision(&self) -> Option<CpuPrecision> {
        match self {
            Backend::Gpu(_) => None,
            Backend::Cpu(c) => Some(c.precision()),
        }
    }

    /// Loads `weights` on the same backend (and device) as `self`: a draft model.
    pub async fn load_beside(&self, weights: &ModelWeights<'_>, context: usize) -> Result<Self> {
        match self {
            Backend::Gpu(g) => Ok(Backend::Gpu(Box::new(GpuModel {
                ctx: Rc::clone(&g.ctx),
                forward: Forward::new(&g.ctx, &g.kernels, weights, context, DEFAULT_CHUNK).await?,
                kernels: Rc::clone(&g.kernels),
            }))),
            Backend::Cpu(c) => Self::cpu_with(weights, context, c.precision()),
        }
    }

    /// Which backend this is.
    pub fn kind(&self) -> BackendKind {
        match self {
            Backend::Gpu(_) => BackendKind::Gpu,
            Backend::Cpu(_) => BackendKind::Cpu,
        }
    }

    /// The GPU device, when on the GPU.
    pub fn gpu_context(&self) -> Option<&GpuContext> {
        match self {
            Backend::Gpu(g) => Some(&g.ctx),
            Backend::Cpu(_) => None,
        }
    }

    /// The GPU forward pass, when on the GPU.
    pub fn gpu_forward(&self) -> Option<&Forward> {
        match self {
            Backend::Gpu(g) => Some(&g.forward),
            Backend::Cpu(_) => None,
        }
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        match self {
            Backend::Gpu(g) => g.forward.config(),
            Backend::Cpu(c) => c.config(),
        }
    }

    /// Tokens per step.
    pub fn chunk(&self) -> usize {
        match self {
            Backend::Gpu(g) => g.forward.chunk(),
            Backend::Cpu(c) => c.chunk(),
        }
    }

    /// Dispatches (GPU) or operations (CPU) of a step that computes logits.
    pub fn node_count(&self) -> usize {
        match self {
            Backend::Gpu(g) => g.forward.node_count(),
            Backend::Cpu(c) => c.node_count(),
        }
    }

    /// Memory held by the model.
    pub fn memory(&self) -> MemoryReport {
        match self {
            Backend::Gpu(g) => g.forward.memory(),
            Backend::Cpu(c) => c.memory(),
        }
    }

    /// The kernel plan (GPU only).
    pub fn plan(&self) -> Option<&KernelPlan> {
        self.gpu_forward().map(Forward::plan)
    }

    /// Positions the main sequence holds.
    pub fn pos(&self) -> usize {
        match self {
            Backend::Gpu(g) => g.forward.kv().pos(),
            Backend::Cpu(c) => c.pos(),
        }
    }

    /// KV positions per sequence.
    pub fn context(&self) -> usize {
        match self {
            Backend::Gpu(g) => g.forward.kv().context(),
            Backend::Cpu(c) => c.context(),
        }
    }

    /// The KV cache's storage kinds.
    pub fn kv_kinds(&self) -> KvKinds {
        match self {
            Backend::Gpu(g) => g.forward.kv().kinds(),
            Backend::Cpu(c) => c.kv_kinds(),
        }
    }

    /// Forgets cached positions from `pos` on. Fails where a local layer's ring no longer
    /// holds what continuing from `pos` reads ([`Backend::reusable`] says how far back is safe).
    pub fn truncate(&mut self, pos: usize) -> Result<()> {
        match self {
            Backend::Gpu(g) => g.forward.truncate(pos),
            Backend::Cpu(c) => c.truncate(pos),
        }
    }

    /// The longest prefix of at most `pos` cached positions the model can continue from:
    /// `pos` (at most the cached positions), or 0 where a local layer's ring has since
    /// overwritten keys that continuing would read.
    pub fn reusable(&self, pos: usize) -> usize {
        match self {
            Backend::Gpu(g) => g.forward.kv().reusable(pos),
            Backend::Cpu(c) => c.reusable(pos),
        }
    }

    /// How many positions the fill mark may always move back after a step (rejected draft
    /// tokens): a step's length with local layers' rings, unbounded without.
    pub fn rewind_limit(&self) -> usize {
        match self {
            Backend::Gpu(g) => g.forward.kv().layout().slack(),
            Backend::Cpu(c) => c.rewind_limit(),
        }
    }
    /// The KV cache's layout (rows per sequence of each layer).
    pub fn kv_layout(&self) -> &KvLayout {
        match self {
            Backend::Gpu(g) => g.forward.kv().layout(),
            Backend::Cpu(c) => c.kv_layout(),
        }
    }

    /// The main sequence's fill mark.
    pub fn kv_mark(&self) -> FillMark {
        match self {
            Backend::Gpu(g) => g.forward.kv().mark(),
            Backend::Cpu(c) => c.kv_mark(),
        }
    }

    /// The first `rows[l]` rows of the main sequence's K and V in every layer `l`, as stored
    /// (`[rows, row words]` each; f32 rows as their bits); on the GPU in one readback.
    pub async fn kv_prefix(&self, rows: &[usize]) -> Result<Vec<(Vec<u32>, Vec<u32>)>> {
        match self {
            Backend::Gpu(g) => g.forward.kv().read_prefix(&g.ctx, rows).await,
            Backend::Cpu(c) => (0..rows.len()).map(|l| c.kv_rows(l, rows[l])).collect(),
        }
    }

    /// Writes whole rows of K and V (as [`Backend::kv_prefix`] gives them) over the first rows
    /// of the main sequence in `layer`.
    pub fn write_kv_rows(&mut self, layer: usize, k: &[u32], v: &[u32]) -> Result<()> {
        match self {
            Backend::Gpu(g) => g.forward.kv().write_rows(&g.ctx, layer, k, v),
            Backend::Cpu(c) => c.write_kv_rows(layer, k, v),
        }
    }

    /// Sets the main sequence's fill mark as a saved conversation recorded it (see
    /// [`FillMark::restored`]).
    pub fn restore_mark(&mut self, pos: usize, high: usize) -> Result<()> {
        match self {
            Backend::Gpu(g) => g.forward.kv_mut().restore_mark(pos, high),
            Backend::Cpu(c) => c.restore_mark(pos, high),
        }
    }

    /// Runs `tokens` from the cache's position on (see [`Forward::run`]).
    pub async fn run(&mut self, tokens: &[u32], readback: Readback<'_>) -> Result<Output> {
        match self {
            Backend::Gpu(g) => {
                if let Readback::RowCandidates(requests) = &readback {
                    // a selection for each row the step reads
                    g.forward
                        .ensure_row_selects(&g.ctx, &g.kernels, requests.len())
                        .await?;
                }
                g.forward.run(&g.ctx, tokens, readback).await
            }
            Backend::Cpu(c) => c.run(tokens, readback),
        }
    }

    /// The logits of the last token, or of every token when `all_logits`.
    pub async fn forward(&mut self, tokens: &[u32], all_logits: bool) -> Result<Vec<f32>> {
        let readback = match all_logits {
            true => Readback::AllRows,
            false => Readback::LastRow,
        };
        match self.run(tokens, readback).await? {
            Output::Logits(logits) => Ok(logits),
            _ => Ok(Vec::new()),
        }
    }

    /// One decode step (see [`Forward::decode_select`]); the CPU reads the whole row.
    pub async fn decode_select(
        &mut self,
        token: u32,
        request: Option<&SelectRequest>,
    ) -> Result<StepLogits> {
        match self {
            Backend::Gpu(g) => g.forward.decode_select(&g.ctx, token, request).await,
            Backend::Cpu(c) => match c.run(&[token], Readback::LastRow)? {
                Output::Logits(row) => Ok(StepLogits::Full(row)),
                _ => Ok(StepLogits::Full(Vec::new())),
            },
        }
    }

    /// The logits row of the last one-token step.
    pub async fn last_logits(&self) -> Result<Vec<f32>> {
        self.logits_row(0).await
    }

    /// Row `row` of the last step's logits.
    pub async fn logits_row(&self, row: usize) -> Result<Vec<f32>> {
        match self {
            Backend::Gpu(g) => g.forward.logits_row(&g.ctx, row).await,
            Backend::Cpu(c) => c.logits_row(row),
        }
    }

    /// What measurements on this backend are kept under in the tune store: the device (the
    /// GPU adapter's name, API and type, or the CPU backend's instruction set) and its driver
    /// (or the CPU backend's threads).
    pub fn device_key(&self) -> (String, String) {
        match self {
            Backend::Gpu(g) => {
                let r = g.ctx.report();
                (
                    format!("{} [{}, {}]", r.name, r.backend, r.device_type),
                    format!("{} {}", r.driver, r.driver_info),
                )
            }
            Backend::Cpu(_) => (
                format!("cpu [{}]", crate::cpu::dot::instruction_set()),
                format!("{} threads", crate::cpu::threads()),
            ),
        }
    }

    /// Replaces the KV cache (see [`Forward::set_kv`]).
    pub async fn set_kv(&mut self, kinds: KvKinds, context: usize) -> Result<()> {
        match self {
            Backend::Gpu(g) => g.forward.set_kv(&g.ctx, &g.kernels, kinds, context).await,
            Backend::Cpu(c) => c.set_kv(kinds, context),
        }
    }

    /// KV slots for batched decoding (see [`Forward::set_batch`]).
    pub async fn set_batch(&mut self, slots: usize) -> Result<()> {
        match self {
            Backend::Gpu(g) => g.forward.set_batch(&g.ctx, &g.kernels, slots).await,
            Backend::Cpu(c) => c.set_batch(slots),
        }
    }

    /// Sequences one batched step holds at most.
    pub fn max_batch(&self) -> usize {
        match self {
            Backend::Gpu(g) => g.forward.max_batch(),
            Backend::Cpu(c) => c.max_batch(),
        }
    }

    /// Sequences of the current context the KV cache can hold side by side (on the GPU, what
    /// one layer's binding holds; on the CPU, no limit but [`Self::max_batch`]).
    pub fn slots_that_fit(&self) -> usize {
        match self {
            Backend::Gpu(g) => {
                let limits = g.ctx.limits();
                let binding = limits
                    .max_storage_buffer_binding_size
                    .min(limits.max_buffer_size);
                let kv = g.forward.kv();
                let kinds = kv.kinds();
                let row = kinds
                    .k
                    .row_bytes(kv.kv_dim())
                    .max(kinds.v.row_bytes(kv.kv_dim()));
                let per_slot = (kv.context() as u64).saturating_mul(row).max(1);
                usize::try_from(binding / per_slot).unwrap_or(usize::MAX)
            }
            Backend::Cpu(c) => c.max_batch(),
        }
    }

    /// Runs `tokens` in KV slot `slot` from `pos` (see [`Forward::run_in_slot`]).
    pub async fn run_in_slot(
        &mut self,
        slot: usize,
        pos: usize,
        tokens: &[u32],
        readback: Readback<'_>,
    ) -> Result<Output> {
        match self {
            Backend::Gpu(g) => {
                g.forward
                    .run_in_slot(&g.ctx, slot, pos, tokens, readback)
                    .await
            }
            Backend::Cpu(c) => c.run_in_slot(slot, pos, tokens, readback),
        }
    }

    /// One step for several sequences (see [`Forward::decode_batch`]).
    pub async fn decode_batch(
        &mut self,
        tokens: &[BatchToken],
        requests: &[Option<&SelectRequest>],
    ) -> Result<Vec<StepLogits>> {
        match self {
            Backend::Gpu(g) => g.forward.decode_batch(&g.ctx, tokens, requests).await,
            Backend::Cpu(c) => c.decode_batch(tokens, requests),
        }
    }

    /// Copies a slot's first `rows` positions into other slots.
    pub fn copy_slot_prefix(&mut self, from: usize, to: &[usize], rows: usize) -> Result<()> {
        match self {
            Backend::Gpu(g) => g.forward.copy_slot_prefix(&g.ctx, from, to, rows),
            Backend::Cpu(c) => c.copy_slot_prefix(from, to, rows),
        }
    }

    /// Profiles the GPU's kernels (see [`Forward::profile`]); the CPU has no kernel profile.
    pub async fn profile(&mut self, decode_pos: u32, prompt_tokens: u32) -> Result<Profile> {
        match self {
            Backend::Gpu(g) => g.forward.profile(&g.ctx, decode_pos, prompt_tokens).await,
            Backend::Cpu(_) => Err(Error::invalid(
                "backend",
                "the kernel profile measures GPU kernels; this model runs on the CPU",
            )),
        }
    }
}
