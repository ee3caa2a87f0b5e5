//! The GPU backend's side of the graph: each [`Op`] becomes a bound kernel (a [`Node`]) over
//! the uploaded weights, the KV cache and the activation buffers, once at load. A step then only
//! records the nodes.

use std::collections::HashMap;

use crate::backend::gpu::decode_plan::DecodePlan;
use crate::backend::gpu::ops::{
    Attention, AttentionBinding, AttentionKeys, EmbedSource, Embedding, Epilogue, Heads, InputNorm,
    KeySplit, KvSource, KvStore, KvWriteBinding, Linear, LinearBinding, LinearOptions, NormBinding,
    Qkv, RopeKvWrite, RowNorm, RowNormKind, SwiGlu,
};
use crate::backend::gpu::plan::Family;
use crate::backend::gpu::variants::attention::AttentionVariant;
use crate::backend::gpu::{
    GpuContext, GpuTensor, KernelBinding, KernelCache, KernelPlan, KvCache, Reduction,
    SplitOverride, StepParams, Variant,
};
use crate::config::{ModelConfig, NormKind, RopeLayout};
use crate::dtype::kv::KV_BLOCK;
use crate::error::{Error, Result};
use crate::model::graph::{Act, EmbedScale, Graph, LinearOp, Op, Post, Rows, WeightIndex};

/// One recorded dispatch of the graph.
#[derive(Debug)]
pub(super) enum Node {
    Kernel(KernelBinding),
    /// One kernel bound once per row part of a split weight, recorded in order.
    Parts(Vec<KernelBinding>),
    Linear(LinearBinding),
    /// Attention, bound in each variant the plan may choose.
    Attention(Vec<(Variant, AttentionBinding)>),
}

impl Node {
    /// Records the node for a step of `step.n_tokens` tokens in the variant `plan` chooses
    /// (linears of a batched decode step in the decode kernel: see
    /// [`LinearBinding::record_batched`]).
    pub(super) fn record(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        step: &StepParams,
        plan: &KernelPlan,
    ) {
        let n_tokens = step.n_tokens;
        match self {
            Node::Kernel(k) => k.record(pass, n_tokens),
            Node::Parts(parts) => parts.iter().for_each(|k| k.record(pass, n_tokens)),
            Node::Linear(l) if step.batched != 0 => l.record_batched(pass, n_tokens, plan.linear()),
            Node::Linear(l) => l.record_planned(pass, n_tokens, plan.linear()),
            Node::Attention(built) => {
                if let Some(k) = pick_variant(built, plan.variant(Family::Attention)) {
                    k.record(pass, step);
                }
            }
        }
    }
}

/// The binding of `variant`, or the first built when that variant was not built.
pub(super) fn pick_variant<T>(built: &[(Variant, T)], variant: Variant) -> Option<&T> {
    built
        .iter()
        .find(|(v, _)| *v == variant)
        .or(built.first())
        .map(|(_, k)| k)
}

/// How attention reads its keys under `plan` and the decode plan `decode` in a cache of
/// `positions` rows: the decode plan's key blocks unless `plan` forces a split (or none), and
/// the window a layer trained with local attention reads (`trained`).
pub(super) fn attention_keys(
    plan: &KernelPlan,
    decode: &DecodePlan,
    config: &ModelConfig,
    positions: u32,
    trained: Option<u32>,
) -> Result<AttentionKeys> {
    let model = format!("this {} model", config.arch.name());
    let local_model = config.local_attention.is_some();
    let keys = match plan.attention_split {
        None => return decode.keys(positions, trained, local_model, &model),
        Some(SplitOverride::Off) => AttentionKeys::whole(),
        Some(SplitOverride::Keys(k)) => AttentionKeys::from(Some(KeySplit::with_keys(k))),
    };
    Ok(keys.with_window(decode.window(trained, local_model, &model)?))
}

/// The attention geometry of `config`.
pub(super) fn heads_of(config: &ModelConfig) -> Heads {
    Heads {
        n_heads: config.n_heads as u32,
        n_kv_heads: config.n_kv_heads as u32,
        head_dim: config.head_dim as u32,
    }
}

/// Activation buffers, f32, sized for `chunk` tokens: one per [`Act`], plus split
/// attention's partials.
#[derive(Debug)]
pub(super) struct Activations {
    pub ids: wgpu::Buffer,
    pub x: wgpu::Buffer,
    pub q: wgpu::Buffer,
    pub k: wgpu::Buffer,
    pub v: wgpu::Buffer,
    pub attn: wgpu::Buffer,
    /// Split attention's partials (flash-decoding), shared by the layers: see
    /// [`KeySplit::scratch_len`].
    pub attn_split: wgpu::Buffer,
    pub gate: wgpu::Buffer,
    pub up: wgpu::Buffer,
    pub hidden: wgpu::Buffer,
    /// Logits; a step that needs only its last token's has them in row 0.
    pub logits: wgpu::Buffer,
    /// A sub-layer's output before its post-norm (one float for models without them).
    pub branch: wgpu::Buffer,
    /// Whether [`Act::Attn`] and [`Act::Hidden`], the activations that only a matrix product
    /// reads, hold f16 (two values per word): under precision f16.
    pub f16: bool,
}

impl Activations {
    /// Whether `act` holds f16 values.
    pub(super) fn is_f16(&self, act: Act) -> bool {
        self.f16 && matches!(act, Act::Attn | Act::Hidden)
    }

    /// The buffer of `act`.
    pub(super) fn get(&self, act: Act) -> &wgpu::Buffer {
        match act {
            Act::Ids => &self.ids,
            Act::X => &self.x,
            Act::Q => &self.q,
            Act::K => &self.k,
            Act::V => &self.v,
            Act::Attn => &self.attn,
            Act::Gate => &self.gate,
            Act::Up => &self.up,
            Act::Hidden => &self.hidden,
            Act::Logits => &self.logits,
            Act::Branch => &self.branch,
        }
    }

    /// Every buffer, for the memory report.
    pub(super) fn all(&self) -> [&wgpu::Buffer; 12] {
        [
            &self.ids,
            &self.x,
            &self.q,
            &self.k,
            &self.v,
            &self.attn,
            &self.attn_split,
            &self.gate,
            &self.up,
            &self.hidden,
            &self.logits,
            &self.branch,
        ]
    }
}

impl WeightIndex for HashMap<String, GpuTensor> {
    fn shape(&self, name: &str) -> Option<&[usize]> {
        self.get(name).map(|t| t.shape.as_slice())
    }
}

/// What compiling the graph binds against.
pub(super) struct Compiler<'a> {
    pub ctx: &'a GpuContext,
    pub cache: &'a KernelCache,
    pub config: &'a ModelConfig,
    pub chunk: usize,
    pub kv: &'a KvCache,
    pub step: &'a wgpu::Buffer,
    pub act: &'a Activations,
    pub w: &'a HashMap<String, GpuTensor>,
    pub plan: &'a KernelPlan,
}

/// The compiled graph: the per-step nodes, and the head for the last row (into row 0 of the
/// logits) and for every row (`None` for an encoder, which has no LM head).
pub(super) struct Compiled {
    pub nodes: Vec<Node>,
    pub head_last: Option<LinearBinding>,
    pub head_all: Option<LinearBinding>,
}

impl Compiler<'_> {
    fn get(&self, name: &str) -> Result<&GpuTensor> {
        self.w
            .get(name)
            .ok_or_else(|| Error::format("model", format!("missing tensor `{name}`")))
    }

    /// Layer `layer`'s K and V cache buffers.
    fn layer_cache(&self, layer: usize) -> Result<(&wgpu::Buffer, &wgpu::Buffer)> {
        match (self.kv.k.get(layer), self.kv.v.get(layer)) {
            (Some(k), Some(v)) => Ok((k, v)),
            _ => Err(Error::invalid("layer", format!("no KV cache for {layer}"))),
        }
    }

    /// Rows per sequence of layer `layer`'s ring, `None` when its cache keeps every position.
    fn ring(&self, layer: usize) -> Option<u32> {
        self.kv.layout().ring(layer).map(|r| r as u32)
    }

    /// Whether the stacked Q/K/V projection encodes the caches a block at a time itself
    /// ([`LinearOptions::kv_blocks`]): the kinds are neither both f32 nor both f16 (which it
    /// writes value by value) and the query and key/value rows come in whole blocks.
    /// Otherwise a [`KvStore`] dispatch follows it.
    fn qkv_encodes_blocks(&self) -> bool {
        let kinds = self.kv.kinds();
        !kinds.is_f32()
            && !kinds.is_f16()
            && self.config.q_dim().is_multiple_of(KV_BLOCK)
            && self.config.kv_dim().is_multiple_of(KV_BLOCK)
    }

    /// Binds every operation of `graph`.
    pub(super) async fn compile(&self, graph: &Graph) -> Result<Compiled> {
        let red = Reduction::best(self.ctx);
        let mut nodes = Vec::with_capacity(graph.ops.len());
        for op in &graph.ops {
            nodes.extend(self.node(op, red).await?);
            if let Some(store) = self.kv_store(op).await? {
                nodes.push(store);
            }
        }
        let (head_last, head_all) = match &graph.head {
            Some(head) => (
                Some(self.linear(head, red, true).await?),
                Some(self.linear(head, red, false).await?),
            ),
            None => (None, None),
        };
        Ok(Compiled {
            nodes,
            head_last,
            head_all,
        })
    }

    /// The cache write that follows `op` when the caches are of other kinds than f32: the
    /// producer (the stacked Q/K/V projection, or the rotation of separate ones) leaves the
    /// rotated keys and the values in its output and a [`KvStore`] encodes them.
    async fn kv_store(&self, op: &Op) -> Result<Option<Node>> {
        let kinds = self.kv.kinds();
        if kinds.is_f32() {
            return Ok(None);
        }
        // the stacked projection writes an f16 cache itself, and block kinds when its rows
        // fall in whole blocks
        if matches!(op, Op::Linear(l) if l.kv_layer.is_some())
            && (kinds.is_f16() || self.qkv_encodes_blocks())
        {
            return Ok(None);
        }
        let c = self.config;
        let (q_dim, kv_dim) = (c.q_dim() as u32, c.kv_dim() as u32);
        let (layer, src) = match op {
            Op::Linear(l) => match l.kv_layer {
                Some(layer) => {
                    let y = self.act.get(l.y);
                    let stride = q_dim + 2 * kv_dim;
                    let src = KvSource {
                        k: y,
                        k_off: q_dim,
                        k_stride: stride,
                        v: y,
                        v_off: q_dim + kv_dim,
                        v_stride: stride,
                    };
                    (layer, src)
                }
                None => return Ok(None),
            },
            Op::RopeKvWrite { layer } => {
                let src = KvSource {
                    k: &self.act.k,
                    k_off: 0,
                    k_stride: kv_dim,
                    v: &self.act.v,
                    v_off: 0,
                    v_stride: kv_dim,
                };
                (*layer, src)
            }
            _ => return Ok(None),
        };
        let (k_cache, v_cache) = self.layer_cache(layer)?;
        let store = KvStore::new(self.ctx, self.cache, kinds).await?;
        Ok(Some(Node::Kernel(store.bind_in_ring(
            self.ctx,
            self.step,
            src,
            (k_cache, v_cache),
            kv_dim,
            (self.kv.context() as u32, self.ring(layer)),
            self.chunk as u32,
        )?)))
    }

    /// The node of `op` (none for an op with nothing to record).
    async fn node(&self, op: &Op, red: Reduction) -> Result<Option<Node>> {
        let (ctx, cache, c, a) = (self.ctx, self.cache, self.config, self.act);
        let max = self.chunk as u32;
        let heads = heads_of(c);
        let positions = self.kv.context() as u32;
        Ok(Some(match op {
            Op::Embed {
                table,
                rows,
                accumulate,
                scale,
            } => {
                let t = self.get(table)?;
                let (source, ids) = match rows {
                    Rows::Tokens => (EmbedSource::Tokens, Some(&a.ids)),
                    Rows::Positions => (EmbedSource::Positions, None),
                    Rows::First => (EmbedSource::First, None),
                };
                let e = Embedding::new(ctx, cache, t.dtype, source, *accumulate).await?;
                let scale = match scale {
                    EmbedScale::One => 1.0,
                    EmbedScale::SqrtDim => (c.hidden_size as f32).sqrt(),
                };
                Node::Parts(e.bind_scaled(ctx, self.step, t, ids, &a.x, max, scale)?)
            }
            Op::Linear(l) => Node::Linear(self.linear(l, red, false).await?),
            Op::RopeKvWrite { layer } if !self.kv.kinds().is_f32() => {
                if c.rope_layout == RopeLayout::None {
                    // nothing to rotate: the cache write that follows is the whole op
                    return Ok(None);
                }
                let rope = RopeKvWrite::rotate_only(ctx, cache, c.rope_layout).await?;
                Node::Kernel(rope.bind_rotate_only(
                    ctx,
                    self.step,
                    &a.q,
                    &a.k,
                    heads,
                    c.layer_rope(*layer),
                    max,
                )?)
            }
            Op::RopeKvWrite { layer } => {
                let (k_cache, v_cache) = self.layer_cache(*layer)?;
                let rope = RopeKvWrite::new(ctx, cache, c.rope_layout).await?;
                let qkv = Qkv {
                    q: &a.q,
                    k: &a.k,
                    v: &a.v,
                };
                Node::Kernel(rope.bind_in_ring(
                    ctx,
                    self.step,
                    qkv,
                    (k_cache, v_cache),
                    heads,
                    c.layer_rope(*layer),
                    (positions, self.ring(*layer)),
                    max,
                )?)
            }
            Op::Attention { layer, stacked } => {
                let (k_cache, v_cache) = self.layer_cache(*layer)?;
                let q_stride = match stacked {
                    true => (c.q_dim() + 2 * c.kv_dim()) as u32,
                    false => c.q_dim() as u32,
                };
                let candidates = self.plan.candidates(Family::Attention);
                let mut built = Vec::new();
                for &variant in &candidates {
                    let built_kernel = Attention::with_output(
                        ctx,
                        cache,
                        red,
                        variant,
                        heads.head_dim,
                        self.kv.kinds(),
                        a.is_f16(Act::Attn),
                    )
                    .await;
                    let attention = match built_kernel {
                        Ok(a) => a,
                        // heads its table says it cannot run: measure without it (a forced
                        // plan still fails with the reason)
                        Err(Error::InvalidArgument { .. })
                            if candidates.len() > 1
                                && AttentionVariant::find(variant)
                                    .is_some_and(|v| !v.applies(heads.head_dim)) =>
                        {
                            continue
                        }
                        Err(e) => return Err(e),
                    };
                    built.push((
                        variant,
                        attention.bind_keys(
                            ctx,
                            self.step,
                            (&a.q, q_stride),
                            (k_cache, v_cache),
                            &a.attn,
                            heads,
                            (positions, max),
                            &attention_keys(
                                self.plan,
                                &ctx.options().decode_plan,
                                self.config,
                                positions,
                                c.layer_window(*layer),
                            )?
                            .with_score_scale(c.layer_score_scale(*layer))
                            .with_ring(self.ring(*layer))
                            .with_bidirectional(c.bidirectional),
                            Some(&a.attn_split),
                        )?,
                    ));
                }
                Node::Attention(built)
            }
            Op::HeadNorm { act, weight } => {
                let n_heads = match act {
                    Act::K => c.n_kv_heads,
                    _ => c.n_heads,
                } as u32;
                let stride = match act {
                    Act::K => c.kv_dim(),
                    _ => c.q_dim(),
                } as u32;
                let norm = RowNorm::new(ctx, cache, RowNormKind::Heads).await?;
                Node::Kernel(norm.bind_heads(
                    ctx,
                    self.step,
                    a.get(*act),
                    &self.get(weight)?.buffer,
                    (n_heads, c.head_dim as u32, stride),
                    c.norm_eps,
                    max,
                )?)
            }
            Op::AddNormed { weight } => {
                let norm = RowNorm::new(ctx, cache, RowNormKind::AddInto).await?;
                Node::Kernel(norm.bind_add(
                    ctx,
                    self.step,
                    &a.branch,
                    &a.x,
                    &self.get(weight)?.buffer,
                    (c.hidden_size as u32, c.norm_eps),
                    max,
                )?)
            }
            Op::Norm(norm) => {
                let Some(bias) = &norm.bias else {
                    return Err(Error::invalid(
                        "graph",
                        "a norm of the residual stream runs as a LayerNorm with a bias",
                    ));
                };
                let layer = RowNorm::new(ctx, cache, RowNormKind::Layer).await?;
                Node::Kernel(layer.bind_layer(
                    ctx,
                    self.step,
                    &a.x,
                    &self.get(&norm.weight)?.buffer,
                    &self.get(bias)?.buffer,
                    (c.hidden_size as u32, c.norm_eps),
                    max,
                )?)
            }
            Op::SwiGlu | Op::GeGlu => {
                let gelu = matches!(op, Op::GeGlu);
                let swiglu = SwiGlu::with_output(ctx, cache, gelu, a.is_f16(Act::Hidden)).await?;
                Node::Kernel(swiglu.bind(
                    ctx,
                    self.step,
                    &a.gate,
                    &a.up,
                    &a.hidden,
                    c.ffn_size as u32,
                    max,
                )?)
            }
        }))
    }

    /// Binds `op`; `last_row` computes only the step's last row, into row 0 of `y`.
    async fn linear(&self, op: &LinearOp, red: Reduction, last_row: bool) -> Result<LinearBinding> {
        let c = self.config;
        let weight = self.get(&op.matrix.weight)?;
        let bias = match &op.matrix.bias {
            Some(name) => Some(self.get(name)?),
            None => None,
        };
        let norm = match &op.norm {
            Some(n) => Some((
                match n.kind {
                    NormKind::RmsNorm => InputNorm::Rms,
                    NormKind::LayerNorm => InputNorm::Layer,
                },
                NormBinding {
                    weight: &self.get(&n.weight)?.buffer,
                    bias: match &n.bias {
                        Some(b) => Some(&self.get(b)?.buffer),
                        None => None,
                    },
                    eps: c.norm_eps,
                },
            )),
            None => None,
        };
        let kinds = self.kv.kinds();
        let encodes = self.qkv_encodes_blocks();
        let deferred = !kinds.is_f32() && !kinds.is_f16() && !encodes;
        let rope = c.layer_rope(op.kv_layer.unwrap_or(0));
        let kv = match op.kv_layer {
            Some(layer) => {
                let caches = self.layer_cache(layer)?;
                Some(KvWriteBinding {
                    caches: (!deferred).then_some(caches),
                    q_rows: c.q_dim() as u32,
                    kv_rows: c.kv_dim() as u32,
                    head_dim: c.head_dim as u32,
                    rope: &rope,
                    max_positions: self.kv.context() as u32,
                    ring: self.ring(layer),
                })
            }
            None => None,
        };
        let options = LinearOptions {
            has_bias: bias.is_some(),
            accumulate: op.accumulate,
            norm: norm.as_ref().map(|(kind, _)| *kind),
            epilogue: match op.post {
                Post::None => Epilogue::None,
                Post::SwiGlu => Epilogue::SwiGlu,
                Post::Gelu => Epilogue::Gelu,
                Post::GeluErf => Epilogue::GeluErf,
                Post::GeGlu => Epilogue::GeGlu,
            },
            last_row,
            kv_write: kv.is_some(),
            rope: kv.is_some() && c.rope_layout != RopeLayout::None,
            kv_deferred: kv.is_some() && deferred,
            kv_f16: kv.is_some() && kinds.is_f16(),
            kv_blocks: (kv.is_some() && encodes).then_some(kinds),
            x_f16: self.act.is_f16(op.x),
            y_f16: self.act.is_f16(op.y),
        };
        let linear = Linear::with_variants(
            self.ctx,
            self.cache,
            weight.dtype,
            red,
            options,
            &self.plan.candidates(Family::LinearDecode),
            &self.plan.candidates(Family::LinearPrefill),
        )
        .await?;
        linear.bind_qkv(
            self.ctx,
            self.step,
            weight,
            self.act.get(op.x),
            bias.map(|b| &b.buffer),
            norm.map(|(_, binding)| binding),
            kv,
            self.act.get(op.y),
            self.chunk as u32,
        )
    }
}
