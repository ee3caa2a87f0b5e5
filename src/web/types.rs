//! The camelCase views of the engine's results that are converted to JS objects, named as
//! JavaScript knows them. Their TypeScript declarations are derived from them (`Tsify`);
//! `typescript.rs` declares the rest of the API in terms of these.

use serde::Serialize;
use tsify::Tsify;

use crate::backend::gpu::Counters;
use crate::sampling::Preset;
use crate::session::{Generation, Sequence, Session, Stats};

/// One generated sequence.
#[derive(Serialize, Tsify)]
#[serde(rename_all = "camelCase")]
struct SequenceResult<'a> {
    text: &'a str,
    tokens: &'a [u32],
    #[tsify(type = "FinishReason")]
    finish_reason: &'static str,
    /// Sum of the tokens' log-probabilities.
    logprob: f64,
}

impl<'a> From<&'a Sequence> for SequenceResult<'a> {
    fn from(s: &'a Sequence) -> Self {
        Self {
            text: &s.text,
            tokens: &s.tokens,
            finish_reason: s.finish_reason.as_str(),
            logprob: s.logprob,
        }
    }
}

/// Timings and counts of one call.
#[derive(Serialize, Tsify)]
#[serde(rename_all = "camelCase")]
struct GenerationStats {
    /// Prompt tokens (after the chat template and any cut).
    prompt_tokens: usize,
    /// Prompt tokens whose KV state was reused from the previous call.
    cached_tokens: usize,
    generated_tokens: usize,
    prefill_ms: f64,
    decode_ms: f64,
    time_to_first_token_ms: f64,
    /// Decode steps per second (0 when there were none).
    decode_tok_per_s: f64,
    /// Sampled tokens drawn from the GPU-selected candidates alone (a few hundred bytes read).
    candidate_steps: usize,
    /// Sampled tokens drawn from a whole logits row read back.
    full_row_steps: usize,
    /// Of those, steps whose candidates did not suffice, so the row was read as well.
    select_fallbacks: usize,
    /// Steps whose draw a response format restricted.
    constrained_steps: usize,
    /// Time spent computing those steps' allowed tokens.
    constraint_ms: f64,
    /// What speculative decoding did (absent when it was off).
    #[tsify(optional)]
    #[serde(skip_serializing_if = "Option::is_none")]
    speculative: Option<SpeculativeStats>,
}

/// Speculative decoding's counts for one call.
#[derive(Serialize, Tsify)]
#[serde(rename_all = "camelCase")]
struct SpeculativeStats {
    /// `draft` or `lookup`.
    method: String,
    /// Tokens drafted.
    drafted: usize,
    /// Drafted tokens the model accepted.
    accepted: usize,
    /// `accepted / drafted` (0 when nothing was drafted).
    acceptance_rate: f64,
    /// Model forward steps after the prompt.
    target_steps: usize,
    /// The draft length at the end (0 once the acceptance fallback turned speculation off).
    k_final: usize,
}

impl From<&Stats> for GenerationStats {
    fn from(s: &Stats) -> Self {
        Self {
            prompt_tokens: s.prompt_tokens,
            cached_tokens: s.cached_tokens,
            generated_tokens: s.generated_tokens,
            prefill_ms: s.prefill_ms,
            decode_ms: s.decode_ms,
            time_to_first_token_ms: s.time_to_first_token_ms,
            decode_tok_per_s: s.decode_tok_per_s,
            candidate_steps: s.candidate_steps,
            full_row_steps: s.full_row_steps,
            select_fallbacks: s.select_fallbacks,
            constrained_steps: s.constrained_steps,
            constraint_ms: s.constraint_ms,
            speculative: s.speculative.as_ref().map(|p| SpeculativeStats {
                method: p.method.clone(),
                drafted: p.drafted,
                accepted: p.accepted,
                acceptance_rate: p.acceptance_rate,
                target_steps: p.target_steps,
                k_final: p.k_final,
            }),
        }
    }
}

/// The result of `generate` (and the return value of `stream`'s iterator).
#[derive(Serialize, Tsify)]
#[serde(rename_all = "camelCase")]
pub(crate) struct GenerationResult<'a> {
    /// The first sequence's text, tokens and finish reason.
    text: &'a str,
    tokens: &'a [u32],
    #[tsify(type = "FinishReason")]
    finish_reason: &'static str,
    /// Every sequence, best first for beam search.
    sequences: Vec<SequenceResult<'a>>,
    /// The seed used (repeat the run with it); null for greedy and beam search.
    #[tsify(type = "number | null")]
    seed: Option<u64>,
    /// Things to know: a prompt cut to fit the context, a context slide.
    warnings: &'a [String],
    stats: GenerationStats,
    /// The prompt as token ids.
    prompt_token_ids: &'a [u32],
}

impl<'a> From<&'a Generation> for GenerationResult<'a> {
    fn from(g: &'a Generation) -> Self {
        let first = g.sequences.first();
        Self {
            text: first.map_or("", |s| s.text.as_str()),
            tokens: first.map_or(&[], |s| s.tokens.as_slice()),
            finish_reason: first.map_or("abort", |s| s.finish_reason.as_str()),
            sequences: g.sequences.iter().map(SequenceResult::from).collect(),
            seed: g.seed,
            warnings: &g.warnings,
            stats: GenerationStats::from(&g.stats),
            prompt_token_ids: &g.prompt_tokens,
        }
    }
}

/// The device limits the engine works within.
#[derive(Clone, Serialize, Tsify)]
#[serde(rename_all = "camelCase")]
struct EngineLimits {
    max_storage_buffer_binding_size: u64,
    max_buffer_size: u64,
    max_storage_buffers_per_shader_stage: u32,
    max_compute_workgroup_storage_size: u32,
    max_compute_invocations_per_workgroup: u32,
    max_compute_workgroups_per_dimension: u32,
}

/// The model as loaded.
#[derive(Clone, Serialize, Tsify)]
#[serde(rename_all = "camelCase")]
struct ModelInfo {
    /// The file name.
    name: String,
    #[tsify(type = "'llama' | 'gpt2'")]
    arch: &'static str,
    layers: usize,
    vocab: usize,
    hidden_size: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    ffn_size: usize,
    /// The context the model was trained for.
    context_length: usize,
    /// Weight bytes on the GPU.
    weight_bytes: u64,
    #[tsify(type = "number | null")]
    bos_id: Option<u32>,
    eos_ids: Vec<u32>,
}

/// Where the model file came from, for [`EngineInfo`].
#[derive(Clone, Debug, Default)]
pub(crate) struct SourceNote {
    /// Read from the store.
    pub loaded_from_cache: bool,
    /// Downloaded and kept in the store by this load.
    pub stored_in_cache: bool,
    /// The store's medium (`opfs`, `cacheApi`), when `cache` named one.
    pub storage: Option<String>,
    /// Bytes received from the network.
    pub bytes_downloaded: u64,
    /// `navigator.storage.persist()`'s answer if it came during the load, else
    /// `navigator.storage.persisted()` at its end; `None` when not asked (a worker).
    pub persisted: Option<bool>,
    /// Why the download could not be kept in the store, when it could not.
    pub storage_notice: Option<String>,
    /// The tensors went to the GPU a layer at a time, read by range from the files.
    pub read_by_range: bool,
}

/// What `engine.info()` reports.
#[derive(Clone, Serialize, Tsify)]
#[serde(rename_all = "camelCase")]
pub(crate) struct EngineInfo {
    /// The adapter's name as the browser reports it.
    adapter: String,
    backend: String,
    device_type: String,
    /// Features requested on the device.
    features: Vec<String>,
    /// Every feature the adapter offers.
    adapter_features: Vec<String>,
    subgroups: bool,
    shader_f16: bool,
    limits: EngineLimits,
    model: ModelInfo,
    /// KV cache length in positions.
    context_length: usize,
    /// What set `contextLength`: `asked for`, the model's trained context, the default cap of
    /// 4096, the device's largest storage buffer, or (the CPU backend in WebAssembly) what
    /// fits the 4 GiB address space beside the weights; in words, with the numbers.
    context_reason: String,
    /// How `chat.completions`' `tools` reach the model: `hermes`, `llama3`, `mistral` or
    /// `mistral-args` (the chat template reads `tools` and the model writes calls in that
    /// syntax), or `generic` (the
    /// template does not read them: they are described in the system message and calls are
    /// written as `<tool_call>` blocks).
    tool_format: &'static str,
    /// How the KV cache stores K and V (`q8_0`, or `k q8_0 / v f16`).
    kv_cache: String,
    /// Bytes of K and V one more position of context costs: every layer's, or only the
    /// global layers' for a model with local layers (Gemma 3), whose rings of window + chunk
    /// rows do not grow with the context.
    kv_bytes_per_token: u64,
    /// Sequences `generateBatch` decodes together at most at this context (each takes a KV
    /// slot of `contextLength` positions).
    max_batch: usize,
    /// The automatic KV-cache plan's decision and measurements (`kvCache: 'auto'`).
    #[tsify(type = "KvCachePlanInfo | null")]
    kv_cache_plan: Option<crate::session::CacheDecision>,
    /// How attention reads long contexts at this context length (`decodePlan`):
    /// `auto (whole up to 512 keys, 256-key blocks from 513 keys, …)`.
    decode_plan: String,
    /// The matrix products' precision on this device (`precision` resolved): `f32` or `f16` on
    /// the GPU; on the CPU backend `int8` (quantized weights meet 8-bit activations) or `f32`
    /// (`precision: 'f32'` asked for by name: every row dequantized, the GPU's answers).
    precision: String,
    /// Why `precision: 'auto'` runs in f32 here, when it does.
    precision_notice: Option<String>,
    /// Whether the model brought its own chat template (otherwise a plain fallback is used).
    has_chat_template: bool,
    /// Every file came from the store (`cache`), not the network.
    loaded_from_cache: bool,
    /// This load downloaded the files and kept them in the store (false when they came from
    /// it).
    stored_in_cache: bool,
    /// Where the store lives: `'opfs'` (the Origin Private File System) or `'cacheApi'`;
    /// `null` without `cache`.
    #[tsify(type = "'opfs' | 'cacheApi' | null")]
    storage: Option<String>,
    /// Bytes this load received from the network (0 from the store; a resumed download counts
    /// only the rest).
    bytes_downloaded: u64,
    /// Whether the browser agreed to keep the store under storage pressure
    /// (`navigator.storage.persist()`, asked when a download is stored but never waited for:
    /// its answer if it came during the load, else `navigator.storage.persisted()` at the end);
    /// `null` when not asked (a worker cannot ask: call it from the page).
    persisted: Option<bool>,
    /// Why the download could not be kept in the store (the model loaded without it), when it
    /// could not: a quota reached while writing, a storage error.
    storage_notice: Option<String>,
    /// Whether the weights went to the GPU a layer at a time, read by range from the File, the
    /// stored download or the server, so that the page never held the files (a GPU load from a
    /// `File`, from an Origin Private File System store, or from a URL without a store whose
    /// server answers ranges); false when the files were read whole.
    weights_read_by_range: bool,
    /// The kernel plan of this device and model (`null` on the CPU backend).
    #[tsify(type = "KernelPlanInfo | null")]
    kernel_plan: Option<crate::backend::gpu::KernelPlan>,
    /// What runs the model: `gpu` (WebGPU) or `cpu` (WebAssembly).
    runs_on: &'static str,
    /// Threads the CPU backend computes on (1 without cross-origin isolation); 0 on the GPU.
    threads: usize,
    /// The instructions the CPU backend's dot products run on: `simd128` in the page's
    /// modules (all are built with WebAssembly SIMD), `simd128+relaxed` in the threaded
    /// module for engines with relaxed SIMD (its matrix products in tiles), `scalar` in a
    /// build without SIMD; a native build names its own
    /// (`crate::backend::cpu::dot::instruction_set`).
    #[tsify(
        type = "'simd128' | 'simd128+relaxed' | 'scalar' | 'avx512vnni' | 'avx2' | 'sse2' | 'neon'"
    )]
    cpu_instructions: &'static str,
    /// Why the CPU backend runs on one thread when the browser could give it more (the page
    /// is not cross-origin isolated, or the worker pool did not start); `null` otherwise.
    threads_notice: Option<String>,
    /// Why the model runs where it runs when that was not asked for (no usable WebGPU, or
    /// `auto`'s measured choice on a software adapter).
    backend_notice: Option<String>,
    /// `auto`'s measured choice on a software adapter (`null` otherwise).
    #[tsify(type = "BackendChoiceInfo | null")]
    backend_choice: Option<BackendChoiceInfo>,
    /// The draft model of speculative decoding (`loadDraft`, `draft` load option), if any.
    draft: Option<String>,
    /// The sampling presets (`preset`), each with what it sets: what a page's preset menu
    /// fills in, from the engine's own table.
    presets: Vec<PresetInfo>,
}

impl EngineInfo {
    /// Describes a loaded session; `name` is the model file's name, `weight_bytes` its weights.
    pub fn new(session: &Session, name: &str, weight_bytes: u64, source: SourceNote) -> Self {
        let cpu_report;
        let r = match session.gpu() {
            Some(gpu) => gpu.report(),
            None => {
                cpu_report = cpu_adapter_report();
                &cpu_report
            }
        };
        let c = session.config();
        Self {
            adapter: r.name.clone(),
            backend: r.backend.clone(),
            device_type: r.device_type.clone(),
            features: r.device_features.clone(),
            adapter_features: r.adapter_features.clone(),
            subgroups: r.subgroups,
            shader_f16: r.shader_f16,
            limits: EngineLimits {
                max_storage_buffer_binding_size: r.limits.max_storage_buffer_binding_size,
                max_buffer_size: r.limits.max_buffer_size,
                max_storage_buffers_per_shader_stage: r.limits.max_storage_buffers_per_shader_stage,
                max_compute_workgroup_storage_size: r.limits.max_compute_workgroup_storage_size,
                max_compute_invocations_per_workgroup: r
                    .limits
                    .max_compute_invocations_per_workgroup,
                max_compute_workgroups_per_dimension: r.limits.max_compute_workgroups_per_dimension,
            },
            model: ModelInfo {
                name: name.to_string(),
                arch: c.arch.name(),
                layers: c.n_layers,
                vocab: c.vocab_size,
                hidden_size: c.hidden_size,
                heads: c.n_heads,
                kv_heads: c.n_kv_heads,
                head_dim: c.head_dim,
                ffn_size: c.ffn_size,
                context_length: c.context_length,
                weight_bytes,
                bos_id: c.bos_id,
                eos_ids: c.eos_ids.clone(),
            },
            context_length: session.context(),
            context_reason: session.context_choice().reason.clone(),
            tool_format: session.tool_format().name(),
            kv_cache: session.forward().kv_kinds().to_string(),
            kv_bytes_per_token: session.forward().memory().kv_bytes_per_token,
            max_batch: session.batch_limit(usize::MAX),
            kv_cache_plan: session.cache_decision().cloned(),
            decode_plan: match session.gpu() {
                Some(gpu) => gpu.options().decode_plan.describe(session.context() as u32),
                None => "whole (every key in one pass per head)".into(),
            },
            precision: session.forward().precision_name().to_string(),
            precision_notice: match session.gpu() {
                Some(gpu) => gpu.precision_notice().map(String::from),
                None => session
                    .forward()
                    .cpu_precision()
                    .and_then(|p| p.notice())
                    .map(String::from),
            },
            has_chat_template: session.has_chat_template(),
            loaded_from_cache: source.loaded_from_cache,
            stored_in_cache: source.stored_in_cache,
            storage: source.storage,
            bytes_downloaded: source.bytes_downloaded,
            persisted: source.persisted,
            storage_notice: source.storage_notice,
            weights_read_by_range: source.read_by_range,
            kernel_plan: session.forward().plan().cloned(),
            runs_on: session.forward().kind().name(),
            threads: match session.gpu() {
                Some(_) => 0,
                None => crate::backend::cpu::threads(),
            },
            cpu_instructions: crate::backend::cpu::dot::instruction_set(),
            threads_notice: match session.gpu() {
                Some(_) => None,
                None => crate::backend::cpu::threads_notice().map(String::from),
            },
            backend_notice: None,
            backend_choice: None,
            draft: session.draft().map(|(name, _)| name.to_string()),
            presets: Preset::ALL.into_iter().map(PresetInfo::of).collect(),
        }
    }

    /// With the reason the model runs where it runs (when that was not asked for) and
    /// `auto`'s measured choice on a software adapter.
    pub fn with_backend(
        mut self,
        notice: Option<&str>,
        choice: Option<&crate::engine::BackendChoice>,
    ) -> Self {
        self.backend_notice = notice.map(String::from);
        self.backend_choice = choice.map(|c| BackendChoiceInfo {
            backend: match c.backend {
                crate::engine::Chosen::Gpu => "gpu",
                crate::engine::Chosen::Cpu => "cpu",
            },
            adapter: c.adapter.clone(),
            gpu_ms: c.gpu_ms,
            cpu_ms: c.cpu_ms,
            threads: c.threads,
            measured_now: c.measured_now,
            stored_at: c.stored_at.clone(),
        });
        self
    }

    /// The same description for a session rebuilt on a new device.
    pub fn rebuilt(&self, session: &Session) -> Self {
        let mut info = Self::new(
            session,
            &self.model.name,
            self.model.weight_bytes,
            SourceNote {
                loaded_from_cache: self.loaded_from_cache,
                stored_in_cache: self.stored_in_cache,
                storage: self.storage.clone(),
                bytes_downloaded: self.bytes_downloaded,
                persisted: self.persisted,
                storage_notice: self.storage_notice.clone(),
                read_by_range: self.weights_read_by_range,
            },
        );
        info.backend_notice = self.backend_notice.clone();
        info.backend_choice = self.backend_choice.clone();
        info
    }
}

/// A sampling preset and what it sets (top-p 1: off).
#[derive(Serialize, Tsify, Clone)]
#[serde(rename_all = "camelCase")]
struct PresetInfo {
    /// The name `preset` takes.
    #[tsify(type = "'conservative' | 'balanced' | 'creative'")]
    name: &'static str,
    temperature: f64,
    top_k: usize,
    top_p: f64,
}

/// `x` as the f64 its shortest decimal form names (0.3, not 0.30000001192092896).
fn as_written(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(f64::from(x))
}

impl PresetInfo {
    fn of(preset: Preset) -> Self {
        let (temperature, top_k, top_p) = preset.values();
        Self {
            name: preset.name(),
            temperature: as_written(temperature),
            top_k,
            top_p: as_written(top_p),
        }
    }
}

/// What `backend: 'auto'` decided on a software adapter (SwiftShader): where the model runs and
/// the decode step timings it compared.
#[derive(Serialize, Tsify, Clone)]
#[serde(rename_all = "camelCase")]
struct BackendChoiceInfo {
    /// Where the model runs: `gpu` (the software adapter) or `cpu` (WebAssembly).
    #[tsify(type = "'gpu' | 'cpu'")]
    backend: &'static str,
    /// The software adapter's name.
    adapter: String,
    /// Milliseconds per decode step on the adapter.
    gpu_ms: f64,
    /// Milliseconds per decode step on the CPU backend.
    cpu_ms: f64,
    /// The CPU backend's threads.
    threads: usize,
    /// Timed during this load (`false`: read from the Cache API, timed on an earlier load).
    measured_now: bool,
    /// Where the choice is kept (`null`: it could not be stored).
    stored_at: Option<String>,
}

/// GPU memory the model holds, in bytes.
#[derive(Serialize, Tsify)]
#[serde(rename_all = "camelCase")]
struct EngineMemory {
    weights: u64,
    kv_cache: u64,
    /// How K and V are cached (`q8_0`, or `k q8_0 / v f16`).
    kv_kinds: String,
    /// Bytes of K and V one more position of context costs (see `EngineInfo`).
    kv_bytes_per_token: u64,
    activations: u64,
    /// Batched decoding's per-sequence selections (its KV slots count in `kvCache`).
    batch: u64,
    total: u64,
}

/// The engine's GPU work counters, totals since the device was created (they restart after
/// device loss): subtract two snapshots to get what one call did. `engine.counters()`.
#[derive(Serialize, Tsify)]
#[serde(rename_all = "camelCase")]
pub(crate) struct EngineCounters {
    /// Compute dispatches recorded.
    dispatches: u64,
    /// Compute passes begun.
    compute_passes: u64,
    /// Command buffers submitted.
    command_buffers: u64,
    /// `queue.submit` calls.
    submits: u64,
    /// Waits for a mapped buffer (GPU to CPU syncs).
    readback_waits: u64,
    /// Bytes copied from the GPU to the CPU.
    readback_bytes: u64,
    /// Buffers created, and their bytes.
    buffers_created: u64,
    buffer_bytes_created: u64,
    /// Buffers held now, and their bytes.
    buffers_alive: i64,
    buffer_bytes_alive: i64,
    bind_groups_created: u64,
    /// Compute pipelines built (kernel cache misses).
    pipelines_created: u64,
    /// Model weight bytes bound by the dispatches recorded.
    weight_bytes_bound: u64,
    /// Forward steps (one prefill chunk or one decode token each), and the tokens they ran.
    forward_steps: u64,
    forward_tokens: u64,
    /// GPU memory the model holds, in bytes.
    memory: EngineMemory,
    /// Graph nodes (dispatches) of one forward step.
    nodes: usize,
    /// Prompt tokens per prefill step.
    prefill_chunk: usize,
}

impl EngineCounters {
    /// The session's counters now, with its memory and graph size.
    pub fn new(session: &Session) -> Self {
        let c: Counters = session.gpu().map(|g| g.counters()).unwrap_or_default();
        let m = session.forward().memory();
        Self {
            dispatches: c.dispatches,
            compute_passes: c.compute_passes,
            command_buffers: c.command_buffers,
            submits: c.submits,
            readback_waits: c.readback_waits,
            readback_bytes: c.readback_bytes,
            buffers_created: c.buffers_created,
            buffer_bytes_created: c.buffer_bytes_created,
            buffers_alive: c.buffers_alive,
            buffer_bytes_alive: c.buffer_bytes_alive,
            bind_groups_created: c.bind_groups_created,
            pipelines_created: c.pipelines_created,
            weight_bytes_bound: c.weight_bytes_bound,
            forward_steps: c.forward_steps,
            forward_tokens: c.forward_tokens,
            memory: EngineMemory {
                weights: m.weights,
                kv_cache: m.kv_cache,
                kv_kinds: session.forward().kv_kinds().to_string(),
                kv_bytes_per_token: m.kv_bytes_per_token,
                activations: m.activations,
                batch: m.batch,
                total: m.total(),
            },
            nodes: session.forward().node_count(),
            prefill_chunk: session.forward().chunk(),
        }
    }
}

/// What `engine.info()` reports as the adapter of the CPU backend.
fn cpu_adapter_report() -> crate::backend::gpu::AdapterReport {
    crate::backend::gpu::AdapterReport {
        name: "CPU (WebAssembly)".into(),
        backend: "cpu".into(),
        device_type: "Cpu".into(),
        ..crate::backend::gpu::AdapterReport::default()
    }
}
