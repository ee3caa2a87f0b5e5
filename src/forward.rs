//! The forward pass on the GPU: weights uploaded once in their stored format, activations and
//! the KV cache preallocated, and every step (a prefill chunk or one decode token) recorded as
//! one compute pass in one command buffer with one submit and one readback of the logits.
//!
//! The graph of each architecture is a list of [`Node`]s built at load time; a step only
//! writes the step parameters and the token ids, records the list and reads the logits.

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::gpu::ops::{
    Attention, AttentionBinding, EmbedSource, Embedding, Epilogue, Heads, InputNorm, KeySplit,
    KvWriteBinding, Linear, LinearBinding, LinearOptions, NormBinding, Qkv, QkvForm, RopeKvWrite,
    Select, SwiGlu,
};
use crate::gpu::plan::Family;
use crate::gpu::{
    AliveBuffers, GpuContext, GpuTensor, KernelBinding, KernelCache, KernelPlan, KvCache,
    Reduction, SplitOverride, StepParams, Variant,
};
use crate::model::weights::{ModelWeights, Tensor};

pub mod fuse;
mod measure;
mod profile;
use crate::candidates::{Candidates, SelectRequest, MAX_RESULT_BYTES};
use crate::config::{Architecture, ModelConfig, NormKind, RopeLayout};
use crate::dtype::{dequantize, encode_float, DType};
use fuse::FusionPlan;
pub use measure::plan_key;
pub use profile::{Profile, ProfileRow, StepProfile};

/// Tokens per prefill step: long prompts are processed in chunks of this many.
pub const DEFAULT_CHUNK: usize = 64;

/// One recorded dispatch of the graph.
#[derive(Debug)]
enum Node {
    Kernel(KernelBinding),
    Linear(LinearBinding),
    /// Attention, bound in each variant the plan may choose.
    Attention(Vec<(Variant, AttentionBinding)>),
}

impl Node {
    fn record(&self, pass: &mut wgpu::ComputePass<'_>, step: &StepParams, plan: &KernelPlan) {
        let n_tokens = step.n_tokens;
        match self {
            Node::Kernel(k) => k.record(pass, n_tokens),
            Node::Linear(l) => l.record_planned(pass, n_tokens, plan),
            Node::Attention(built) => {
                if let Some(k) = pick_variant(built, plan.variant(Family::Attention)) {
                    k.record(pass, step);
                }
            }
        }
    }
}

/// The binding of `variant`, or the first built when that variant was not built.
fn pick_variant<T>(built: &[(Variant, T)], variant: Variant) -> Option<&T> {
    built
        .iter()
        .find(|(v, _)| *v == variant)
        .or(built.first())
        .map(|(_, k)| k)
}

/// How attention splits long steps' keys under `plan` in a cache of `positions` rows: the
/// engine's policy unless forced.
fn key_split(plan: &KernelPlan, positions: u32) -> Option<KeySplit> {
    match plan.attention_split {
        None => Some(KeySplit::policy(positions)),
        Some(SplitOverride::Off) => None,
        Some(SplitOverride::Keys(k)) => Some(KeySplit::with_keys(k)),
    }
}

/// The attention geometry of `config`.
fn heads_of(config: &ModelConfig) -> Heads {
    Heads {
        n_heads: config.n_heads as u32,
        n_kv_heads: config.n_kv_heads as u32,
        head_dim: config.head_dim as u32,
    }
}

/// Activation buffers, f32, sized for `chunk` tokens.
#[derive(Debug)]
struct Activations {
    /// Token ids of the step, `[chunk]` u32.
    ids: wgpu::Buffer,
    /// Residual stream, `[chunk, d]`. Norms are folded into the linears that read it.
    x: wgpu::Buffer,
    /// Queries, `[chunk, q_dim]`, or stacked `[chunk, q_dim + 2·kv_dim]` (`q | k | v`).
    q: wgpu::Buffer,
    /// Keys and values of the step before they enter the cache, `[chunk, kv_dim]`, for layers
    /// whose Q, K and V are separate (one value otherwise).
    k: wgpu::Buffer,
    v: wgpu::Buffer,
    /// Attention output, `[chunk, q_dim]`.
    attn: wgpu::Buffer,
    /// Split attention's partials (flash-decoding), shared by the layers: see
    /// [`KeySplit::scratch_len`].
    attn_split: wgpu::Buffer,
    /// Feed-forward gate and up projections, `[chunk, ffn]`, for layers where they are
    /// separate (one value otherwise).
    gate: wgpu::Buffer,
    up: wgpu::Buffer,
    /// The feed-forward's hidden activations, `[chunk, ffn]`.
    hidden: wgpu::Buffer,
    /// Logits, `[chunk, vocab]`; a step that needs only its last token's has them in row 0.
    logits: wgpu::Buffer,
}

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
    /// every token of the step.
    head_last: LinearBinding,
    head_all: LinearBinding,
    memory: MemoryReport,
    _alive: AliveBuffers,
    /// Candidate selection over row 0 of the logits, recorded after the graph by
    /// [`Forward::decode_select`]; `None` on devices it cannot run on.
    select: Option<Select>,
    /// Readback of the selection result, `MAX_RESULT_BYTES`.
    select_staging: wgpu::Buffer,
    /// Which variant each kernel family runs, and why.
    plan: KernelPlan,
}

/// What a one-token decode step read back.
#[derive(Debug, Clone, PartialEq)]
pub enum StepLogits {
    /// The GPU's selection from the logits row (at most `MAX_RESULT_BYTES` read back).
    Candidates(Candidates),
    /// The whole logits row, `[vocab]`.
    Full(Vec<f32>),
}

/// GPU memory a [`Forward`] allocated at load, bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoryReport {
    /// Model weights as uploaded (stored type; 1-D tensors as f32).
    pub weights: u64,
    /// The KV cache (`2 · layers · context · kv_dim · 4`).
    pub kv_cache: u64,
    /// Activations for one chunk, the step uniform, the readback staging buffer and the
    /// kernels' parameter uniforms.
    pub activations: u64,
}

impl MemoryReport {
    /// Everything.
    pub fn total(&self) -> u64 {
        self.weights + self.kv_cache + self.activations
    }
}

fn f32_bytes(bytes: u64) -> u64 {
    bytes * 4
}

/// 1-D tensors (norm weights, biases) go to the GPU as f32 whatever their stored type, so the
/// small kernels read one format.
fn as_f32_tensor(name: &str, t: &Tensor<'_>) -> Result<Tensor<'static>> {
    let values = dequantize(t.dtype, &t.data, t.n_elements() as u64, name)?;
    Ok(Tensor {
        shape: t.shape.clone(),
        dtype: DType::F32,
        data: encode_float(DType::F32, &values)?.into(),
    })
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
        let config = weights.config.clone();
        if context == 0 || context > config.context_length {
            return Err(Error::invalid(
                "context",
                format!(
                    "must be in 1..={} (the model's context)",
                    config.context_length
                ),
            ));
        }
        if chunk == 0 {
            return Err(Error::invalid("chunk", "must be at least 1"));
        }
        Self::check_fits(ctx, weights, context, chunk)?;
        let fusion = fuse::plan(weights);
        let gpu = Self::upload(ctx, weights, &fusion, progress)?;
        let kv = KvCache::new(ctx, &config, context)?;
        let c = chunk as u64;
        let (d, q, kv_dim, ff, vocab) = (
            config.hidden_size as u64,
            config.q_dim() as u64,
            config.kv_dim() as u64,
            config.ffn_size as u64,
            config.vocab_size as u64,
        );
        let before = ctx.counters();
        let (plan, key) = measure::initial_plan(ctx, weights, chunk).await?;
        let split = key_split(&plan, kv.context() as u32);
        let split_len = split.map_or(1, |s| s.scratch_len(heads_of(&config), kv.context() as u32));
        let buf = |name: &str, elems: u64| ctx.storage_zeroed(name, f32_bytes(elems));
        let (sep_qkv, sep_ffn) = (
            u64::from(fusion.any_separate_qkv()),
            u64::from(fusion.any_separate_gate_up()),
        );
        let act = Activations {
            ids: buf("ids", c)?,
            x: buf("x", c * d)?,
            q: buf("q", c * (q + 2 * kv_dim))?,
            k: buf("k", (c * kv_dim * sep_qkv).max(1))?,
            v: buf("v", (c * kv_dim * sep_qkv).max(1))?,
            attn: buf("attn", c * q)?,
            attn_split: buf("attention split partials", split_len)?,
            gate: buf("gate", (c * ff * sep_ffn).max(1))?,
            up: buf("up", (c * ff * sep_ffn).max(1))?,
            hidden: buf("hidden", c * ff)?,
            logits: buf("logits", c * vocab)?,
        };
        let step = StepParams::create_buffer(ctx, "step params");
        let staging = ctx.staging_buffer("logits readback", f32_bytes(c * vocab));
        let weight_bytes: u64 = gpu.values().map(|t| t.buffer.size()).sum();
        let act_buffers = [
            &act.ids,
            &act.x,
            &act.q,
            &act.k,
            &act.v,
            &act.attn,
            &act.attn_split,
            &act.gate,
            &act.up,
            &act.hidden,
            &act.logits,
            &step,
            &staging,
        ];
        let activation_bytes: u64 = act_buffers.iter().map(|b| b.size()).sum();
        let alive = AliveBuffers::new(
            ctx.counter_cells(),
            gpu.values()
                .map(|t| t.buffer.size())
                .chain(act_buffers.iter().map(|b| b.size())),
        );
        let memory = MemoryReport {
            weights: weight_bytes,
            kv_cache: kv.bytes(),
            activations: activation_bytes,
        };
        let graph = Graph {
            config: &config,
            chunk,
            kv: &kv,
            step: &step,
            act: &act,
            w: &gpu,
            plan: &plan,
        };
        let (nodes, head_last, head_all) = graph.build(ctx, cache).await?;
        let select = match Select::new(ctx, cache, &act.logits, vocab as u32).await {
            Ok(select) => Some(select),
            // Decode steps then read the whole row.
            Err(Error::Limit { .. }) => None,
            Err(e) => return Err(e),
        };
        let select_staging = ctx.staging_buffer("select readback", MAX_RESULT_BYTES as u64);
        let mut alive = alive;
        alive.extend([select_staging.size()]);
        let mut memory = memory;
        // The kernels' parameter uniforms are part of the activations' footprint.
        memory.activations += ctx.counters().since(&before).buffer_bytes_created;
        let mut forward = Self {
            memory,
            _alive: alive,
            config,
            chunk,
            _weights: gpu,
            kv,
            step,
            act,
            staging,
            nodes,
            head_last,
            head_all,
            select,
            select_staging,
            plan,
        };
        forward.finish_plan(ctx, &key).await?;
        Ok(forward)
    }

    /// The kernel plan this model runs with.
    pub fn plan(&self) -> &KernelPlan {
        &self.plan
    }

    /// Checks every buffer the model will need against the device's limits before anything is
    /// allocated, so a model that cannot run fails at once with the numbers.
    fn check_fits(
        ctx: &GpuContext,
        weights: &ModelWeights<'_>,
        context: usize,
        chunk: usize,
    ) -> Result<()> {
        let c = &weights.config;
        let limit = ctx.limits().max_storage_buffer_binding_size;
        for (name, t) in &weights.tensors {
            let bytes = t.data.len() as u64;
            if bytes > limit {
                return Err(Error::Limit {
                    what: format!("tensor `{name}` ({} {:?})", t.dtype, t.shape),
                    limit: "maxStorageBufferBindingSize",
                    needed: bytes,
                    allowed: limit,
                });
            }
        }
        let chunk = chunk as u64;
        let widest = [
            c.hidden_size,
            c.q_dim() + 2 * c.kv_dim(),
            c.ffn_size,
            c.vocab_size,
        ]
        .into_iter()
        .max()
        .unwrap_or(0) as u64;
        ctx.check_storage_size(
            "activations (chunk × widest layer)",
            f32_bytes(chunk * widest),
        )?;
        ctx.check_storage_size(
            "KV cache layer (context × kv_dim)",
            f32_bytes(context as u64 * c.kv_dim() as u64),
        )?;
        Ok(())
    }

    /// Uploads every tensor, replacing those that `plan` fuses by the fused ones (built one
    /// layer at a time, so at most one layer's copies exist at once).
    fn upload(
        ctx: &GpuContext,
        weights: &ModelWeights<'_>,
        plan: &FusionPlan,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<HashMap<String, GpuTensor>> {
        let mut out = HashMap::new();
        let total = weights.weight_bytes();
        let mut done = 0u64;
        progress(0, total);
        for (name, t) in &weights.tensors {
            done += t.data.len() as u64;
            if plan.replaced(name) {
                continue;
            }
            let t = if t.shape.len() == 1 && t.dtype != DType::F32 {
                as_f32_tensor(name, t)?
            } else {
                t.clone()
            };
            out.insert(name.clone(), GpuTensor::upload(ctx, name, &t)?);
            progress(done, total);
        }
        for layer in 0..weights.config.n_layers {
            for (name, t) in fuse::fused_tensors(weights, plan, layer)? {
                out.insert(name.clone(), GpuTensor::upload(ctx, &name, &t)?);
            }
        }
        progress(total, total);
        Ok(out)
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

    /// The KV cache (its position is the next token's position).
    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    /// A spare KV store of `rows` positions with this model's shape (for beam states).
    pub fn new_kv_slot(&self, ctx: &GpuContext, rows: usize) -> Result<KvCache> {
        KvCache::new(ctx, &self.config, rows.max(1))
    }

    /// Copies cached positions `[start, pos)` into rows `[0, pos - start)` of `slot`.
    pub fn save_kv(&self, ctx: &GpuContext, start: usize, slot: &KvCache) -> Result<()> {
        let rows = self.kv.pos().checked_sub(start).ok_or_else(|| {
            Error::invalid(
                "start",
                format!("{start} is past the cached {} positions", self.kv.pos()),
            )
        })?;
        KvCache::copy_rows(ctx, &self.kv, start, slot, 0, rows)
    }

    /// Restores rows `[0, rows)` of `slot` into positions `[start, start + rows)` and sets the
    /// position to `start + rows`. Positions before `start` must already hold the shared prefix.
    pub fn load_kv(
        &mut self,
        ctx: &GpuContext,
        start: usize,
        slot: &KvCache,
        rows: usize,
    ) -> Result<()> {
        if start > self.kv.pos() {
            return Err(Error::invalid(
                "start",
                format!("{start} is past the cached {} positions", self.kv.pos()),
            ));
        }
        KvCache::copy_rows(ctx, slot, 0, &self.kv, start, rows)?;
        self.kv.set_pos(start + rows)
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

    /// Runs `tokens` from the cache's position on, in chunks: one submit per chunk. Returns
    /// the logits of the last token (`[vocab]`), or of every token (`[tokens.len() · vocab]`)
    /// when `all_logits`.
    pub async fn forward(
        &mut self,
        ctx: &GpuContext,
        tokens: &[u32],
        all_logits: bool,
    ) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(Error::invalid("tokens", "at least one token is needed"));
        }
        let vocab = self.config.vocab_size;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::invalid(
                "tokens",
                format!("token id {bad} is outside the vocabulary of {vocab}"),
            ));
        }
        let end = self.kv.pos() + tokens.len();
        if end > self.kv.context() {
            return Err(Error::invalid(
                "tokens",
                format!(
                    "{} tokens after {} cached ones exceed the context of {}",
                    tokens.len(),
                    self.kv.pos(),
                    self.kv.context()
                ),
            ));
        }
        let mut out = Vec::new();
        let chunks: Vec<&[u32]> = tokens.chunks(self.chunk).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            let last = i + 1 == chunks.len();
            let rows = if all_logits {
                chunk.len()
            } else {
                usize::from(last)
            };
            let logits = self.step(ctx, chunk, rows).await?;
            out.extend(logits);
        }
        Ok(out)
    }

    /// One step: writes the parameters and ids, records every node in one compute pass, copies
    /// the last `rows` rows of logits to the staging buffer, submits once, reads back.
    async fn step(&mut self, ctx: &GpuContext, tokens: &[u32], rows: usize) -> Result<Vec<f32>> {
        let n = tokens.len();
        let pos0 = self.kv.pos();
        let params = StepParams::checked(
            pos0 as u32,
            n as u32,
            self.chunk as u32,
            self.kv.context() as u32,
        )?;
        params.write(ctx, &self.step);
        ctx.queue
            .write_buffer(&self.act.ids, 0, bytemuck::cast_slice(tokens));
        let mut encoder = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("forward step"),
            });
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("forward step"),
                timestamp_writes: None,
            });
            ctx.counter_cells().compute_pass();
            for node in &self.nodes {
                node.record(&mut pass, &params, &self.plan);
            }
            // The head runs only for logits someone reads: the last row alone into row 0,
            // or every row.
            match rows {
                0 => {}
                1 => self
                    .head_last
                    .record_planned(&mut pass, n as u32, &self.plan),
                _ => self
                    .head_all
                    .record_planned(&mut pass, n as u32, &self.plan),
            }
        }
        let row_bytes = f32_bytes(self.config.vocab_size as u64);
        let bytes = rows as u64 * row_bytes;
        if rows > 0 {
            let from = if rows == 1 {
                0
            } else {
                (n - rows) as u64 * row_bytes
            };
            encoder.copy_buffer_to_buffer(&self.act.logits, from, &self.staging, 0, bytes);
        }
        ctx.counter_cells().submit(1);
        ctx.counter_cells().forward_step(n as u64);
        let submission = ctx.queue.submit([encoder.finish()]);
        self.kv.set_pos(pos0 + n)?;
        if rows == 0 {
            ctx.check()?;
            return Ok(Vec::new());
        }
        let data = ctx.read_staging(&self.staging, bytes, submission).await?;
        Ok(bytemuck::pod_collect_to_vec(&data))
    }

    /// One decode step for `token` (one pass, one submit, one readback, like [`Self::forward`]):
    /// with `request`, the candidate selection runs after the graph in the same pass and only
    /// its result is read back ([`StepLogits::Candidates`]); without one, or when the device
    /// cannot run the selection, the whole row ([`StepLogits::Full`], `[vocab]`).
    pub async fn decode_select(
        &mut self,
        ctx: &GpuContext,
        token: u32,
        request: Option<&SelectRequest>,
    ) -> Result<StepLogits> {
        let Some((select, request)) = self.select.as_ref().zip(request) else {
            return Ok(StepLogits::Full(self.forward(ctx, &[token], false).await?));
        };
        let vocab = self.config.vocab_size;
        if token as usize >= vocab {
            return Err(Error::invalid(
                "token",
                format!("token id {token} is outside the vocabulary of {vocab}"),
            ));
        }
        let pos0 = self.kv.pos();
        let params =
            StepParams::checked(pos0 as u32, 1, self.chunk as u32, self.kv.context() as u32)?;
        select.write(ctx, request)?;
        params.write(ctx, &self.step);
        ctx.queue
            .write_buffer(&self.act.ids, 0, bytemuck::bytes_of(&token));
        let mut encoder = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("decode step"),
            });
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("decode step"),
                timestamp_writes: None,
            });
            ctx.counter_cells().compute_pass();
            for node in &self.nodes {
                node.record(&mut pass, &params, &self.plan);
            }
            self.head_last.record_planned(&mut pass, 1, &self.plan);
            select.record(&mut pass);
        }
        let bytes = request.result_bytes();
        encoder.copy_buffer_to_buffer(select.result(), 0, &self.select_staging, 0, bytes);
        ctx.counter_cells().submit(1);
        ctx.counter_cells().forward_step(1);
        let submission = ctx.queue.submit([encoder.finish()]);
        self.kv.set_pos(pos0 + 1)?;
        let data = ctx
            .read_staging(&self.select_staging, bytes, submission)
            .await?;
        Ok(StepLogits::Candidates(Select::parse(&data, request)?))
    }

    /// Reads back the logits row of the last one-token step (`[vocab]`, row 0), for a decode
    /// step whose candidates did not suffice: one more submit and readback, no forward step.
    pub async fn last_logits(&self, ctx: &GpuContext) -> Result<Vec<f32>> {
        let bytes = f32_bytes(self.config.vocab_size as u64);
        let mut encoder = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("logits readback"),
            });
        encoder.copy_buffer_to_buffer(&self.act.logits, 0, &self.staging, 0, bytes);
        ctx.counter_cells().submit(1);
        let submission = ctx.queue.submit([encoder.finish()]);
        let data = ctx.read_staging(&self.staging, bytes, submission).await?;
        Ok(bytemuck::pod_collect_to_vec(&data))
    }
}

/// What building the graph reads: the model, its uploaded weights and the buffers.
struct Graph<'a> {
    config: &'a ModelConfig,
    chunk: usize,
    kv: &'a KvCache,
    step: &'a wgpu::Buffer,
    act: &'a Activations,
    w: &'a HashMap<String, GpuTensor>,
    plan: &'a KernelPlan,
}

/// The extras of one linear node (the plain layer by default).
#[derive(Default)]
struct LinearSpec<'p> {
    /// Prefix of the norm folded into the input (`blk.3.attn_norm`).
    norm: Option<&'p str>,
    accumulate: bool,
    epilogue: Epilogue,
    last_row: bool,
    /// The stacked Q/K/V layer of this layer index, writing its KV cache (rotating with RoPE).
    kv_layer: Option<usize>,
}

impl Graph<'_> {
    fn get(&self, name: &str) -> Result<&GpuTensor> {
        self.w
            .get(name)
            .ok_or_else(|| Error::format("model", format!("missing tensor `{name}`")))
    }

    /// The per-step nodes of every layer, then the LM head for the last row and for all rows.
    async fn build(
        &self,
        ctx: &GpuContext,
        cache: &KernelCache,
    ) -> Result<(Vec<Node>, LinearBinding, LinearBinding)> {
        let c = self.config;
        let red = Reduction::best(ctx);
        let max = self.chunk as u32;
        let step = self.step;
        let a = self.act;
        let mut nodes = Vec::new();
        let embd = self.get("token_embd.weight")?;
        let embed = Embedding::new(ctx, cache, embd.dtype, EmbedSource::Tokens, false).await?;
        nodes.push(Node::Kernel(embed.bind(
            ctx,
            step,
            embd,
            Some(&a.ids),
            &a.x,
            max,
        )?));
        if c.arch == Architecture::Gpt2 {
            let pos = self.get("position_embd.weight")?;
            let e = Embedding::new(ctx, cache, pos.dtype, EmbedSource::Positions, true).await?;
            nodes.push(Node::Kernel(e.bind(ctx, step, pos, None, &a.x, max)?));
        }
        let heads = heads_of(c);
        let positions = self.kv.context() as u32;
        for layer in 0..c.n_layers {
            let b = |s: &str| format!("blk.{layer}.{s}");
            let attn_norm = b("attn_norm");
            let normed = || LinearSpec {
                norm: Some(&attn_norm),
                ..LinearSpec::default()
            };
            // GPT-2's c_attn is stored stacked; Llama's Q, K, V are stacked at load when they
            // share a type (`fuse`): one product, rows `q | k | v`.
            let stacked = match c.arch {
                Architecture::Gpt2 => Some(b("attn_qkv")),
                Architecture::Llama => {
                    let name = fuse::qkv_name(layer, "weight");
                    self.w.contains_key(&name).then(|| b("attn_qkv"))
                }
            };
            let form = match &stacked {
                Some(prefix) => {
                    // RoPE and the KV-cache write happen in the projection's epilogue (its
                    // Q/K rows are in adjacent-pair order: GGUF's own, or permuted by `fuse`).
                    let spec = LinearSpec {
                        kv_layer: Some(layer),
                        ..normed()
                    };
                    nodes.push(
                        self.linear(ctx, cache, red, prefix, &a.x, &a.q, spec)
                            .await?,
                    );
                    QkvForm::Fused
                }
                None => {
                    for (part, y) in [("q", &a.q), ("k", &a.k), ("v", &a.v)] {
                        let prefix = b(&format!("attn_{part}"));
                        nodes.push(
                            self.linear(ctx, cache, red, &prefix, &a.x, y, normed())
                                .await?,
                        );
                    }
                    QkvForm::Separate
                }
            };
            let (qkv, q_stride) = match form {
                QkvForm::Fused => (Qkv::Fused(&a.q), (c.q_dim() + 2 * c.kv_dim()) as u32),
                QkvForm::Separate => (
                    Qkv::Separate {
                        q: &a.q,
                        k: &a.k,
                        v: &a.v,
                    },
                    c.q_dim() as u32,
                ),
            };
            if let Qkv::Separate { .. } = qkv {
                let rope = RopeKvWrite::new(ctx, cache, c.rope_layout, form).await?;
                nodes.push(Node::Kernel(rope.bind(
                    ctx,
                    step,
                    qkv,
                    &self.kv.k[layer],
                    &self.kv.v[layer],
                    heads,
                    c.rope_theta,
                    positions,
                    max,
                )?));
            }
            let mut built = Vec::new();
            for variant in self.plan.candidates(Family::Attention) {
                let attention =
                    match Attention::with_variant(ctx, cache, red, variant, heads.head_dim).await {
                        Ok(a) => a,
                        // heads too large for the rows shape: measure without it (a forced
                        // rows plan still fails with the reason)
                        Err(Error::InvalidArgument { .. })
                            if variant == Variant::Rows
                                && self.plan.candidates(Family::Attention).len() > 1 =>
                        {
                            continue
                        }
                        Err(e) => return Err(e),
                    };
                built.push((
                    variant,
                    attention.bind(
                        ctx,
                        step,
                        &a.q,
                        q_stride,
                        &self.kv.k[layer],
                        &self.kv.v[layer],
                        &a.attn,
                        heads,
                        positions,
                        max,
                        key_split(self.plan, positions).map(|s| (s, &a.attn_split)),
                    )?,
                ));
            }
            nodes.push(Node::Attention(built));
            let residual = LinearSpec {
                accumulate: true,
                ..LinearSpec::default()
            };
            let o = b("attn_output");
            nodes.push(
                self.linear(ctx, cache, red, &o, &a.attn, &a.x, residual)
                    .await?,
            );
            let ffn_norm = b("ffn_norm");
            match c.arch {
                Architecture::Llama => {
                    let stacked = fuse::gate_up_name(layer, "weight");
                    if self.w.contains_key(&stacked) {
                        let spec = LinearSpec {
                            norm: Some(&ffn_norm),
                            epilogue: Epilogue::SwiGlu,
                            ..LinearSpec::default()
                        };
                        let prefix = b("ffn_gate_up");
                        nodes.push(
                            self.linear(ctx, cache, red, &prefix, &a.x, &a.hidden, spec)
                                .await?,
                        );
                    } else {
                        for (part, y) in [("gate", &a.gate), ("up", &a.up)] {
                            let spec = LinearSpec {
                                norm: Some(&ffn_norm),
                                ..LinearSpec::default()
                            };
                            let prefix = b(&format!("ffn_{part}"));
                            nodes.push(self.linear(ctx, cache, red, &prefix, &a.x, y, spec).await?);
                        }
                        let swiglu = SwiGlu::new(ctx, cache).await?;
                        nodes.push(Node::Kernel(swiglu.bind(
                            ctx,
                            step,
                            &a.gate,
                            &a.up,
                            &a.hidden,
                            c.ffn_size as u32,
                            max,
                        )?));
                    }
                }
                Architecture::Gpt2 => {
                    let spec = LinearSpec {
                        norm: Some(&ffn_norm),
                        epilogue: Epilogue::Gelu,
                        ..LinearSpec::default()
                    };
                    let prefix = b("ffn_up");
                    nodes.push(
                        self.linear(ctx, cache, red, &prefix, &a.x, &a.hidden, spec)
                            .await?,
                    );
                }
            }
            let down = b("ffn_down");
            let residual = LinearSpec {
                accumulate: true,
                ..LinearSpec::default()
            };
            nodes.push(
                self.linear(ctx, cache, red, &down, &a.hidden, &a.x, residual)
                    .await?,
            );
        }
        let head = if c.tied_embeddings {
            "token_embd"
        } else {
            "output"
        };
        let mut heads_bound = Vec::new();
        for last_row in [true, false] {
            let spec = LinearSpec {
                norm: Some("output_norm"),
                last_row,
                ..LinearSpec::default()
            };
            // The head's bias, if any, is `output.bias` even when the matrix is tied.
            let weight = format!("{head}.weight");
            heads_bound.push(
                self.linear_named(
                    ctx,
                    cache,
                    red,
                    &weight,
                    "output.bias",
                    &a.x,
                    &a.logits,
                    spec,
                )
                .await?,
            );
        }
        let head_all = heads_bound.pop();
        let head_last = heads_bound.pop();
        match (head_last, head_all) {
            (Some(last), Some(all)) => Ok((nodes, last, all)),
            _ => Err(Error::format("model", "LM head could not be bound")),
        }
    }

    /// A linear node over `{prefix}.weight` (and `{prefix}.bias` when the file has it).
    #[allow(clippy::too_many_arguments)]
    async fn linear(
        &self,
        ctx: &GpuContext,
        cache: &KernelCache,
        red: Reduction,
        prefix: &str,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        spec: LinearSpec<'_>,
    ) -> Result<Node> {
        let (weight, bias) = (format!("{prefix}.weight"), format!("{prefix}.bias"));
        let binding = self
            .linear_named(ctx, cache, red, &weight, &bias, x, y, spec)
            .await?;
        Ok(Node::Linear(binding))
    }

    #[allow(clippy::too_many_arguments)]
    async fn linear_named(
        &self,
        ctx: &GpuContext,
        cache: &KernelCache,
        red: Reduction,
        name: &str,
        bias: &str,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        spec: LinearSpec<'_>,
    ) -> Result<LinearBinding> {
        let weight = self.get(name)?;
        let bias = self.w.get(bias);
        let norm_kind = match self.config.norm {
            NormKind::RmsNorm => InputNorm::Rms,
            NormKind::LayerNorm => InputNorm::Layer,
        };
        let norm = match spec.norm {
            Some(prefix) => {
                let weight = self.get(&format!("{prefix}.weight"))?;
                let bias = match norm_kind {
                    InputNorm::Rms => None,
                    InputNorm::Layer => Some(&self.get(&format!("{prefix}.bias"))?.buffer),
                };
                Some(NormBinding {
                    weight: &weight.buffer,
                    bias,
                    eps: self.config.norm_eps,
                })
            }
            None => None,
        };
        let c = self.config;
        let rope = c.rope_layout != RopeLayout::None;
        let kv =
            match spec.kv_layer {
                Some(layer) => Some(KvWriteBinding {
                    k_cache: self.kv.k.get(layer).ok_or_else(|| {
                        Error::invalid("layer", format!("no KV cache for {layer}"))
                    })?,
                    v_cache: self.kv.v.get(layer).ok_or_else(|| {
                        Error::invalid("layer", format!("no KV cache for {layer}"))
                    })?,
                    q_rows: c.q_dim() as u32,
                    kv_rows: c.kv_dim() as u32,
                    head_dim: c.head_dim as u32,
                    theta: c.rope_theta,
                    max_positions: self.kv.context() as u32,
                }),
                None => None,
            };
        let options = LinearOptions {
            has_bias: bias.is_some(),
            accumulate: spec.accumulate,
            norm: spec.norm.map(|_| norm_kind),
            epilogue: spec.epilogue,
            last_row: spec.last_row,
            kv_write: kv.is_some(),
            rope: kv.is_some() && rope,
        };
        let op = Linear::with_variants(
            ctx,
            cache,
            weight.dtype,
            red,
            options,
            &self.plan.candidates(Family::LinearDecode),
            &self.plan.candidates(Family::LinearPrefill),
        )
        .await?;
        op.bind_qkv(
            ctx,
            self.step,
            weight,
            x,
            bias.map(|b| &b.buffer),
            norm,
            kv,
            y,
            self.chunk as u32,
        )
    }
}
