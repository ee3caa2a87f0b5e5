//! [`GpuModel`]: a model on the GPU (its device, forward pass and pipelines) as a
//! [`Backend`].

use std::rc::Rc;

use super::{Forward, Output, Profile, Readback};
use crate::backend::gpu::{GpuContext, KernelCache, KernelPlan};
use crate::backend::{Backend, BackendKind, MemoryReport, Pending, Rows, DEFAULT_CHUNK};
use crate::config::{FillMark, KvLayout, ModelConfig};
use crate::dtype::kv::KvKinds;
use crate::error::Result;
use crate::model::weights::ModelWeights;

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

impl GpuModel {
    /// Refuses, with the numbers, a model described by `layout` (shapes and types; no bytes
    /// needed) that could not load on `ctx` with a KV cache of `context` positions: a context
    /// outside the model's, or a buffer past the device's limits. What a load checks before it
    /// allocates, asked before the weights are downloaded.
    pub fn check_fits(ctx: &GpuContext, layout: &ModelWeights<'_>, context: usize) -> Result<()> {
        crate::backend::step::check_context(&layout.config, context)?;
        Forward::check_fits(ctx, layout, context, DEFAULT_CHUNK)
    }

    /// Loads `weights` onto the GPU of `ctx` with a KV cache of `context` positions, calling
    /// `progress(uploaded, total)` as tensors go to the queue.
    pub async fn load(
        ctx: GpuContext,
        weights: &ModelWeights<'_>,
        context: usize,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self> {
        let kernels = Rc::new(KernelCache::new());
        let forward =
            Forward::new_with_progress(&ctx, &kernels, weights, context, DEFAULT_CHUNK, progress)
                .await?;
        Ok(GpuModel {
            ctx: Rc::new(ctx),
            forward,
            kernels,
        })
    }

    /// [`GpuModel::load`] for a model described by `layout` whose tensors `reader` reads a
    /// group at a time as they go to the GPU (see [`Forward::new_read`]).
    pub async fn load_read(
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
        Ok(GpuModel {
            ctx: Rc::new(ctx),
            forward,
            kernels,
        })
    }

    async fn run_rows(&mut self, rows: Rows<'_>, readback: Readback<'_>) -> Result<Output> {
        let (ctx, forward) = (&self.ctx, &mut self.forward);
        if forward.graph.head.is_none() && readback.reads_logits() {
            return Err(crate::model::graph::no_lm_head(&forward.config));
        }
        match rows {
            Rows::Next(tokens) => {
                if let Readback::RowCandidates(requests) = &readback {
                    // a selection for each row the step reads
                    forward
                        .ensure_row_selects(ctx, &self.kernels, requests.len())
                        .await?;
                }
                forward.run(ctx, tokens, readback).await
            }
            Rows::InSlot { slot, pos, tokens } => {
                forward.run_in_slot(ctx, slot, pos, tokens, readback).await
            }
            Rows::Batch(tokens) => Ok(Output::Sequences(
                forward
                    .decode_batch(ctx, tokens, readback.sequences()?)
                    .await?,
            )),
        }
    }
}

impl Backend for GpuModel {
    fn kind(&self) -> BackendKind {
        BackendKind::Gpu
    }

    fn precision_name(&self) -> &'static str {
        self.ctx.precision().as_str()
    }

    fn gpu(&self) -> Option<&GpuContext> {
        Some(&self.ctx)
    }

    fn plan(&self) -> Option<&KernelPlan> {
        Some(self.forward.plan())
    }

    fn device_key(&self) -> (String, String) {
        let r = self.ctx.report();
        (
            format!("{} [{}, {}]", r.name, r.backend, r.device_type),
            format!("{} {}", r.driver, r.driver_info),
        )
    }

    fn config(&self) -> &ModelConfig {
        self.forward.config()
    }

    fn chunk(&self) -> usize {
        self.forward.chunk()
    }

    fn node_count(&self) -> usize {
        self.forward.node_count()
    }

    fn memory(&self) -> MemoryReport {
        self.forward.memory()
    }

    fn load_beside<'a>(
        &'a self,
        weights: &'a ModelWeights<'a>,
        context: usize,
    ) -> Pending<'a, Box<dyn Backend>> {
        Box::pin(async move {
            let forward =
                Forward::new(&self.ctx, &self.kernels, weights, context, DEFAULT_CHUNK).await?;
            Ok(Box::new(GpuModel {
                ctx: Rc::clone(&self.ctx),
                forward,
                kernels: Rc::clone(&self.kernels),
            }) as Box<dyn Backend>)
        })
    }

    fn run<'a, 'r: 'a>(
        &'a mut self,
        rows: Rows<'a>,
        readback: Readback<'r>,
    ) -> Pending<'a, Output> {
        Box::pin(self.run_rows(rows, readback))
    }

    fn logits_row(&self, row: usize) -> Pending<'_, Vec<f32>> {
        Box::pin(self.forward.logits_row(&self.ctx, row))
    }

    fn pos(&self) -> usize {
        self.forward.kv().pos()
    }

    fn context(&self) -> usize {
        self.forward.kv().context()
    }

    fn kv_kinds(&self) -> KvKinds {
        self.forward.kv().kinds()
    }

    fn truncate(&mut self, pos: usize) -> Result<()> {
        self.forward.truncate(pos)
    }

    fn reusable(&self, pos: usize) -> usize {
        self.forward.kv().reusable(pos)
    }

    fn rewind_limit(&self) -> usize {
        self.forward.kv().layout().slack()
    }

    fn kv_layout(&self) -> &KvLayout {
        self.forward.kv().layout()
    }

    fn kv_mark(&self) -> FillMark {
        self.forward.kv().mark()
    }

    fn kv_prefix<'a>(&'a self, rows: &'a [usize]) -> Pending<'a, Vec<(Vec<u32>, Vec<u32>)>> {
        Box::pin(self.forward.kv().read_prefix(&self.ctx, rows))
    }

    fn write_kv_rows(&mut self, layer: usize, k: &[u32], v: &[u32]) -> Result<()> {
        self.forward.kv().write_rows(&self.ctx, layer, k, v)
    }

    fn restore_mark(&mut self, pos: usize, high: usize) -> Result<()> {
        self.forward.kv_mut().restore_mark(pos, high)
    }

    fn set_kv(&mut self, kinds: KvKinds, context: usize) -> Pending<'_, ()> {
        Box::pin(
            self.forward
                .set_kv(&self.ctx, &self.kernels, kinds, context),
        )
    }

    fn set_batch(&mut self, slots: usize) -> Pending<'_, ()> {
        Box::pin(self.forward.set_batch(&self.ctx, &self.kernels, slots))
    }

    fn max_batch(&self) -> usize {
        self.forward.max_batch()
    }

    fn slots_that_fit(&self) -> usize {
        let limits = self.ctx.limits();
        let binding = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size);
        let kv = self.forward.kv();
        let kinds = kv.kinds();
        let row = kinds
            .k
            .row_bytes(kv.kv_dim())
            .max(kinds.v.row_bytes(kv.kv_dim()));
        let per_slot = (kv.context() as u64).saturating_mul(row).max(1);
        usize::try_from(binding / per_slot).unwrap_or(usize::MAX)
    }

    fn copy_slot_prefix(&mut self, from: usize, to: &[usize], rows: usize) -> Result<()> {
        self.forward.copy_slot_prefix(&self.ctx, from, to, rows)
    }

    fn profile(&mut self, decode_pos: u32, prompt_tokens: u32) -> Pending<'_, Profile> {
        Box::pin(self.forward.profile(&self.ctx, decode_pos, prompt_tokens))
    }
}
