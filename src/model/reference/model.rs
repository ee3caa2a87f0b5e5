//! [`ReferenceModel`]: the whole forward pass on the CPU, Llama, GPT-2 and Gemma 3, from the
//! operations of the sibling modules.

use crate::config::{Activation, ModelConfig, NormKind};
use crate::dtype::dequantize;
use crate::error::{Error, Result};
use crate::model::arch;
use crate::model::graph::EmbedScale;
use crate::model::weights::ModelWeights;

use super::linear::matmul;
use super::ops::{attention, gelu_tanh, layer_norm, rms_norm, rope, silu};

/// A normalisation layer's parameters, `[d]` each; the variant is the config's [`NormKind`].
#[derive(Debug, Clone)]
enum Norm {
    /// RMSNorm gain.
    Rms(Vec<f32>),
    /// LayerNorm gain and bias.
    Layer(Vec<f32>, Vec<f32>),
}

impl Norm {
    /// Applies the layer to the rows of `x: [n, d]`.
    fn apply(&self, x: &[f32], eps: f32) -> Vec<f32> {
        match self {
            Norm::Rms(g) => rms_norm(x, g, g.len(), eps),
            Norm::Layer(g, b) => layer_norm(x, g, b, g.len(), eps),
        }
    }
}

/// One transformer block's weights, dequantized to f32. Matrices are `[out, in]`; `d` is the
/// model width, `q_dim = n_heads·head_dim`, `kv_dim = n_kv_heads·head_dim`, `ff` the
/// feed-forward width.
#[derive(Debug, Clone)]
struct Block {
    /// Before attention.
    attn_norm: Norm,
    /// `[q_dim, d]` (GPT-2: the first third of the fused `attn_qkv`).
    wq: Vec<f32>,
    /// `[kv_dim, d]`
    wk: Vec<f32>,
    /// `[kv_dim, d]`
    wv: Vec<f32>,
    /// `[q_dim]`
    bq: Option<Vec<f32>>,
    /// `[kv_dim]`
    bk: Option<Vec<f32>>,
    /// `[kv_dim]`
    bv: Option<Vec<f32>>,
    /// `[d, q_dim]`
    wo: Vec<f32>,
    /// `[d]`
    bo: Option<Vec<f32>>,
    /// Before the feed-forward.
    ffn_norm: Norm,
    /// `[ff, d]`, SwiGLU only.
    gate: Option<Vec<f32>>,
    /// `[ff, d]`
    up: Vec<f32>,
    /// `[ff]`
    up_bias: Option<Vec<f32>>,
    /// `[d, ff]`
    down: Vec<f32>,
    /// `[d]`
    down_bias: Option<Vec<f32>>,
    /// QK-norm gains `(q, k)`, `[head_dim]` each (Qwen3, Gemma 3).
    qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    /// Gemma 3's norms after attention and the feed-forward.
    gemma: Option<GemmaNorms>,
}

/// Gemma 3's norms of the attention and feed-forward outputs before they join the residual.
#[derive(Debug, Clone)]
struct GemmaNorms {
    /// `[d]`
    post_attention: Vec<f32>,
    /// `[d]`
    post_ffn: Vec<f32>,
}

/// A whole model on the CPU, every weight dequantized exactly to f32 once: the plain forward
/// pass that the GPU model's logits are checked against. It spends 4 bytes per parameter and
/// does no fusing or caching of its own, so that each step can be read against the papers.
#[derive(Clone)]
pub struct ReferenceModel {
    /// Shapes and numerics.
    config: ModelConfig,
    /// `[vocab, d]`
    token_embd: Vec<f32>,
    /// `[context_length, d]`, GPT-2 only.
    position_embd: Option<Vec<f32>>,
    /// `n_layers` blocks.
    blocks: Vec<Block>,
    /// Before the LM head.
    output_norm: Norm,
    /// `[vocab, d]`; `None` when the head is tied to `token_embd`.
    output: Option<Vec<f32>>,
}

/// The reference model's KV cache: f32 keys and values of every position seen so far, growing
/// as tokens are fed.
#[derive(Clone)]
pub struct ReferenceCache {
    /// Per layer, `[pos, kv_dim]` (after RoPE).
    k: Vec<Vec<f32>>,
    /// Per layer, `[pos, kv_dim]`.
    v: Vec<Vec<f32>>,
    /// `n_kv_heads · head_dim` of the model the cache was made for.
    kv_dim: usize,
    /// Positions held: the position of the next token fed.
    pos: usize,
}

// Hand-written so that `{:?}` prints the shape, not hundreds of megabytes of floats.
impl std::fmt::Debug for ReferenceModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReferenceModel")
            .field("config", &self.config)
            .field("tied_head", &self.output.is_none())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for ReferenceCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReferenceCache")
            .field("layers", &self.k.len())
            .field("kv_dim", &self.kv_dim)
            .field("pos", &self.pos)
            .finish()
    }
}

impl ReferenceCache {
    /// Number of positions already in the cache, i.e. the position of the next token.
    pub fn pos(&self) -> usize {
        self.pos
    }
}

impl ReferenceModel {
    /// Validates the configuration and tensor shapes, then dequantizes every weight the forward
    /// pass reads to f32 (GPT-2's fused QKV is split into Q, K and V here).
    ///
    /// Errors when the configuration is invalid, a tensor is missing or misshapen, its bytes do
    /// not match its type, or a GPT-2 config asks for grouped-query attention.
    pub fn new(weights: &ModelWeights<'_>) -> Result<Self> {
        let c = &weights.config;
        arch::validate(c, &weights.file)?;
        if c.bidirectional {
            return Err(Error::Unsupported {
                file: weights.file.clone(),
                what: format!(
                    "the reference forward pass of a {} encoder (it runs the causal decoders; \
                     encoders are held to their float64 goldens)",
                    c.arch.name()
                ),
            });
        }
        weights.check_shapes()?;
        let load = |name: &str| -> Result<Vec<f32>> {
            let t = weights.tensor(name)?;
            dequantize(t.dtype, &t.data, t.n_elements() as u64, name)
        };
        let norm = |prefix: &str| -> Result<Norm> {
            let g = load(&format!("{prefix}.weight"))?;
            Ok(match c.norm {
                NormKind::RmsNorm => Norm::Rms(g),
                NormKind::LayerNorm => Norm::Layer(g, load(&format!("{prefix}.bias"))?),
            })
        };
        // what to load is what the architecture expects: stacked or separate projections,
        // biases, QK-norm gains, post-norms, learned positions, an untied head
        let expected: std::collections::HashSet<String> = arch::expected_tensors(c)
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        let optional = |name: &str| -> Result<Option<Vec<f32>>> {
            match expected.contains(name) {
                true => load(name).map(Some),
                false => Ok(None),
            }
        };
        let (d, q_rows, kv_rows) = (c.hidden_size, c.q_dim(), c.kv_dim());
        let mut blocks = Vec::with_capacity(c.n_layers);
        for i in 0..c.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}");
            let (wq, wk, wv, bq, bk, bv) = match optional(&n("attn_qkv.weight"))? {
                // stacked `[q_dim + 2·kv_dim, d]` rows and bias: q, then k, then v (GPT-2)
                Some(qkv) => {
                    let (q, kv) = (q_rows * d, kv_rows * d);
                    let bias = optional(&n("attn_qkv.bias"))?;
                    let part = |b: &Option<Vec<f32>>, from: usize, len: usize| {
                        b.as_ref().map(|b| b[from..from + len].to_vec())
                    };
                    (
                        qkv[..q].to_vec(),
                        qkv[q..q + kv].to_vec(),
                        qkv[q + kv..].to_vec(),
                        part(&bias, 0, q_rows),
                        part(&bias, q_rows, kv_rows),
                        part(&bias, q_rows + kv_rows, kv_rows),
                    )
                }
                None => (
                    load(&n("attn_q.weight"))?,
                    load(&n("attn_k.weight"))?,
                    load(&n("attn_v.weight"))?,
                    optional(&n("attn_q.bias"))?,
                    optional(&n("attn_k.bias"))?,
                    optional(&n("attn_v.bias"))?,
                ),
            };
            let (bo, up_bias, down_bias) = (
                optional(&n("attn_output.bias"))?,
                optional(&n("ffn_up.bias"))?,
                optional(&n("ffn_down.bias"))?,
            );
            blocks.push(Block {
                attn_norm: norm(&n("attn_norm"))?,
                wq,
                wk,
                wv,
                bq,
                bk,
                bv,
                wo: load(&n("attn_output.weight"))?,
                bo,
                ffn_norm: norm(&n("ffn_norm"))?,
                gate: optional(&n("ffn_gate.weight"))?,
                up: load(&n("ffn_up.weight"))?,
                up_bias,
                down: load(&n("ffn_down.weight"))?,
                down_bias,
                qk_norm: match (
                    optional(&n("attn_q_norm.weight"))?,
                    optional(&n("attn_k_norm.weight"))?,
                ) {
                    (Some(q), Some(k)) => Some((q, k)),
                    _ => None,
                },
                gemma: match (
                    optional(&n("post_attention_norm.weight"))?,
                    optional(&n("post_ffw_norm.weight"))?,
                ) {
                    (Some(post_attention), Some(post_ffn)) => Some(GemmaNorms {
                        post_attention,
                        post_ffn,
                    }),
                    _ => None,
                },
            });
        }
        Ok(ReferenceModel {
            token_embd: load("token_embd.weight")?,
            position_embd: optional("position_embd.weight")?,
            blocks,
            output_norm: norm("output_norm")?,
            output: optional("output.weight")?,
            config: c.clone(),
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// An empty KV cache for this model (position 0).
    pub fn new_cache(&self) -> ReferenceCache {
        ReferenceCache {
            k: vec![Vec::new(); self.config.n_layers],
            v: vec![Vec::new(); self.config.n_layers],
            kv_dim: self.config.kv_dim(),
            pos: 0,
        }
    }

    /// Feeds `tokens` at positions `cache.pos()..cache.pos() + tokens.len()`, appending their
    /// keys and values to `cache`, and returns the logits after each token:
    /// `[tokens.len()][vocab_size]`.
    ///
    /// Errors, leaving the cache untouched, when a token id is outside the vocabulary, the
    /// positions would run past the context length, or the cache belongs to another model.
    pub fn forward(&self, cache: &mut ReferenceCache, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        self.forward_last(cache, tokens, tokens.len())
    }

    /// [`Self::forward`], returning the logits after the last `rows` tokens only (all of them
    /// when there are fewer): `[min(rows, tokens.len())][vocab_size]`. The output projection
    /// runs for those rows alone, most of the work for a large vocabulary and a long prompt.
    pub fn forward_last(
        &self,
        cache: &mut ReferenceCache,
        tokens: &[u32],
        rows: usize,
    ) -> Result<Vec<Vec<f32>>> {
        let c = &self.config;
        let (n, d) = (tokens.len(), c.hidden_size);
        let x = self.layers(cache, tokens)?;
        if n == 0 {
            return Ok(Vec::new());
        }
        let kept = rows.min(n);
        let h = self.output_norm.apply(&x[(n - kept) * d..], c.norm_eps);
        let head = self.output.as_deref().unwrap_or(&self.token_embd);
        let logits = matmul(head, &h, None, c.vocab_size, d);
        Ok(logits
            .chunks_exact(c.vocab_size)
            .map(<[f32]>::to_vec)
            .collect())
    }

    /// [`Self::forward`]'s final hidden states instead of its logits: the residual stream
    /// after the last layer through the final norm, `[tokens.len() · d]` (what embeddings
    /// pool).
    pub fn hidden(&self, cache: &mut ReferenceCache, tokens: &[u32]) -> Result<Vec<f32>> {
        let x = self.layers(cache, tokens)?;
        Ok(self.output_norm.apply(&x, self.config.norm_eps))
    }

    /// Feeds `tokens` through every layer (as [`Self::forward`]), returning the residual
    /// stream after the last one, `[tokens.len() · d]`.
    fn layers(&self, cache: &mut ReferenceCache, tokens: &[u32]) -> Result<Vec<f32>> {
        let c = &self.config;
        if cache.k.len() != c.n_layers || cache.kv_dim != c.kv_dim() {
            return Err(Error::invalid(
                "cache",
                "the cache was made for a model of another shape",
            ));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(Error::invalid(
                "tokens",
                format!(
                    "token id {bad} is outside the vocabulary of {}",
                    c.vocab_size
                ),
            ));
        }
        let start = cache.pos;
        let end = start
            .checked_add(tokens.len())
            .filter(|&e| e <= c.context_length)
            .ok_or_else(|| {
                Error::invalid(
                    "tokens",
                    format!(
                        "{} tokens from position {start} run past the context length {}",
                        tokens.len(),
                        c.context_length
                    ),
                )
            })?;
        let n = tokens.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let (d, hd, ff) = (c.hidden_size, c.head_dim, c.ffn_size);
        let (q_dim, kv_dim) = (c.q_dim(), c.kv_dim());

        // x: [n, d], the residual stream (Gemma scales the embedding by √d).
        let scale = match arch::spec(c.arch).embedding_scale {
            EmbedScale::SqrtDim => (d as f32).sqrt(),
            EmbedScale::One => 1.0,
        };
        let mut x = Vec::with_capacity(n * d);
        for (i, &t) in tokens.iter().enumerate() {
            let row = &self.token_embd[t as usize * d..][..d];
            match &self.position_embd {
                Some(p) => {
                    let prow = &p[(start + i) * d..][..d];
                    x.extend(row.iter().zip(prow).map(|(a, b)| a + b));
                }
                None => x.extend(row.iter().map(|v| v * scale)),
            }
        }

        for (l, b) in self.blocks.iter().enumerate() {
            let freqs = c.layer_rope(l);
            let window = c.layer_window(l).map(|w| w as usize);
            let h = b.attn_norm.apply(&x, c.norm_eps);
            let mut q = matmul(&b.wq, &h, b.bq.as_deref(), q_dim, d);
            let mut k = matmul(&b.wk, &h, b.bk.as_deref(), kv_dim, d);
            let v = matmul(&b.wv, &h, b.bv.as_deref(), kv_dim, d);
            if let Some((q_norm, k_norm)) = &b.qk_norm {
                // QK-norm: every head of every token on its own
                q = rms_norm(&q, q_norm, hd, c.norm_eps);
                k = rms_norm(&k, k_norm, hd, c.norm_eps);
            }
            for (i, (qi, ki)) in q
                .chunks_exact_mut(q_dim)
                .zip(k.chunks_exact_mut(kv_dim))
                .enumerate()
            {
                rope(qi, c.n_heads, hd, start + i, &freqs, c.rope_layout);
                rope(ki, c.n_kv_heads, hd, start + i, &freqs, c.rope_layout);
                // YaRN: the rotation's cos and sin carry its attention factor
                let m = f64::from(freqs.scaling.attention_factor());
                if m != 1.0 {
                    for x in qi.iter_mut().chain(ki.iter_mut()) {
                        *x = (f64::from(*x) * m) as f32;
                    }
                }
            }
            cache.k[l].extend_from_slice(&k);
            cache.v[l].extend_from_slice(&v);
            let mut att = Vec::with_capacity(n * q_dim);
            for (i, qi) in q.chunks_exact(q_dim).enumerate() {
                // Causal: token i sees the cached prefix and itself, nothing after (a local
                // layer only its latest `window` keys).
                let end = start + i + 1;
                let first = window.map_or(0, |w| end.saturating_sub(w));
                att.extend(attention(
                    qi,
                    &cache.k[l][first * kv_dim..],
                    &cache.v[l][first * kv_dim..],
                    end - first,
                    c.n_heads,
                    c.n_kv_heads,
                    hd,
                ));
            }
            let out = matmul(&b.wo, &att, b.bo.as_deref(), d, q_dim);
            match &b.gemma {
                Some(g) => add_in_place(&mut x, &rms_norm(&out, &g.post_attention, d, c.norm_eps)),
                None => add_in_place(&mut x, &out),
            }

            let h = b.ffn_norm.apply(&x, c.norm_eps);
            let up = matmul(&b.up, &h, b.up_bias.as_deref(), ff, d);
            let act: Vec<f32> = match &b.gate {
                Some(gate) => {
                    let g = matmul(gate, &h, None, ff, d);
                    let f = match c.activation {
                        Activation::GeGlu => gelu_tanh,
                        _ => silu,
                    };
                    g.iter().zip(&up).map(|(&g, &u)| f(g) * u).collect()
                }
                None => up.iter().map(|&u| gelu_tanh(u)).collect(),
            };
            let out = matmul(&b.down, &act, b.down_bias.as_deref(), d, ff);
            match &b.gemma {
                Some(g) => add_in_place(&mut x, &rms_norm(&out, &g.post_ffn, d, c.norm_eps)),
                None => add_in_place(&mut x, &out),
            }
        }
        cache.pos = end;
        Ok(x)
    }
}

/// `x += y`, elementwise (the residual connections).
fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}
