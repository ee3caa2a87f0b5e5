//! The camelCase views of the engine's results that are converted to JS objects (their
//! TypeScript declarations are in `typescript.rs`).

use serde::Serialize;

use crate::gpu::Counters;
use crate::session::{Generation, Sequence, Session, Stats};

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SequenceJs<'a> {
    text: &'a str,
    tokens: &'a [u32],
    finish_reason: &'static str,
    logprob: f64,
}

impl<'a> From<&'a Sequence> for SequenceJs<'a> {
    fn from(s: &'a Sequence) -> Self {
        Self {
            text: &s.text,
            tokens: &s.tokens,
            finish_reason: s.finish_reason.as_str(),
            logprob: s.logprob,
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatsJs {
    prompt_tokens: usize,
    cached_tokens: usize,
    generated_tokens: usize,
    prefill_ms: f64,
    decode_ms: f64,
    time_to_first_token_ms: f64,
    decode_tok_per_s: f64,
    candidate_steps: usize,
    full_row_steps: usize,
    select_fallbacks: usize,
}

impl From<&Stats> for StatsJs {
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
        }
    }
}

/// A generation as JavaScript sees it (`GenerationResult`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct GenerationJs<'a> {
    text: &'a str,
    tokens: &'a [u32],
    finish_reason: &'static str,
    sequences: Vec<SequenceJs<'a>>,
    seed: Option<u64>,
    warnings: &'a [String],
    stats: StatsJs,
    prompt_token_ids: &'a [u32],
}

impl<'a> From<&'a Generation> for GenerationJs<'a> {
    fn from(g: &'a Generation) -> Self {
        let first = g.sequences.first();
        Self {
            text: first.map_or("", |s| s.text.as_str()),
            tokens: first.map_or(&[], |s| s.tokens.as_slice()),
            finish_reason: first.map_or("abort", |s| s.finish_reason.as_str()),
            sequences: g.sequences.iter().map(SequenceJs::from).collect(),
            seed: g.seed,
            warnings: &g.warnings,
            stats: StatsJs::from(&g.stats),
            prompt_token_ids: &g.prompt_tokens,
        }
    }
}

#[derive(Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct LimitsJs {
    max_storage_buffer_binding_size: u64,
    max_buffer_size: u64,
    max_storage_buffers_per_shader_stage: u32,
    max_compute_workgroup_storage_size: u32,
    max_compute_invocations_per_workgroup: u32,
    max_compute_workgroups_per_dimension: u32,
}

#[derive(Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct ModelInfoJs {
    name: String,
    arch: &'static str,
    layers: usize,
    vocab: usize,
    hidden_size: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    ffn_size: usize,
    context_length: usize,
    weight_bytes: u64,
    bos_id: Option<u32>,
    eos_ids: Vec<u32>,
}

/// Where the model file came from, for [`EngineInfoJs`].
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SourceNote {
    /// Read from the Cache API.
    pub loaded_from_cache: bool,
    /// Stored in the Cache API by this load.
    pub stored_in_cache: bool,
}

/// What `engine.info()` returns (`EngineInfo`).
#[derive(Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct EngineInfoJs {
    adapter: String,
    backend: String,
    device_type: String,
    features: Vec<String>,
    adapter_features: Vec<String>,
    subgroups: bool,
    shader_f16: bool,
    limits: LimitsJs,
    model: ModelInfoJs,
    context_length: usize,
    has_chat_template: bool,
    loaded_from_cache: bool,
    stored_in_cache: bool,
    kernel_plan: crate::gpu::KernelPlan,
}

impl EngineInfoJs {
    /// Describes a loaded session; `name` is the model file's name, `weight_bytes` its weights.
    pub fn new(session: &Session, name: &str, weight_bytes: u64, source: SourceNote) -> Self {
        let r = session.gpu().report();
        let c = session.config();
        Self {
            adapter: r.name.clone(),
            backend: r.backend.clone(),
            device_type: r.device_type.clone(),
            features: r.device_features.clone(),
            adapter_features: r.adapter_features.clone(),
            subgroups: r.subgroups,
            shader_f16: r.shader_f16,
            limits: LimitsJs {
                max_storage_buffer_binding_size: r.limits.max_storage_buffer_binding_size,
                max_buffer_size: r.limits.max_buffer_size,
                max_storage_buffers_per_shader_stage: r.limits.max_storage_buffers_per_shader_stage,
                max_compute_workgroup_storage_size: r.limits.max_compute_workgroup_storage_size,
                max_compute_invocations_per_workgroup: r
                    .limits
                    .max_compute_invocations_per_workgroup,
                max_compute_workgroups_per_dimension: r.limits.max_compute_workgroups_per_dimension,
            },
            model: ModelInfoJs {
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
            has_chat_template: session.has_chat_template(),
            loaded_from_cache: source.loaded_from_cache,
            stored_in_cache: source.stored_in_cache,
            kernel_plan: session.forward().plan().clone(),
        }
    }

    /// The same description for a session rebuilt on a new device.
    pub fn rebuilt(&self, session: &Session) -> Self {
        Self::new(
            session,
            &self.model.name,
            self.model.weight_bytes,
            SourceNote {
                loaded_from_cache: self.loaded_from_cache,
                stored_in_cache: self.stored_in_cache,
            },
        )
    }
}

/// GPU memory of a session, for [`CountersJs`].
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MemoryJs {
    weights: u64,
    kv_cache: u64,
    activations: u64,
    total: u64,
}

/// What `engine.counters()` returns (`EngineCounters`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CountersJs {
    dispatches: u64,
    compute_passes: u64,
    command_buffers: u64,
    submits: u64,
    readback_waits: u64,
    readback_bytes: u64,
    buffers_created: u64,
    buffer_bytes_created: u64,
    buffers_alive: i64,
    buffer_bytes_alive: i64,
    bind_groups_created: u64,
    pipelines_created: u64,
    weight_bytes_bound: u64,
    forward_steps: u64,
    forward_tokens: u64,
    memory: MemoryJs,
    nodes: usize,
    prefill_chunk: usize,
}

impl CountersJs {
    /// The session's counters now, with its memory and graph size.
    pub fn new(session: &Session) -> Self {
        let c: Counters = session.gpu().counters();
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
            memory: MemoryJs {
                weights: m.weights,
                kv_cache: m.kv_cache,
                activations: m.activations,
                total: m.total(),
            },
            nodes: session.forward().node_count(),
            prefill_chunk: session.forward().chunk(),
        }
    }
}
