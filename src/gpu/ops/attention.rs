//! Causal grouped-query attention over the KV cache (`shaders/attention.wgsl`), for decode
//! (one token) and prefill chunks (after earlier chunks) alike.
//!
//! Two shapes ([`Variant`]): the workgroup shape (`attention.wgsl`) runs one workgroup per
//! (query head, token); the rows shape (`attention_rows.wgsl`) one invocation per (query head,
//! token), with no barriers, for CPU-like adapters. Both in one dispatch. Splitting long contexts over
//! several workgroups (flash-decoding) would need a second dispatch to merge the splits, and
//! in the browser a dispatch costs about as much as a whole layer's attention at a few
//! thousand positions; the keys are instead walked in tiles with an online softmax, so the
//! kernel's shared memory is fixed whatever the context length.

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::{
    check_distinct, check_len, check_max_tokens, check_step, dispatch_grid, elements, load,
    positive, reduce_defines, wg_size, Grid, Heads, KernelBinding, Reduction, MAX_HEAD_DIM,
};
use crate::error::{Error, Result};
use crate::gpu::device::GpuContext;
use crate::gpu::kernels::{self, Defines, KernelCache};
use crate::gpu::plan::Variant;

/// Heads per workgroup of the rows shape: one subgroup on lavapipe, one on SwiftShader (4
/// lanes); small models have few heads, so a bigger group would leave most invocations idle.
const ROWS_WG: u32 = 4;

/// Largest head the rows shape is built for: its per-head loops must stay short enough for
/// shader compilers to unroll them (see `attention_rows.wgsl`).
pub const ROWS_MAX_HEAD_DIM: u32 = 128;

#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
struct AttentionParams {
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    q_stride: u32,
    max_positions: u32,
    scale: f32,
    _pad: [u32; 2],
}

/// `out[t, h] = softmax_j(q[t, h]·k_cache[j, g(h)] / sqrt(hd)) · v_cache[j, g(h)]` for the
/// step's tokens `t < n_tokens` at positions `p = pos0 + t`, over the cache rows `j ≤ p`, with
/// KV head `g(h) = h / (n_heads / n_kv_heads)`.
///
/// `q: [max_tokens, q_row_stride]` (query heads at columns `0..n_heads·hd`),
/// `k_cache, v_cache: [max_positions, n_kv_heads·hd]`, `out: [max_tokens, n_heads·hd]`.
/// The step's own keys must already be in the cache ([`super::RopeKvWrite`] earlier in the
/// same pass).
#[derive(Debug, Clone)]
pub struct Attention {
    /// Keys read as `vec4<f32>` (`head_dim % 4 == 0`).
    vec4: Arc<wgpu::ComputePipeline>,
    /// Keys read as `f32`.
    scalar: Arc<wgpu::ComputePipeline>,
    key_tile: u32,
    variant: Variant,
    /// The head size the rows shape was built for (`None`: any).
    head_dim: Option<u32>,
}

impl Attention {
    /// Builds (or fetches from `cache`) the kernel for the given reduction (used for the tile
    /// maxima and the softmax denominator), in its vec4 and scalar key forms.
    pub async fn new(ctx: &GpuContext, cache: &KernelCache, reduction: Reduction) -> Result<Self> {
        Self::with_variant(ctx, cache, reduction, Variant::Workgroup, MAX_HEAD_DIM).await
    }

    /// [`Attention::new`] in `variant`'s shape (`reduction` matters to the workgroup shape
    /// only). The rows shape is built for one `head_dim` (its loops over a head have a
    /// constant trip count; see `attention_rows.wgsl`) of at most [`ROWS_MAX_HEAD_DIM`]; the
    /// workgroup shape serves every head size.
    pub async fn with_variant(
        ctx: &GpuContext,
        cache: &KernelCache,
        reduction: Reduction,
        variant: Variant,
        head_dim: u32,
    ) -> Result<Self> {
        if variant == Variant::Rows {
            positive("head_dim", head_dim)?;
            if head_dim > ROWS_MAX_HEAD_DIM {
                return Err(Error::invalid(
                    "head_dim",
                    format!(
                        "the rows attention shape supports heads of at most {ROWS_MAX_HEAD_DIM}, got {head_dim}"
                    ),
                ));
            }
            let wg = ROWS_WG
                .min(ctx.limits().max_compute_workgroup_size_x)
                .max(1);
            let defines = Defines::new()
                .value("RWG_SIZE", format!("{wg}u"))
                .value("HEAD_QUADS", format!("{}u", head_dim.div_ceil(4)));
            let file = &kernels::ATTENTION_ROWS;
            let scalar = load(ctx, cache, file, "attention_rows", defines.clone()).await?;
            let vec4 = load(ctx, cache, file, "attention_rows", defines.flag("KV_VEC4")).await?;
            return Ok(Self {
                vec4,
                scalar,
                key_tile: wg,
                variant,
                head_dim: Some(head_dim),
            });
        }
        let key_tile = wg_size(ctx);
        let defines =
            reduce_defines(ctx, reduction)?.value("MAX_HEAD_DIM", format!("{MAX_HEAD_DIM}u"));
        let scalar = load(
            ctx,
            cache,
            &kernels::ATTENTION,
            "attention",
            defines.clone(),
        )
        .await?;
        let vec4 = load(
            ctx,
            cache,
            &kernels::ATTENTION,
            "attention",
            defines.flag("KV_VEC4"),
        )
        .await?;
        Ok(Self {
            vec4,
            scalar,
            key_tile,
            variant,
            head_dim: None,
        })
    }

    /// The shape this kernel runs in.
    pub fn variant(&self) -> Variant {
        self.variant
    }

    /// Keys per tile of the online softmax (the workgroup size; heads per workgroup in the
    /// rows shape).
    pub fn key_tile(&self) -> u32 {
        self.key_tile
    }

    /// Binds `q` (rows `q_row_stride` apart: `n_heads·hd` for a q buffer of its own,
    /// `(n_heads + 2·n_kv_heads)·hd` for a fused qkv buffer), one layer's caches of
    /// `max_positions` rows and `out` with the [`super::StepParams`] uniform `step`, for steps
    /// of at most `max_tokens` tokens. Checks the head geometry (`head_dim` ≤
    /// [`MAX_HEAD_DIM`] and the workgroup size), the buffers' sizes and that `out` is none of the inputs.
    #[allow(clippy::too_many_arguments)]
    pub fn bind(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        q: &wgpu::Buffer,
        q_row_stride: u32,
        k_cache: &wgpu::Buffer,
        v_cache: &wgpu::Buffer,
        out: &wgpu::Buffer,
        heads: Heads,
        max_positions: u32,
        max_tokens: u32,
    ) -> Result<KernelBinding> {
        check_step(step)?;
        check_max_tokens(ctx, max_tokens)?;
        positive("max_positions", max_positions)?;
        // an invocation owns one output dimension: head_dim ≤ the workgroup, which is 256 on
        // every device wgpu creates (even its downlevel limits), so in practice MAX_HEAD_DIM
        // (the rows shape has no such bound: an invocation owns a whole head)
        let max_hd = match self.variant {
            Variant::Workgroup => MAX_HEAD_DIM.min(self.key_tile),
            Variant::Rows => MAX_HEAD_DIM,
        };
        heads.check(max_hd)?;
        if let Some(hd) = self.head_dim.filter(|&hd| hd != heads.head_dim) {
            return Err(Error::invalid(
                "head_dim",
                format!(
                    "kernel built for heads of {hd}, bound with {}",
                    heads.head_dim
                ),
            ));
        }
        let q_dim = heads.q_dim();
        if u64::from(q_row_stride) < q_dim {
            return Err(Error::invalid(
                "q_row_stride",
                format!("must be at least n_heads·head_dim = {q_dim}, got {q_row_stride}"),
            ));
        }
        check_len(
            "q",
            q,
            elements("max_tokens", max_tokens, u64::from(q_row_stride))?,
        )?;
        let cache_len = elements("max_positions", max_positions, heads.kv_dim())?;
        check_len("k_cache", k_cache, cache_len)?;
        check_len("v_cache", v_cache, cache_len)?;
        check_len("out", out, elements("max_tokens", max_tokens, q_dim)?)?;
        for (name, other) in [("q", q), ("k_cache", k_cache), ("v_cache", v_cache)] {
            check_distinct("out", out, name, other)?;
        }
        let groups = match self.variant {
            Variant::Workgroup => heads.n_heads,
            Variant::Rows => heads.n_heads.div_ceil(self.key_tile),
        };
        let (x, y) = dispatch_grid(ctx, "attention", groups)?;
        if y != 1 {
            return Err(Error::invalid(
                "n_heads",
                format!("{} heads exceed one dispatch row", heads.n_heads),
            ));
        }
        let params = AttentionParams {
            n_heads: heads.n_heads,
            n_kv_heads: heads.n_kv_heads,
            head_dim: heads.head_dim,
            q_stride: q_row_stride,
            max_positions,
            scale: (1.0 / f64::from(heads.head_dim).sqrt()) as f32,
            _pad: [0; 2],
        };
        let pipeline = if heads.head_dim.is_multiple_of(4) {
            &self.vec4
        } else {
            &self.scalar
        };
        Ok(KernelBinding::new(
            ctx,
            pipeline,
            "attention",
            &params,
            Some(step),
            &[q, k_cache, v_cache, out],
            Grid::PerToken(x),
        ))
    }
}
