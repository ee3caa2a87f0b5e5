//! The forward pass on the GPU: weights uploaded once in their stored format, activations and
//! the KV cache preallocated, and every step (a prefill chunk or one decode token) recorded as
//! one compute pass in one command buffer with one submit and one readback of the logits.
//!
//! Each architecture's file ([`crate::model::arch`]) builds its [`graph::Graph`] over typed
//! layer weights; the graph is compiled into bound kernels once at load, and [`Forward::run`] only
//! writes the step parameters and the token ids, records them and reads back what was asked.

use std::collections::HashMap;

use crate::backend::gpu::{
    AliveBuffers, GpuContext, GpuTensor, KernelCache, KernelPlan, KvCache, MatmulPrecision,
    StepParams, StepRow,
};
use crate::candidates::{Candidates, SelectRequest, MAX_RESULT_BYTES};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::model::weights::ModelWeights;
use crate::model::{arch, fuse, graph};

mod assemble;
mod batch;
mod compile;
mod final_norm;
mod kv;
mod measure;
mod model;
mod profile;
mod upload;

use super::ops::{LinearBinding, Select};
use crate::backend::readback::{Collect, Head};
pub use crate::backend::readback::{MemoryReport, Output, Readback, StepLogits};
use compile::{Activations, Compiler, Node};
use final_norm::FinalNorm;
pub(crate) use measure::model_shape;
pub use measure::plan_key;
pub use model::GpuModel;
pub use profile::{Profile, ProfileRow, StepProfile};
use upload::f32_bytes;

/// A model ready to run on the GPU.
#[derive(Debug)]
pub struct Forward {
    config: ModelConfig,
    chunk: usize,
    _weights: HashMap<String, GpuTensor>,
    kv: KvCache,
    step: wgpu::Buffer,
    act: Activations,
    staging: wgpu::Buffer,
    nodes: Vec<Node>,
    /// The final norm and LM head for the last token only (row 0 of the logits) and for
    /// every token of the step (`None` for an encoder, which has no LM head).
    head_last: Option<LinearBinding>,
    head_all: Option<LinearBinding>,
    memory: MemoryReport,
    _alive: AliveBuffers,
    /// Candidate selection over row 0 of the logits, recorded after the graph by
    /// [`Forward::decode_select`]; `None` on devices it cannot run on.
    select: Option<Select>,
    /// Readback of the selection result, `MAX_RESULT_BYTES`.
    select_staging: wgpu::Buffer,
    /// Which variant each kernel family runs, and why.
    plan: KernelPlan,
    /// The pass as data, kept to rebind it to another KV cache ([`Forward::set_kv`]).
    graph: graph::Graph,
    /// The norm before the head, on the host, for [`Readback::Hidden`].
    final_norm: Option<FinalNorm>,
    /// What batched steps need beyond a single sequence's ([`Forward::set_batch`]).
    batch: batch::BatchBuffers,
}

/// Which sequence a step runs: the main one (slot 0, whose fill mark the cache keeps) or
/// the one in a KV slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seq {
    Main,
    Slot(usize),
}

/// One step as [`Forward::record`] runs it.
struct Step<'a> {
    /// The command encoder's and the pass's label.
    label: &'static str,
    /// The step's parameters (positions, tokens, slots).
    params: &'a StepParams,
    /// Each sequence's first position, slot and slot base.
    rows: &'a [StepRow],
    /// The token ids, `[tokens]`.
    ids: &'a [u32],
    /// Which rows the head computes, and in which shape.
    head: StepHead,
}

/// How a step's head runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StepHead {
    /// The rows a run asks for, in the kernel the plan chose for that many tokens.
    Planned(Head),
    /// Every row of a batched step (one token per sequence), in the plan's decode shape.
    Batched,
}

impl StepHead {
    /// The rows it computes.
    fn rows(self) -> Head {
        match self {
            StepHead::Planned(head) => head,
            StepHead::Batched => Head::All,
        }
    }
}

/// What one step read back.
enum StepRead {
    Nothing,
    Logits(Vec<f32>),
    /// One per selected row.
    Candidates(Vec<Candidates>),
}

impl Forward {
    /// Uploads the weights, allocates the KV cache for `context` positions and the activations
    /// for `chunk`-token steps, and builds the graph.
    pub async fn new(
        ctx: &GpuContext,
        cache: &KernelCache,
        weights: &ModelWeights<'_>,
        context: usize,
        chunk: usize,
    ) -> Result<Self> {
        Self::new_with_progress(ctx, cache, weights, context, chunk, &mut |_, _| {}).await
    }

    /// [`Forward::new`], calling `progress(uploaded, total)` (weight bytes as stored) after
    /// each tensor is handed to the GPU queue.
    pub async fn new_with_progress(
        ctx: &GpuContext,
        cache: &KernelCache,
        weights: &ModelWeights<'_>,
        context: usize,
        chunk: usize,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self> {
        crate::backend::step::check_context(&weights.config, context)?;
        if chunk == 0 {
            return Err(Error::invalid("chunk", "must be at least 1"));
        }
        let chunk = crate::backend::step::step_tokens(&weights.config, context, chunk);
        Self::check_fits(ctx, weights, context, chunk)?;
        let fusion = fuse::plan(weights);
        let memory = ctx.load_memory();
        let gpu = Self::upload(ctx, weights, &fusion, memory, progress).await?;
        Self::assemble(
            ctx, cache, weights, weights, &fusion, gpu, memory, context, chunk,
        )
        .await
    }

    /// [`Forward::new_with_progress`] for a model described by `layout` (every tensor's shape
    /// and type, without bytes) whose tensors `reader` reads a group at a time as they go to
    /// the GPU: the host holds one group's bytes at a time, never the files.
    #[allow(clippy::too_many_arguments)]
    pub async fn new_read(
        ctx: &GpuContext,
        cache: &KernelCache,
        layout: &ModelWeights<'_>,
        reader: &dyn crate::model::byte_source::TensorReader,
        context: usize,
        chunk: usize,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self> {
        crate::backend::step::check_context(&layout.config, context)?;
        if chunk == 0 {
            return Err(Error::invalid("chunk", "must be at least 1"));
        }
        let chunk = crate::backend::step::step_tokens(&layout.config, context, chunk);
        Self::check_fits(ctx, layout, context, chunk)?;
        let fusion = fuse::plan(layout);
        let memory = ctx.load_memory();
        let (gpu, kept) = Self::upload_read(ctx, layout, reader, &fusion, memory, progress).await?;
        Self::assemble(
            ctx, cache, layout, &kept, &fusion, gpu, memory, context, chunk,
        )
        .await
    }

    /// The kernel plan this model runs with.
    pub fn plan(&self) -> &KernelPlan {
        &self.plan
    }

    /// Dispatches of a step that computes logits: the graph's nodes and the LM head (a
    /// prefill chunk whose logits nobody reads skips the head: one fewer).
    pub fn node_count(&self) -> usize {
        self.nodes.len() + 1
    }

    /// GPU memory allocated at load.
    pub fn memory(&self) -> MemoryReport {
        self.memory
    }

    /// Tokens per prefill step.
    pub fn chunk(&self) -> usize {
        self.chunk
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The KV cache, to restore a saved conversation into.
    pub fn kv_mut(&mut self) -> &mut KvCache {
        &mut self.kv
    }

    /// The KV cache (its position is the next token's position).
    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    /// Forgets cached positions from `pos` on (0 starts a new sequence).
    pub fn truncate(&mut self, pos: usize) -> Result<()> {
        if pos > self.kv.pos() {
            return Err(Error::invalid(
                "pos",
                format!("{pos} is past the cached {} positions", self.kv.pos()),
            ));
        }
        self.kv.set_pos(pos)
    }

    /// Runs `tokens` from the cache's position on, cut into chunks of [`Self::chunk`] tokens
    /// here and nowhere else: one compute pass, one submit and at most one readback per chunk.
    /// `readback` says what comes back; only the last chunk reads anything unless it is
    /// [`Readback::AllRows`]. [`Readback::Candidates`] on a device that cannot run the
    /// selection reads the last row instead ([`Output::Logits`]).
    pub async fn run(
        &mut self,
        ctx: &GpuContext,
        tokens: &[u32],
        readback: Readback<'_>,
    ) -> Result<Output> {
        let pos = self.kv.pos();
        self.run_seq(ctx, Seq::Main, pos, tokens, readback).await
    }

    /// [`Self::run`] for the sequence in KV slot `slot` (see [`Self::set_batch`]), whose
    /// positions before `pos` are cached: `tokens` go to positions `pos..`. The main
    /// sequence's fill mark ([`KvCache::pos`]) is left alone, even for slot 0.
    pub async fn run_in_slot(
        &mut self,
        ctx: &GpuContext,
        slot: usize,
        pos: usize,
        tokens: &[u32],
        readback: Readback<'_>,
    ) -> Result<Output> {
        if slot >= self.kv.slots() {
            return Err(Error::invalid(
                "slot",
                format!("{slot} is not one of the cache's {} slots", self.kv.slots()),
            ));
        }
        self.run_seq(ctx, Seq::Slot(slot), pos, tokens, readback)
            .await
    }

    async fn run_seq(
        &mut self,
        ctx: &GpuContext,
        seq: Seq,
        pos: usize,
        tokens: &[u32],
        readback: Readback<'_>,
    ) -> Result<Output> {
        if tokens.is_empty() {
            return Err(Error::invalid("tokens", "at least one token is needed"));
        }
        self.check_ids(tokens)?;
        crate::backend::step::check_whole_text(&self.config, pos, tokens.len(), self.chunk)?;
        let end = pos + tokens.len();
        if end > self.kv.context() {
            return Err(Error::invalid(
                "tokens",
                format!(
                    "{} tokens after {} cached ones exceed the context of {}",
                    tokens.len(),
                    pos,
                    self.kv.context()
                ),
            ));
        }
        // selections for one step's rows: the last row (Head::Last writes it to row 0), or
        // every row of a run that is one step
        let rows = match (&self.select, tokens.len() <= self.chunk) {
            (None, _) => 0,
            (Some(_), true) => self.batch_rows(),
            (Some(_), false) => 1,
        };
        let (mut collect, requests) = Collect::new(readback, tokens.len(), rows)?;
        let n_chunks = tokens.len().div_ceil(self.chunk);
        let mut ran = 0;
        for (i, chunk) in tokens.chunks(self.chunk).enumerate() {
            let last = i + 1 == n_chunks;
            let head = collect.head(last);
            let slot = match seq {
                Seq::Main => 0,
                Seq::Slot(s) => s,
            };
            let requests = if last { requests } else { &[] };
            if seq == Seq::Main {
                // before the step: a step that fails late has still written its rows
                self.kv.note_written(pos + ran + chunk.len());
            }
            let read = self
                .step(ctx, slot, pos + ran, chunk, head, requests)
                .await?;
            let first = ran;
            ran += chunk.len();
            if seq == Seq::Main {
                self.kv.set_pos(pos + ran)?;
            }
            let rows = match read {
                StepRead::Nothing => Vec::new(),
                StepRead::Logits(mut rows) if head == Head::Hidden => {
                    if let Some(norm) = &self.final_norm {
                        norm.apply(&mut rows);
                    }
                    rows
                }
                StepRead::Logits(rows) => rows,
                StepRead::Candidates(mut c) if head == Head::Last && c.len() == 1 => {
                    return Ok(Output::Candidates(c.remove(0)))
                }
                StepRead::Candidates(c) => return Ok(Output::RowCandidates(c)),
            };
            if let Some(out) = collect.step(first, chunk.len(), rows, last, ran)? {
                return Ok(out);
            }
        }
        Ok(collect.finish(ran))
    }

    /// Runs `tokens` (see [`Self::run`]) and returns the logits of the last token (`[vocab]`),
    /// or of every token (`[tokens.len() · vocab]`) when `all_logits`.
    pub async fn forward(
        &mut self,
        ctx: &GpuContext,
        tokens: &[u32],
        all_logits: bool,
    ) -> Result<Vec<f32>> {
        let readback = match all_logits {
            true => Readback::AllRows,
            false => Readback::LastRow,
        };
        match self.run(ctx, tokens, readback).await? {
            Output::Logits(logits) => Ok(logits),
            _ => Ok(Vec::new()),
        }
    }

    /// One decode step for `token` (see [`Self::run`]): with `request`, the candidate selection
    /// runs after the graph in the same pass and only its result is read back
    /// ([`StepLogits::Candidates`]); without one, or when the device cannot run the selection,
    /// the whole row ([`StepLogits::Full`], `[vocab]`).
    pub async fn decode_select(
        &mut self,
        ctx: &GpuContext,
        token: u32,
        request: Option<&SelectRequest>,
    ) -> Result<StepLogits> {
        let readback = match request {
            Some(request) => Readback::Candidates(request),
            None => Readback::LastRow,
        };
        match self.run(ctx, &[token], readback).await? {
            Output::Candidates(c) => Ok(StepLogits::Candidates(c)),
            Output::Logits(row) => Ok(StepLogits::Full(row)),
            _ => Ok(StepLogits::Full(Vec::new())),
        }
    }

    /// One step of at most [`Self::chunk`] tokens at positions `pos0..` of the sequence in KV
    /// slot `slot`, with a selection after the head for each of `requests` (over rows `0..`):
    /// see [`Self::record`].
    async fn step(
        &mut self,
        ctx: &GpuContext,
        slot: usize,
        pos0: usize,
        tokens: &[u32],
        head: Head,
        requests: &[SelectRequest],
    ) -> Result<StepRead> {
        let selects = match requests.is_empty() {
            true => None,
            false => self.row_selects(requests.iter().collect()),
        };
        let params = StepParams::checked(
            pos0 as u32,
            tokens.len() as u32,
            self.chunk as u32,
            self.kv.context() as u32,
        )?;
        let rows = [StepRow::new(
            pos0 as u32,
            slot as u32,
            self.kv.slot_base(slot) as u32,
        )];
        let step = Step {
            label: "forward step",
            params: &params,
            rows: &rows,
            ids: tokens,
            head: StepHead::Planned(head),
        };
        self.record(ctx, step, selects.as_deref()).await
    }

    /// Runs one step, of one sequence or of several ([`Self::decode_batch`]), the one way
    /// every step runs: writes the selections' requests, the step's rows and ids, records
    /// every node, the head and the selections in one compute pass, copies what is read back
    /// (the selections' results, or the rows `head` computes) to a staging buffer, submits
    /// once and reads back.
    async fn record(
        &self,
        ctx: &GpuContext,
        step: Step<'_>,
        selects: Option<&[(&Select, &SelectRequest)]>,
    ) -> Result<StepRead> {
        let n = step.ids.len();
        let head = match step.head.rows() {
            Head::None | Head::Hidden => None,
            Head::Last => Some(self.head_last.as_ref()),
            Head::All => Some(self.head_all.as_ref()),
        };
        let head = match head {
            Some(None) => return Err(crate::model::graph::no_lm_head(&self.config)),
            Some(Some(h)) => Some(h),
            None => None,
        };
        for (select, request) in selects.into_iter().flatten() {
            select.write(ctx, request)?;
        }
        step.params.write_rows(ctx, &self.step, step.rows);
        ctx.queue
            .write_buffer(&self.act.ids, 0, bytemuck::cast_slice(step.ids));
        let mut encoder = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some(step.label),
            });
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(step.label),
                timestamp_writes: None,
            });
            ctx.counter_cells().compute_pass();
            for node in &self.nodes {
                node.record(&mut pass, step.params, &self.plan);
            }
            // The head runs only for logits someone reads: the last row alone into row 0,
            // or every row.
            match (step.head, head) {
                (_, None) => {}
                (StepHead::Planned(_), Some(h)) => {
                    h.record_planned(&mut pass, n as u32, self.plan.linear())
                }
                (StepHead::Batched, Some(h)) => {
                    h.record_batched(&mut pass, n as u32, self.plan.linear())
                }
            }
            for (select, _) in selects.into_iter().flatten() {
                select.record(&mut pass);
            }
        }
        let row_bytes = f32_bytes(self.config.vocab_size as u64);
        let (staging, bytes) = match (selects, step.head.rows()) {
            (Some(selects), _) => self.copy_selected(&mut encoder, selects),
            (None, Head::None) => (&self.staging, 0),
            (None, Head::Last) => {
                encoder.copy_buffer_to_buffer(&self.act.logits, 0, &self.staging, 0, row_bytes);
                (&self.staging, row_bytes)
            }
            (None, Head::All) => {
                let bytes = n as u64 * row_bytes;
                encoder.copy_buffer_to_buffer(&self.act.logits, 0, &self.staging, 0, bytes);
                (&self.staging, bytes)
            }
            (None, Head::Hidden) => {
                let bytes = f32_bytes(n as u64 * self.config.hidden_size as u64);
                encoder.copy_buffer_to_buffer(&self.act.x, 0, &self.staging, 0, bytes);
                (&self.staging, bytes)
            }
        };
        ctx.counter_cells().submit(1);
        ctx.counter_cells().forward_step(n as u64);
        let submission = ctx.queue.submit([encoder.finish()]);
        if bytes == 0 {
            ctx.check()?;
            return Ok(StepRead::Nothing);
        }
        let data = ctx.read_staging(staging, bytes, submission).await?;
        Ok(match selects {
            Some(selects) => StepRead::Candidates(batch::parse_selected(&data, selects)?),
            None => StepRead::Logits(bytemuck::pod_collect_to_vec(&data)),
        })
    }

    /// Reads back the logits row of the last one-token step (`[vocab]`, row 0), for a decode
    /// step whose candidates did not suffice: one more submit and readback, no forward step.
    pub async fn last_logits(&self, ctx: &GpuContext) -> Result<Vec<f32>> {
        self.logits_row(ctx, 0).await
    }
}
