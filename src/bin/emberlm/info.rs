//! `emberlm info`: describe a model without running it (a GPU only for `--kv-cache auto`).
//! With `--device cpu` the memory is the CPU backend's, and the GPU's bindings, selection
//! buffers and decode plan are left out.

use std::path::PathBuf;

use emberlm::backend::gpu::tensor::rows_per_part;
use emberlm::backend::gpu::DeviceChoice;
use emberlm::config::default_context;
use emberlm::dtype::kv::KvKinds;
use emberlm::loader::ModelFiles;
use emberlm::model::weights::ModelWeights;
use emberlm::session::Session;
use emberlm::GpuContext;

use crate::cli::{cache_plan, gpu_options, kv_kinds, model_path};
use crate::{CliResult, Failure};

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// `emberlm info`: the model's configuration, tensors per type, weight bytes, and the memory
/// estimate of the backend `--device` names (the GPU's, with tensors split across bindings,
/// unless it is `cpu`).
pub fn info(
    model: Option<PathBuf>,
    context: Option<usize>,
    batch: usize,
    json: bool,
) -> CliResult<()> {
    let context = crate::cli::context(context);
    if context == Some(0) {
        return Err(Failure::usage("--ctx must be at least 1"));
    }
    if batch == 0 {
        return Err(Failure::usage("--batch must be at least 1"));
    }
    let path = model_path(model)?;
    let files = ModelFiles::open(&path)?;
    let weights = files.weights()?;
    let c = &weights.config;
    let context = context.unwrap_or_else(|| default_context(c));
    let plan = match cache_plan() {
        Some(options) => {
            let ctx = pollster::block_on(GpuContext::new(gpu_options()))?;
            let mut session = pollster::block_on(Session::new(ctx, &files, Some(context)))?;
            Some(pollster::block_on(session.plan_kv_cache(&options))?)
        }
        None => None,
    };
    let kinds = match &plan {
        Some(d) => KvKinds::from_options(Some(&d.kind), None, None)?,
        None => kv_kinds(),
    };
    let mut memory = weights.memory_estimate_batch(context, kinds, batch);
    // sequences whose KV slots fit in one binding of WebGPU's default limit
    let slot_layer = (context as u64).saturating_mul(
        kinds
            .k
            .row_bytes(c.kv_dim())
            .max(kinds.v.row_bytes(c.kv_dim())),
    );
    let batch_fits =
        (WEBGPU_DEFAULT_BINDING / slot_layer.max(1)).min(emberlm::backend::gpu::STEP_ROWS as u64);
    let decode_plan = gpu_options().decode_plan;
    let on_cpu = gpu_options().device == DeviceChoice::Cpu;
    if on_cpu {
        // the batch's selection buffers are the GPU's
        memory.total = memory.total.saturating_sub(memory.batch_select);
        memory.batch_select = 0;
    }
    let tally = weights.tally();
    let (largest, splits) = binding_splits(&weights, WEBGPU_DEFAULT_BINDING);
    let tokenizer = files.tokenizer()?;
    let template = files.chat_template(&tokenizer)?;
    let has_template = template.is_some();
    let tool_format = template
        .as_ref()
        .map_or(emberlm::chat::ToolFormat::GENERIC, |t| t.tool_format())
        .name();
    if json {
        let types: serde_json::Map<String, serde_json::Value> = tally
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    serde_json::json!({ "tensors": v.tensors, "bytes": v.bytes }),
                )
            })
            .collect();
        let out = serde_json::json!({
            "model": files.name(),
            "files": files.file_count(),
            "config": c,
            "tensors": weights.tensors.len(),
            "types": types,
            "weight_bytes": weights.weight_bytes(),
            "backend": if on_cpu { "cpu" } else { "gpu" },
            "memory": memory,
            "batch_fits_default_binding": (!on_cpu).then_some(batch_fits),
            "tokenizer": {
                "vocab_size": tokenizer.vocab_size(),
                "bos_id": tokenizer.bos_id(),
                "eos_ids": tokenizer.eos_ids(),
                "add_bos": tokenizer.add_bos_default(),
            },
            "chat_template": has_template,
            "tool_format": tool_format,
            // the GPU's: a CPU backend has no bindings and no decode plan
            "bindings": (!on_cpu).then(|| serde_json::json!({
                "limit": WEBGPU_DEFAULT_BINDING,
                "largest_tensor_bytes": largest,
                "split": splits.iter().map(|s| serde_json::json!({
                    "tensor": s.name,
                    "bytes": s.bytes,
                    "parts": s.parts,
                    "rows_per_part": s.rows_per_part,
                })).collect::<Vec<_>>(),
            })),
            "kv_cache_plan": plan,
            "decode_plan": (!on_cpu).then(|| serde_json::json!({
                "settings": decode_plan,
                "at_context": decode_plan.describe(memory.context as u32),
            })),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!("model:        {}", files.name());
    if files.file_count() > 1 {
        println!(
            "files:        {} (a split GGUF set, read in part order)",
            files.file_count()
        );
    }
    println!("architecture: {}", c.arch.name());
    println!(
        "dimensions:   vocab {}, hidden {}, layers {}, heads {} (kv {}), head dim {}, ffn {}",
        c.vocab_size, c.hidden_size, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_size
    );
    println!("context:      {} (trained)", c.context_length);
    println!("norm:         {:?}, eps {:e}", c.norm, c.norm_eps);
    println!(
        "rope:         {:?}, theta {}, scaling {}",
        c.rope_layout,
        c.rope_theta,
        c.rope_scaling.describe()
    );
    let head = match (c.bidirectional, c.tied_embeddings) {
        (true, _) => format!(
            "none: an encoder (bidirectional attention) that embeds text and does not generate; \
             pooling {}",
            c.pooling.map_or("mean (the default)", |p| p.name())
        ),
        (false, true) => "tied to the embedding".into(),
        (false, false) => "separate".into(),
    };
    println!(
        "lm head:      {head}{}",
        if c.qkv_bias { "; q/k/v biases" } else { "" }
    );
    println!("bos / eos:    {:?} / {:?}", c.bos_id, c.eos_ids);
    println!(
        "tokenizer:    {} tokens, bos {:?} (added: {}), eos {:?}; chat template: {}; tools: {tool_format}",
        tokenizer.vocab_size(),
        tokenizer.bos_id(),
        tokenizer.add_bos_default(),
        tokenizer.eos_ids(),
        if has_template {
            "yes"
        } else {
            "none (plain fallback)"
        }
    );
    if let Some(l) = &c.local_attention {
        let local = (0..c.n_layers).filter(|&i| l.is_local(i)).count();
        let ring = l.window + emberlm::model::weights::PREFILL_CHUNK - 1;
        println!(
            "attention:    local window {} on {local} of {} layers (every {}th global), local rope theta {}; their KV cache is a ring of {ring} rows where the context is longer",
            l.window, c.n_layers, l.pattern, l.rope_theta
        );
    }
    println!("tensors:      {}", weights.tensors.len());
    for (ty, t) in &tally {
        println!("  {ty:<6} {:>4} tensors  {}", t.tensors, mib(t.bytes));
    }
    if !on_cpu {
        println!(
            "bindings:     largest tensor {}; over WebGPU's default binding of {} (split by rows): {}",
            mib(largest),
            mib(WEBGPU_DEFAULT_BINDING),
            if splits.is_empty() {
                "none".to_string()
            } else {
                splits
                    .iter()
                    .map(|s| {
                        format!(
                            "{} ({}) in {} parts of up to {} rows",
                            s.name,
                            mib(s.bytes),
                            s.parts,
                            s.rows_per_part
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
    }
    println!(
        "weights:      {} ({} bytes)",
        mib(memory.weights),
        memory.weights
    );
    let per = match memory.batch {
        1 => String::new(),
        n => format!(" for {n} sequences decoded together"),
    };
    if on_cpu {
        // weights stay in their stored format (mapped from the file natively); activations
        // are allocated per step
        println!(
            "CPU memory at context {}{per}: {} = weights {} + KV cache {} + per-step scratch {}",
            memory.context,
            mib(memory.total),
            mib(memory.weights),
            mib(memory.kv_cache),
            mib(memory.activations),
        );
        println!(
            "batching:     each sequence decoded together adds {} of KV cache",
            mib(memory.kv_cache / memory.batch.max(1) as u64),
        );
    } else {
        println!(
            "GPU memory at context {}{per}: {} = weights {} + KV cache {} + activations {}{}",
            memory.context,
            mib(memory.total),
            mib(memory.weights),
            mib(memory.kv_cache),
            mib(memory.activations),
            match memory.batch_select {
                0 => String::new(),
                b => format!(" + batch selections {}", mib(b)),
            }
        );
        println!(
            "batching:     each sequence decoded together adds {} of KV cache; up to {batch_fits} of them fit one layer's {} binding",
            mib(memory.kv_cache / memory.batch.max(1) as u64),
            mib(WEBGPU_DEFAULT_BINDING)
        );
    }
    // local layers keep rings that do not grow with the context
    let layout = emberlm::config::KvLayout::trained(
        c,
        memory.context.max(1),
        emberlm::model::weights::PREFILL_CHUNK,
    );
    let rings = match layout.full_layers() {
        n if n == c.n_layers => String::new(),
        n => format!(
            " in the {n} layers that keep every position; the other {} keep rings",
            c.n_layers - n
        ),
    };
    println!(
        "KV cache:     {}, {} bytes per token ({}){rings}",
        memory.kv_kinds,
        memory.kv_bytes_per_token,
        crate::kv_args::per_kind_bytes(layout.full_layers(), c.kv_dim()),
    );
    if !on_cpu {
        println!(
            "decode plan:  {}",
            decode_plan.describe(memory.context as u32)
        );
    }
    if let Some(d) = &plan {
        print!("{}", crate::kv_args::describe(d));
    }
    Ok(())
}

/// WebGPU's default `maxStorageBufferBindingSize` (lavapipe's too): tensors above it are
/// split by rows where the device grants no more.
const WEBGPU_DEFAULT_BINDING: u64 = 128 << 20;

/// A tensor split across bindings.
struct Split {
    name: String,
    bytes: u64,
    parts: u64,
    rows_per_part: u64,
}

/// The largest tensor's bytes, and the matrices larger than `limit` with their row parts.
fn binding_splits(weights: &ModelWeights<'_>, limit: u64) -> (u64, Vec<Split>) {
    let mut largest = 0;
    let mut splits = Vec::new();
    for (name, t) in &weights.tensors {
        let bytes = t.data.len() as u64;
        largest = largest.max(bytes);
        if let ([rows, _], true) = (t.shape.as_slice(), bytes > limit) {
            let rows = *rows as u64;
            let per = rows_per_part(bytes / rows.max(1), limit).max(1);
            splits.push(Split {
                name: name.clone(),
                bytes,
                parts: rows.div_ceil(per),
                rows_per_part: per,
            });
        }
    }
    (largest, splits)
}
