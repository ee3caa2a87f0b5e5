//! How long a context a load takes where the caller gives none, and whether a model described
//! by its header alone (shapes and types, no bytes) can load at all: what a load from a URL
//! asks before downloading, and what the loads below use for their choice.

use crate::backend::cpu::check_address_space;
use crate::backend::gpu::{GpuContext, GpuModel};
use crate::backend::step::check_context;
use crate::config::{auto_context, default_context, ContextChoice, ModelConfig};
use crate::dtype::kv::KvKinds;
use crate::error::Result;
use crate::model::weights::ModelWeights;

use super::Session;

/// The context a GPU load takes: `context` where asked for, else the model's (at most 4096)
/// within what one layer's K or V buffer may hold on `ctx` ([`auto_context`]).
pub(super) fn gpu_context(
    ctx: &GpuContext,
    config: &ModelConfig,
    context: Option<usize>,
) -> ContextChoice {
    match context {
        Some(n) => ContextChoice {
            context: n,
            reason: "asked for".into(),
        },
        None => {
            let limits = ctx.limits();
            let (kinds, kv_dim) = (ctx.options().kv_cache, config.kv_dim());
            auto_context(
                config,
                kinds.k.row_bytes(kv_dim).max(kinds.v.row_bytes(kv_dim)),
                limits.max_storage_buffer_binding_size,
                limits.max_buffer_size,
            )
        }
    }
}

/// The context a CPU load with a KV cache in `kinds` takes: `context` where asked for, else the
/// model's (at most 4096), in WebAssembly at most what fits the address space beside the model
/// ([`crate::backend::cpu::context_for`]).
pub(super) fn cpu_context(
    weights: &ModelWeights<'_>,
    context: Option<usize>,
    kinds: KvKinds,
) -> ContextChoice {
    match context {
        Some(n) => ContextChoice {
            context: n,
            reason: "asked for".into(),
        },
        None => crate::backend::cpu::context_for(
            weights,
            default_context(&weights.config),
            cfg!(target_arch = "wasm32").then_some(crate::model::file_bytes::WASM32_ADDRESS_SPACE),
            kinds,
        ),
    }
}

impl Session {
    /// Refuses, with the numbers, a model described by `layout` (shapes and types, no bytes)
    /// that [`Session::new`] could not load on `ctx` with `context` (the same choice of the
    /// context where none is given): what a load from a URL asks before downloading.
    pub fn check_gpu_fit(
        ctx: &GpuContext,
        layout: &ModelWeights<'_>,
        context: Option<usize>,
    ) -> Result<ContextChoice> {
        let choice = gpu_context(ctx, &layout.config, context);
        GpuModel::check_fits(ctx, layout, choice.context)?;
        Ok(choice)
    }

    /// Refuses, with the numbers, a model described by `layout` that [`Session::new_cpu_in`]
    /// could not hold with `context` and a KV cache in `kinds` (the context chosen as it
    /// chooses where none is given): a context
    /// outside the model's, or (in WebAssembly) the files, the weights and the KV cache past
    /// the 4 GiB address space. A lower bound of what the load needs (the matrices it makes
    /// on load are known only then), asked before downloading.
    pub fn check_cpu_fit(
        layout: &ModelWeights<'_>,
        context: Option<usize>,
        kinds: KvKinds,
    ) -> Result<ContextChoice> {
        let choice = cpu_context(layout, context, kinds);
        check_context(&layout.config, choice.context)?;
        check_address_space(layout, choice.context, kinds)?;
        Ok(choice)
    }
}
