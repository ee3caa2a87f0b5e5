//! The rest of a load once the weights are on the GPU: the graph, the KV cache, the
//! activations, the kernel plan and the compiled steps, put together into a [`Forward`].

use std::collections::HashMap;

use crate::backend::gpu::buffer::LoadMemory;

use super::*;

impl Forward {
    /// The rest of a load once the weights are on the GPU: the graph, the KV cache, the
    /// activations, the kernel plan and the compiled steps. `weights` describes every tensor;
    /// `host` holds the bytes of those the host keeps (the final norm's).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn assemble(
        ctx: &GpuContext,
        cache: &KernelCache,
        weights: &ModelWeights<'_>,
        host: &ModelWeights<'_>,
        fusion: &fuse::FusionPlan,
        gpu: HashMap<String, GpuTensor>,
        memory: LoadMemory,
        context: usize,
        chunk: usize,
    ) -> Result<Self> {
        let config = weights.config.clone();
        let graph = arch::build(&config, &gpu, &weights.file)?;
        let final_norm = FinalNorm::of(&graph, &config, host)?;
        let layout = kv::layout(&config, &ctx.options().decode_plan, context, chunk)?;
        let scope = memory.allocating(ctx, format!("the KV cache of {context} positions"));
        let kv = KvCache::with_layout(ctx, &config, layout, ctx.options().kv_cache, 1)?;
        scope.done(ctx).await?;
        let c = chunk as u64;
        // an encoder has no LM head: no logits to hold, read back or select from
        let vocab = match graph.head {
            Some(_) => config.vocab_size as u64,
            None => 0,
        };
        let (d, q, kv_dim, ff) = (
            config.hidden_size as u64,
            config.q_dim() as u64,
            config.kv_dim() as u64,
            config.ffn_size as u64,
        );
        let (plan, key) = measure::model_plan(ctx, weights, chunk).await?;
        let positions = kv.context() as u32;
        let split_len = kv::split_scratch_len(ctx, &plan, &config, positions, chunk)?;
        let buf = |name: &str, elems: u64| ctx.storage_zeroed(name, f32_bytes(elems));
        // under precision f16 the inputs that only a product reads are stored as f16
        let f16 = ctx.precision() == MatmulPrecision::F16;
        let act_buf = |name: &str, elems: u64| match f16 {
            true => buf(name, elems.div_ceil(2)),
            false => buf(name, elems),
        };
        let (sep_qkv, sep_ffn) = (
            u64::from(fusion.any_separate_qkv()),
            u64::from(fusion.any_separate_gate_up()),
        );
        let scope = memory.allocating(ctx, format!("the activations of {chunk}-token steps"));
        let act = Activations {
            ids: buf("ids", c)?,
            x: buf("x", c * d)?,
            q: buf("q", c * (q + 2 * kv_dim))?,
            k: buf("k", (c * kv_dim * sep_qkv).max(1))?,
            v: buf("v", (c * kv_dim * sep_qkv).max(1))?,
            attn: act_buf("attn", c * q)?,
            attn_split: buf("attention split partials", split_len)?,
            gate: buf("gate", (c * ff * sep_ffn).max(1))?,
            up: buf("up", (c * ff * sep_ffn).max(1))?,
            hidden: act_buf("hidden", c * ff)?,
            logits: buf("logits", (c * vocab).max(1))?,
            branch: buf("branch", if graph.uses_branch() { c * d } else { 1 })?,
            f16,
        };
        let step = StepParams::create_buffer(ctx, "step params");
        // logits rows, or hidden rows (Readback::Hidden) should a model be wider than its vocabulary
        let staging = ctx.staging_buffer("logits readback", f32_bytes(c * vocab.max(d)));
        scope.done(ctx).await?;
        let weight_bytes: u64 = gpu.values().map(GpuTensor::buffer_bytes).sum();
        let act_buffers: Vec<&wgpu::Buffer> =
            act.all().into_iter().chain([&step, &staging]).collect();
        let activation_bytes: u64 = act_buffers.iter().map(|b| b.size()).sum();
        let alive = AliveBuffers::new(
            ctx.counter_cells(),
            gpu.values()
                .map(GpuTensor::buffer_bytes)
                .chain(act_buffers.iter().map(|b| b.size())),
        );
        let memory = MemoryReport {
            weights: weight_bytes,
            kv_cache: kv.bytes(),
            activations: activation_bytes,
            kv_bytes_per_token: kv
                .layout()
                .position_bytes(kv.kinds().row_bytes(config.kv_dim())),
            batch: 0,
        };
        // what compiling creates (parameter uniforms, the selection's buffers) is counted
        // below; the buffers above are already in `activation_bytes`
        let before = ctx.counters();
        let compiled = Compiler {
            ctx,
            cache,
            config: &config,
            chunk,
            kv: &kv,
            step: &step,
            act: &act,
            w: &gpu,
            plan: &plan,
        }
        .compile(&graph)
        .await?;
        let select = match vocab {
            0 => None,
            _ => match Select::new(ctx, cache, &act.logits, vocab as u32).await {
                Ok(select) => Some(select),
                // Decode steps then read the whole row.
                Err(Error::Limit { .. }) => None,
                Err(e) => return Err(e),
            },
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
            nodes: compiled.nodes,
            head_last: compiled.head_last,
            head_all: compiled.head_all,
            select,
            select_staging,
            plan,
            graph,
            final_norm,
            batch: batch::BatchBuffers::default(),
        };
        forward.finish_plan(ctx, &key).await?;
        Ok(forward)
    }
}
