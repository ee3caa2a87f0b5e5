//! Grouped-query attention over the KV cache (`shaders/attention.wgsl`), causal or (an
//! encoder's, [`AttentionKeys::bidirectional`]) over the whole text, for decode
//! (one token) and prefill chunks (after earlier chunks) alike.
//!
//! Its variants are declared as data in [`crate::backend::gpu::variants::attention`] (`workgroup`: one workgroup per (query
//! head, token); `rows`: one invocation per (query head, token), no barriers, for CPU-like
//! adapters), each a define of the one shader. Keys are walked with an online softmax, so
//! memory is fixed whatever the context length.
//!
//! A step of few tokens over a long context has too few heads to fill a device (SmolLM2
//! decodes with 9 query heads: 9 workgroups on a GPU of a hundred cores). Such steps split the
//! keys (flash-decoding, [`KeySplit`]): each (head, token, split of `keys_per_split` keys)
//! writes an unnormalised partial, and `attention_merge.wgsl` combines the splits in a second
//! dispatch. Short contexts run whole in one dispatch, since in the browser a dispatch costs
//! about as much as a layer's attention over a few hundred keys.

use crate::backend::gpu::host_struct::host_struct;
use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::{
    check_distinct, check_f16_activations, check_len, check_max_tokens, check_step, dispatch_grid,
    elements, load, positive, pow2_invocations, reduce_defines, Grid, Heads, KernelBinding,
    Reduction, StepParams, MAX_HEAD_DIM,
};
use crate::backend::gpu::device::GpuContext;
use crate::backend::gpu::kernels::{self, Defines, KernelCache};
pub use crate::backend::gpu::key_split::{
    AttentionKeys, KeySplit, SHADER_LOOP_BUDGET, SPLIT_MAX_SPLITS, SPLIT_MAX_TOKENS,
    SPLIT_MIN_KEYS, SPLIT_MIN_KEYS_PER_SPLIT,
};
use crate::backend::gpu::variants::Variant;
use crate::dtype::kv::KvKinds;
use crate::error::{Error, Result};

pub use crate::backend::gpu::variants::attention::{
    any_variant_key_limit, AttentionVariant, HeadsOf,
};

host_struct! {
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Pod, Zeroable)]
    pub(crate) struct AttentionParams {
        n_heads: u32,
        n_kv_heads: u32,
        head_dim: u32,
        q_stride: u32,
        max_positions: u32,
        scale: f32,
        keys_per_split: u32,
        max_splits: u32,
        window: u32,
        ring: u32,
        bidirectional: u32,
        _pad: u32,
    }
}

/// Invocations per workgroup of the merge (one per output value, no barriers).
const MERGE_WG: u32 = 64;

/// The pipelines of one shape: whole (one dispatch) and split (partials, then the merge), each
/// with keys read as vec4 or f32.
#[derive(Debug, Clone)]
struct Pipelines {
    vec4: Arc<wgpu::ComputePipeline>,
    scalar: Arc<wgpu::ComputePipeline>,
}

impl Pipelines {
    async fn load(
        ctx: &GpuContext,
        cache: &KernelCache,
        file: &kernels::ShaderFile,
        entry: &'static str,
        defines: Defines,
    ) -> Result<Self> {
        Ok(Self {
            scalar: load(ctx, cache, file, entry, defines.clone()).await?,
            vec4: load(ctx, cache, file, entry, defines.flag("KV_VEC4")).await?,
        })
    }

    fn pick(&self, head_dim: u32) -> &Arc<wgpu::ComputePipeline> {
        if head_dim.is_multiple_of(4) {
            &self.vec4
        } else {
            &self.scalar
        }
    }
}

/// `out[t, h] = softmax_j(q[t, h]·k_cache[j, g(h)] / sqrt(hd)) · v_cache[j, g(h)]` for the
/// step's tokens `t < n_tokens` at positions `p = pos0 + t`, over the cache rows `j ≤ p`, with
/// KV head `g(h) = h / (n_heads / n_kv_heads)`.
///
/// `q: [max_tokens, q_row_stride]` (query heads at columns `0..n_heads·hd`),
/// `k_cache, v_cache: [max_positions, n_kv_heads·hd]` (f32, or rows of their kind's words,
/// see [`Attention::with_kinds`]), `out: [max_tokens, n_heads·hd]`.
/// The step's own keys must already be in the cache ([`super::RopeKvWrite`] earlier in the
/// same pass).
#[derive(Debug, Clone)]
pub struct Attention {
    /// Every key of a token in one dispatch.
    whole: Pipelines,
    /// One split of a token's keys, writing partials.
    split: Pipelines,
    /// Combines the partials.
    merge: Arc<wgpu::ComputePipeline>,
    key_tile: u32,
    variant: &'static AttentionVariant,
    /// The head size a variant compiled per head size was built for (`None`: any).
    head_dim: Option<u32>,
    /// The kinds of the caches it reads.
    kinds: KvKinds,
    /// Whether `out` holds f16 (two values per word).
    out_f16: bool,
}

impl Attention {
    /// Builds (or fetches from `cache`) the kernel for the given reduction (used for the tile
    /// maxima and the softmax denominator), in its vec4 and scalar key forms.
    pub async fn new(ctx: &GpuContext, cache: &KernelCache, reduction: Reduction) -> Result<Self> {
        Self::with_variant(ctx, cache, reduction, Variant::WORKGROUP, MAX_HEAD_DIM).await
    }

    /// [`Attention::new`] in `variant`'s shape (`reduction` matters to shapes that reduce
    /// across their workgroup). A variant compiled per head size (the rows shape: its loops
    /// over a head have a constant trip count) is built for `head_dim`, which must be within
    /// its [`AttentionVariant::max_head_dim`]; the others serve every head size.
    pub async fn with_variant(
        ctx: &GpuContext,
        cache: &KernelCache,
        reduction: Reduction,
        variant: Variant,
        head_dim: u32,
    ) -> Result<Self> {
        Self::with_kinds(ctx, cache, reduction, variant, head_dim, KvKinds::default()).await
    }

    /// [`Attention::with_variant`] over caches stored in `kinds` (decoded as they are read).
    pub async fn with_kinds(
        ctx: &GpuContext,
        cache: &KernelCache,
        reduction: Reduction,
        variant: Variant,
        head_dim: u32,
        kinds: KvKinds,
    ) -> Result<Self> {
        Self::with_output(ctx, cache, reduction, variant, head_dim, kinds, false).await
    }

    /// [`Attention::with_kinds`] writing `out` as f16 (`out_f16`, two values per word, for
    /// an output projection that reads f16 under precision f16; needs
    /// [`MatmulPrecision::F16`]) or f32.
    pub async fn with_output(
        ctx: &GpuContext,
        cache: &KernelCache,
        reduction: Reduction,
        variant: Variant,
        head_dim: u32,
        kinds: KvKinds,
        out_f16: bool,
    ) -> Result<Self> {
        if out_f16 {
            check_f16_activations(ctx, "out_f16")?;
        }
        let kind_defines = |d: Defines| {
            let d = d.flag_if("OUT_F16", out_f16);
            if kinds.is_f32() {
                d
            } else {
                d.flag("KV_KINDS")
                    .value("K_KIND", format!("{}u", kinds.k.code()))
                    .value("V_KIND", format!("{}u", kinds.v.code()))
            }
        };
        let Some(spec) = AttentionVariant::find(variant) else {
            return Err(Error::invalid(
                "variant",
                format!("attention has no variant `{variant}`"),
            ));
        };
        if spec.per_head_dim {
            positive("head_dim", head_dim)?;
        }
        if spec.per_head_dim && !spec.applies(head_dim) {
            return Err(Error::invalid(
                "head_dim",
                format!(
                    "the {variant} attention shape supports heads of at most {}, got {head_dim}",
                    spec.max_head_dim
                ),
            ));
        }
        let key_tile = pow2_invocations(ctx, spec.invocations);
        let base = match spec.reduces {
            true => reduce_defines(ctx, reduction)?,
            false => Defines::new(),
        };
        let mut defines = kind_defines(base).value("WG_SIZE", format!("{key_tile}u"));
        defines = match spec.per_head_dim {
            true => defines.value("HEAD_QUADS", format!("{}u", head_dim.div_ceil(4))),
            false => defines.value("MAX_HEAD_DIM", format!("{MAX_HEAD_DIM}u")),
        };
        if let Some(flag) = spec.spec.define {
            defines = defines.flag(flag);
        }
        let file = &kernels::ATTENTION;
        Ok(Self {
            whole: Pipelines::load(ctx, cache, file, "attention", defines.clone()).await?,
            split: Pipelines::load(ctx, cache, file, "attention", defines.flag("SPLIT")).await?,
            merge: Self::merge(ctx, cache, out_f16).await?,
            key_tile,
            variant: spec,
            head_dim: spec.per_head_dim.then_some(head_dim),
            kinds,
            out_f16,
        })
    }

    async fn merge(
        ctx: &GpuContext,
        cache: &KernelCache,
        out_f16: bool,
    ) -> Result<Arc<wgpu::ComputePipeline>> {
        // 64 is below every device's maxComputeWorkgroupSizeX (WebGPU guarantees 256), so
        // the grid can be computed from the constant
        let defines = Defines::new()
            .value("MWG_SIZE", format!("{MERGE_WG}u"))
            .flag_if("OUT_F16", out_f16);
        load(
            ctx,
            cache,
            &kernels::ATTENTION_MERGE,
            "attention_merge",
            defines,
        )
        .await
    }

    /// Most keys one invocation walks for heads of `head_dim`; a binding splits longer steps
    /// (see [`SHADER_LOOP_BUDGET`]).
    pub fn key_limit(&self, head_dim: u32) -> u32 {
        (self.variant.key_limit)(head_dim, self.key_tile)
    }

    /// The shape this kernel runs in.
    pub fn variant(&self) -> Variant {
        self.variant.spec.variant
    }

    /// Keys per tile of the online softmax (the workgroup size; heads per workgroup in the
    /// rows shape).
    pub fn key_tile(&self) -> u32 {
        self.key_tile
    }

    /// Binds `q` (rows `q_row_stride` apart: `n_heads·hd` for a q buffer of its own,
    /// `(n_heads + 2·n_kv_heads)·hd` for a fused qkv buffer), one layer's caches of
    /// `max_positions` rows and `out` with the [`super::StepParams`] uniform `step`, for steps
    /// of at most `max_tokens` tokens; with `split` (and its scratch buffer), long steps of
    /// few tokens split their keys (see [`KeySplit`]). Checks the head geometry (`head_dim` ≤
    /// [`MAX_HEAD_DIM`] and the workgroup size), the buffers' sizes and that `out` is none of
    /// the inputs.
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
        split: Option<(KeySplit, &wgpu::Buffer)>,
    ) -> Result<AttentionBinding> {
        let keys = AttentionKeys::from(split.map(|s| s.0));
        self.bind_keys(
            ctx,
            step,
            (q, q_row_stride),
            (k_cache, v_cache),
            out,
            heads,
            (max_positions, max_tokens),
            &keys,
            split.map(|s| s.1),
        )
    }

    /// [`Attention::bind`] with the keys read as `keys` says: a local window, and split tiers
    /// (decode planning) sharing the `scratch` buffer of [`AttentionKeys::scratch_len`] f32
    /// (required when there are tiers). `q` is (buffer, row stride), `caches` (K, V), `sizes`
    /// (max_positions, max_tokens).
    #[allow(clippy::too_many_arguments)]
    pub fn bind_keys(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        (q, q_row_stride): (&wgpu::Buffer, u32),
        (k_cache, v_cache): (&wgpu::Buffer, &wgpu::Buffer),
        out: &wgpu::Buffer,
        heads: Heads,
        (max_positions, max_tokens): (u32, u32),
        keys: &AttentionKeys,
        scratch: Option<&wgpu::Buffer>,
    ) -> Result<AttentionBinding> {
        if keys.window == Some(0) {
            return Err(Error::invalid(
                "decode_local_window",
                "a local attention window must hold at least 1 key",
            ));
        }
        check_step(step)?;
        check_max_tokens(ctx, max_tokens)?;
        positive("max_positions", max_positions)?;
        let keys = &keys
            .clone()
            .limited(self.key_limit(heads.head_dim), max_tokens);
        // an invocation owns one output dimension: head_dim ≤ the workgroup, which is 256 on
        // every device wgpu creates (even its downlevel limits), so in practice MAX_HEAD_DIM
        // (the rows shape has no such bound: an invocation owns a whole head)
        let max_hd = match self.variant.heads_of {
            HeadsOf::Workgroup => self.variant.max_head_dim.min(self.key_tile),
            HeadsOf::Invocation => self.variant.max_head_dim,
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
        let kv_dim = heads.kv_dim() as usize;
        if let Some(ring) = keys.ring {
            // a ring must hold every key a token reads, and a layer that reads every key
            // cannot keep a ring
            if ring == 0 || keys.window.is_none_or(|w| w > ring) {
                return Err(Error::invalid(
                    "ring",
                    format!(
                        "a ring of {ring} rows cannot hold a window of {}",
                        keys.window
                            .map_or("every key".to_string(), |w| format!("{w} keys"))
                    ),
                ));
            }
        }
        let rows = keys.ring.unwrap_or(max_positions);
        for (name, buffer, kind) in [
            ("k_cache", k_cache, self.kinds.k),
            ("v_cache", v_cache, self.kinds.v),
        ] {
            let words = elements("cache rows", rows, kind.row_words(kv_dim) as u64)?;
            check_len(name, buffer, words)?;
        }
        let out_values = elements("max_tokens", max_tokens, q_dim)?;
        // an f16 output takes half a word per value
        check_len(
            "out",
            out,
            match self.out_f16 {
                true => out_values.div_ceil(2),
                false => out_values,
            },
        )?;
        for (name, other) in [("q", q), ("k_cache", k_cache), ("v_cache", v_cache)] {
            check_distinct("out", out, name, other)?;
        }
        let groups = match self.variant.heads_of {
            HeadsOf::Workgroup => heads.n_heads,
            HeadsOf::Invocation => heads.n_heads.div_ceil(self.key_tile),
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
            scale: (f64::from(keys.score_scale.unwrap_or(1.0)) / f64::from(heads.head_dim).sqrt())
                as f32,
            keys_per_split: 0,
            max_splits: 0,
            window: keys.window.unwrap_or(0),
            ring: keys.ring.unwrap_or(0),
            bidirectional: u32::from(keys.bidirectional),
            _pad: 0,
        };
        let label = "attention";
        let whole = KernelBinding::new(
            ctx,
            self.whole.pick(heads.head_dim),
            label,
            &params,
            Some(step),
            &[q, k_cache, v_cache, out],
            Grid::PerToken(x),
        );
        let bind_split = |split: KeySplit| -> Result<SplitBinding> {
            let Some(scratch) = scratch else {
                return Err(Error::invalid(
                    "attention split scratch",
                    "split attention needs its partials buffer",
                ));
            };
            positive("keys_per_split", split.keys_per_split)?;
            positive("split max_tokens", split.max_tokens)?;
            let max_splits = split.max_splits(max_positions);
            let limit = ctx.limits().max_compute_workgroups_per_dimension;
            if max_splits > limit {
                return Err(Error::Limit {
                    what: format!(
                        "attention splits of {} keys over {max_positions} positions",
                        split.keys_per_split
                    ),
                    limit: "maxComputeWorkgroupsPerDimension",
                    needed: u64::from(max_splits),
                    allowed: u64::from(limit),
                });
            }
            let max_tokens = split.max_tokens.min(max_tokens);
            let needed = KeySplit {
                max_tokens,
                ..split
            }
            .scratch_len(heads, max_positions);
            if needed > u64::from(u32::MAX) {
                return Err(Error::invalid(
                    "keys_per_split",
                    format!("{needed} partial values overflow u32 indexing"),
                ));
            }
            check_len("split scratch", scratch, needed)?;
            for (name, other) in [
                ("q", q),
                ("k_cache", k_cache),
                ("v_cache", v_cache),
                ("out", out),
            ] {
                check_distinct("split scratch", scratch, name, other)?;
            }
            let params = AttentionParams {
                keys_per_split: split.keys_per_split,
                max_splits,
                ..params
            };
            let parts = KernelBinding::new(
                ctx,
                self.split.pick(heads.head_dim),
                "attention split",
                &params,
                Some(step),
                &[q, k_cache, v_cache, scratch],
                Grid::PerToken(x),
            );
            let merge_x = elements("max_tokens", 1, q_dim)?.div_ceil(u64::from(MERGE_WG));
            let (merge_x, merge_y) = dispatch_grid(ctx, "attention merge", merge_x as u32)?;
            if merge_y != 1 {
                return Err(Error::invalid(
                    "n_heads",
                    format!("{q_dim} attention outputs exceed one dispatch row"),
                ));
            }
            let merge = KernelBinding::new(
                ctx,
                &self.merge,
                "attention merge",
                &params,
                Some(step),
                &[scratch, out],
                Grid::PerToken(merge_x),
            );
            Ok(SplitBinding {
                parts,
                merge,
                keys_per_split: split.keys_per_split,
                min_keys: split.min_keys,
                max_tokens,
                max_splits,
            })
        };
        let tiers = keys
            .tiers()
            .iter()
            .map(|&t| bind_split(t))
            .collect::<Result<Vec<_>>>()?;
        // a step longer than an invocation may walk always splits (see SHADER_LOOP_BUDGET):
        // needed only where the cache (or the window) holds more keys than that
        let bound = match keys.bound() {
            Some(b) if keys.keys_read(max_positions) >= b.min_keys => Some(bind_split(b)?),
            _ => None,
        };
        Ok(AttentionBinding {
            whole,
            tiers,
            bound,
            window: keys.window,
        })
    }
}

/// The split half of an [`AttentionBinding`].
#[derive(Debug)]
struct SplitBinding {
    parts: KernelBinding,
    merge: KernelBinding,
    keys_per_split: u32,
    min_keys: u32,
    max_tokens: u32,
    max_splits: u32,
}

/// A bound attention: one dispatch for steps that run whole, two (partials, merge) for long
/// steps of few tokens when bound with a [`KeySplit`]. Create once, record every step.
#[derive(Debug)]
pub struct AttentionBinding {
    whole: KernelBinding,
    /// Split tiers by `min_keys` (decode planning; empty: always whole).
    tiers: Vec<SplitBinding>,
    /// The split of steps no tier takes that exceed an invocation's key limit.
    bound: Option<SplitBinding>,
    window: Option<u32>,
}

impl AttentionBinding {
    /// How many splits a step runs its keys in (1: whole, one dispatch).
    pub fn splits(&self, step: &StepParams) -> u32 {
        self.tier(step).map_or(1, |(_, n)| n)
    }

    /// The tier a step runs and its split count, when it splits (more than one split).
    fn tier(&self, step: &StepParams) -> Option<(&SplitBinding, u32)> {
        let keys = self.window.map_or(step.kv_len, |w| step.kv_len.min(w));
        let takes = |s: &&SplitBinding| step.n_tokens <= s.max_tokens && keys >= s.min_keys;
        let s = (self.tiers.iter().rev().find(takes)).or(self.bound.iter().find(takes))?;
        let n = keys.div_ceil(s.keys_per_split).min(s.max_splits).max(1);
        (n > 1).then_some((s, n))
    }

    /// The keys per split a step runs with (`None`: whole, one dispatch).
    pub fn keys_per_split(&self, step: &StepParams) -> Option<u32> {
        self.tier(step).map(|(s, _)| s.keys_per_split)
    }

    /// Records the step's dispatches (one, or two when it splits).
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, step: &StepParams) {
        let n = step.n_tokens;
        match self.tier(step) {
            Some((s, splits)) => {
                let (x, y, _) = s.parts.grid().size(n);
                s.parts.record_size(pass, (x, y, splits), n);
                s.merge.record(pass, n);
            }
            None => self.whole.record(pass, n),
        }
    }

    /// The label it was bound with (`attention`).
    pub fn label(&self) -> &str {
        self.whole.label()
    }
}
