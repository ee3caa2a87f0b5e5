//! The forward pass's KV cache beyond one step: replacing the cache with one of another kind or length ([`Forward::set_kv`]),
//! which the automatic cache plan uses to measure each kind on the loaded model.

use super::compile::{attention_keys, heads_of, Compiler};
use super::upload::f32_bytes;
use super::Forward;
use crate::backend::gpu::variants::attention::any_variant_key_limit;
use crate::backend::gpu::KernelPlan;
use crate::backend::gpu::{DecodePlan, GpuContext, KernelCache, KvCache};
use crate::config::{KvLayout, ModelConfig};
use crate::dtype::kv::KvKinds;
use crate::error::Result;

/// The cache layout of `config` at `context` positions for steps of up to `chunk` tokens: a
/// ring for every layer that reads a local window (the trained one, or the decode plan's
/// fixed window).
pub(super) fn layout(
    config: &ModelConfig,
    decode: &DecodePlan,
    context: usize,
    chunk: usize,
) -> Result<KvLayout> {
    let model = format!("this {} model", config.arch.name());
    let windows = (0..config.n_layers)
        .map(|l| {
            decode.window(
                config.layer_window(l),
                config.local_attention.is_some(),
                &model,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(KvLayout::new(&windows, context, chunk))
}

impl Forward {
    /// Moves the fill mark to `pos` (at most the context) without computing the positions the
    /// cache does not hold yet: their rows keep what they held (zeros after allocation). For
    /// timing a step at a given cache position only (the bench); what such a step computes
    /// means nothing.
    pub fn assume_cached(&mut self, pos: usize) -> Result<()> {
        self.kv.set_pos(pos)
    }

    /// Replaces the KV cache with one of `context` positions stored in `kinds` and rebinds the
    /// graph to it; the weights stay where they are and the cached positions are forgotten.
    /// The old cache is freed before the new one is allocated.
    /// Pipelines come from `cache` (pass the one the model was loaded with: only the kernels
    /// that depend on the kinds are built again).
    /// Batched decoding's extra slots are given up ([`Forward::set_batch`] makes them again).
    pub async fn set_kv(
        &mut self,
        ctx: &GpuContext,
        cache: &KernelCache,
        kinds: KvKinds,
        context: usize,
    ) -> Result<()> {
        self.rebuild_kv(ctx, cache, kinds, context, 1).await
    }

    /// [`Forward::set_kv`] with `slots` sequences of `context` positions side by side.
    pub(super) async fn rebuild_kv(
        &mut self,
        ctx: &GpuContext,
        cache: &KernelCache,
        kinds: KvKinds,
        context: usize,
        slots: usize,
    ) -> Result<()> {
        let config = self.config.clone();
        crate::backend::step::check_context(&config, context)?;
        let kv_dim = config.kv_dim();
        let layout = layout(&config, &ctx.options().decode_plan, context, self.chunk)?;
        let row = kinds.k.row_bytes(kv_dim).max(kinds.v.row_bytes(kv_dim));
        let what = match slots {
            1 => "KV cache layer (context × kv_dim)".to_string(),
            n => format!("KV cache layer ({n} sequences × context × kv_dim)"),
        };
        ctx.check_storage_size(
            &what,
            (context as u64)
                .saturating_mul(slots as u64)
                .saturating_mul(row),
        )?;
        self.batch.clear();
        // free the old cache first: a placeholder of one position holds its place
        self.kv = KvCache::with_kinds(ctx, &config, 1, kinds)?;
        self.kv = KvCache::with_layout(ctx, &config, layout, kinds, slots)?;
        let split_len = split_scratch_len(ctx, &self.plan, &config, context as u32, self.chunk)?;
        if f32_bytes(split_len) > self.act.attn_split.size() {
            self.act.attn_split =
                ctx.storage_zeroed("attention split partials", f32_bytes(split_len))?;
        }
        let compiled = Compiler {
            ctx,
            cache,
            config: &config,
            chunk: self.chunk,
            kv: &self.kv,
            step: &self.step,
            act: &self.act,
            w: &self._weights,
            plan: &self.plan,
        }
        .compile(&self.graph)
        .await?;
        self.nodes = compiled.nodes;
        self.head_last = compiled.head_last;
        self.head_all = compiled.head_all;
        self.memory.kv_cache = self.kv.bytes();
        self.memory.batch = 0;
        self.memory.kv_bytes_per_token = self.kv.layout().position_bytes(kinds.row_bytes(kv_dim));
        Ok(())
    }
}

/// f32 values of the split-attention scratch (at least 1) for a cache of `positions` rows and
/// steps of up to `chunk` tokens, whichever attention variant runs: every layer's binding
/// shares it.
pub(super) fn split_scratch_len(
    ctx: &GpuContext,
    plan: &KernelPlan,
    config: &ModelConfig,
    positions: u32,
    chunk: usize,
) -> Result<u64> {
    let keys = attention_keys(plan, &ctx.options().decode_plan, config, positions, None)?;
    Ok(keys
        .limited(any_variant_key_limit(config.head_dim as u32), chunk as u32)
        .scratch_len(heads_of(config), positions)
        .max(1))
}
