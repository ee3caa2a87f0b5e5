//! Plain CPU implementations of every operation of the forward pass, and [`ReferenceModel`], a
//! whole-model forward pass built from them: the oracle the GPU kernels and the GPU model are
//! tested against.
//!
//! Weights are dequantized exactly to f32 once; activations are stored in f32 between
//! operations, but every reduction (dot products, norms, softmax, attention) accumulates in f64,
//! so the result sits within rounding of the float64 goldens in `tests/fixtures/golden/`.
//! Shapes are written outermost first; matrices are `[out, in]` and row-major.

use crate::error::{Error, Result};
use crate::format::{ModelWeights, Tensor};
use crate::model::config::{Activation, Architecture, ModelConfig, NormKind, RopeLayout};
use crate::model::weights::dequantize;

// ---------------------------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------------------------

/// `y = W·x (+ bias)`: `w: [rows, cols]` row-major, `x: [cols]`, `bias: [rows]` → `y: [rows]`.
///
/// # Panics
/// When the slices do not match the shape (a programming error in the caller).
pub fn matvec(w: &[f32], x: &[f32], bias: Option<&[f32]>, rows: usize, cols: usize) -> Vec<f32> {
    assert_eq!(w.len(), rows * cols, "w must be [rows, cols]");
    assert_eq!(x.len(), cols, "x must be [cols]");
    (0..rows)
        .map(|r| {
            let row = &w[r * cols..(r + 1) * cols];
            let dot: f64 = row
                .iter()
                .zip(x)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum();
            let b = bias.map_or(0.0, |b| f64::from(b[r]));
            (dot + b) as f32
        })
        .collect()
}

/// RMSNorm over rows of length `n`: `x: [n_rows, n]`, `weight: [n]` → `[n_rows, n]`.
///
/// # Panics
/// When the slices do not match the shape (a programming error in the caller).
pub fn rms_norm(x: &[f32], weight: &[f32], n: usize, eps: f32) -> Vec<f32> {
    assert_eq!(weight.len(), n, "weight must be [n]");
    assert!(n > 0 && x.len().is_multiple_of(n), "x must be [n_rows, n]");
    x.chunks(n)
        .flat_map(|row| {
            let mean_sq = row
                .iter()
                .map(|&v| f64::from(v) * f64::from(v))
                .sum::<f64>()
                / n as f64;
            let scale = 1.0 / (mean_sq + f64::from(eps)).sqrt();
            row.iter()
                .zip(weight)
                .map(move |(&v, &g)| (f64::from(v) * scale * f64::from(g)) as f32)
        })
        .collect()
}

/// LayerNorm over rows of length `n`: `x: [n_rows, n]`, `weight: [n]`, `bias: [n]` →
/// `[n_rows, n]`, `(x − mean) / sqrt(var + eps) · weight + bias` with the biased (population)
/// variance, as PyTorch and GPT-2 use.
///
/// # Panics
/// When the slices do not match the shape (a programming error in the caller).
pub fn layer_norm(x: &[f32], weight: &[f32], bias: &[f32], n: usize, eps: f32) -> Vec<f32> {
    assert_eq!(weight.len(), n, "weight must be [n]");
    assert_eq!(bias.len(), n, "bias must be [n]");
    assert!(n > 0 && x.len().is_multiple_of(n), "x must be [n_rows, n]");
    x.chunks(n)
        .flat_map(|row| {
            // Two passes (mean, then squared deviations) rather than E[x²] − E[x]²: the
            // one-pass form cancels catastrophically when the mean is large against the spread.
            let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
            let var = row
                .iter()
                .map(|&v| (f64::from(v) - mean).powi(2))
                .sum::<f64>()
                / n as f64;
            let scale = 1.0 / (var + f64::from(eps)).sqrt();
            row.iter().zip(weight).zip(bias).map(move |((&v, &g), &b)| {
                ((f64::from(v) - mean) * scale * f64::from(g) + f64::from(b)) as f32
            })
        })
        .collect()
}

/// Rotary position embedding, in place, for one token at position `pos`:
/// `x: [n_heads, head_dim]`. Pair `i` (of `head_dim / 2`) is rotated by the angle
/// `pos · theta^(−2i / head_dim)`; [`RopeLayout::Interleaved`] pairs dimensions `(2i, 2i+1)`,
/// [`RopeLayout::RotateHalf`] pairs `(i, i + head_dim/2)`, [`RopeLayout::None`] leaves `x` as is.
///
/// # Panics
/// When `x` is not `[n_heads, head_dim]` or `head_dim` is odd with a rotating layout.
pub fn rope(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    pos: usize,
    theta: f32,
    layout: RopeLayout,
) {
    assert_eq!(x.len(), n_heads * head_dim, "x must be [n_heads, head_dim]");
    if layout == RopeLayout::None {
        return;
    }
    assert!(head_dim.is_multiple_of(2), "RoPE needs an even head_dim");
    let half = head_dim / 2;
    for i in 0..half {
        let (a, b) = match layout {
            RopeLayout::Interleaved => (2 * i, 2 * i + 1),
            _ => (i, i + half),
        };
        // The angle in f64: at long positions an f32 angle alone is off by ~pos·2⁻²⁴ radians.
        let freq = f64::from(theta).powf(-2.0 * i as f64 / head_dim as f64);
        let (sin, cos) = (pos as f64 * freq).sin_cos();
        for head in x.chunks_exact_mut(head_dim) {
            let (x0, x1) = (f64::from(head[a]), f64::from(head[b]));
            head[a] = (x0 * cos - x1 * sin) as f32;
            head[b] = (x0 * sin + x1 * cos) as f32;
        }
    }
}

/// Softmax in place over all of `x`, numerically stable (the maximum is subtracted first) and
/// accumulated in f64. An empty slice is left alone; a slice of only `−∞` becomes NaN.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let exps: Vec<f64> = x
        .iter()
        .map(|&v| (f64::from(v) - f64::from(max)).exp())
        .collect();
    let sum: f64 = exps.iter().sum();
    for (y, e) in x.iter_mut().zip(exps) {
        *y = (e / sum) as f32;
    }
}

/// Scaled dot-product attention of one query token over the first `n_kv` cached positions:
/// `q: [n_heads, head_dim]`, `k_cache`, `v_cache: [≥ n_kv, n_kv_heads · head_dim]` →
/// `[n_heads, head_dim]`. Scores are scaled by `1/sqrt(head_dim)`; with grouped-query attention
/// query head `h` reads KV head `h / (n_heads / n_kv_heads)`. No mask is applied: causality is
/// the caller's, who passes only the positions up to and including the query's own.
///
/// # Panics
/// When the slices do not match the shapes, `n_kv` is 0, or `n_heads` is not a multiple of
/// `n_kv_heads` (programming errors in the caller).
pub fn attention(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    n_kv: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
) -> Vec<f32> {
    let kv_dim = n_kv_heads * head_dim;
    assert_eq!(q.len(), n_heads * head_dim, "q must be [n_heads, head_dim]");
    assert!(n_kv > 0, "attention needs at least one key");
    assert!(
        k_cache.len() >= n_kv * kv_dim && v_cache.len() >= n_kv * kv_dim,
        "the caches must hold n_kv positions of n_kv_heads · head_dim"
    );
    assert!(
        n_kv_heads > 0 && n_heads.is_multiple_of(n_kv_heads),
        "n_heads must be a multiple of n_kv_heads"
    );
    let group = n_heads / n_kv_heads;
    let scale = 1.0 / (head_dim as f64).sqrt();
    let mut out = vec![0.0f32; n_heads * head_dim];
    let mut scores = vec![0.0f64; n_kv];
    let mut acc = vec![0.0f64; head_dim];
    for (h, (qh, oh)) in q
        .chunks_exact(head_dim)
        .zip(out.chunks_exact_mut(head_dim))
        .enumerate()
    {
        let kv_off = (h / group) * head_dim;
        for (t, s) in scores.iter_mut().enumerate() {
            let k = &k_cache[t * kv_dim + kv_off..][..head_dim];
            *s = dot(qh, k) * scale;
        }
        // Softmax kept in f64 (unlike [`softmax`]) so the weights are not rounded to f32
        // before they multiply V.
        let max = scores.iter().fold(f64::NEG_INFINITY, |m, &s| m.max(s));
        let mut sum = 0.0;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        acc.fill(0.0);
        for (t, &p) in scores.iter().enumerate() {
            let v = &v_cache[t * kv_dim + kv_off..][..head_dim];
            for (a, &vv) in acc.iter_mut().zip(v) {
                *a += p * f64::from(vv);
            }
        }
        for (o, a) in oh.iter_mut().zip(&acc) {
            *o = (a / sum) as f32;
        }
    }
    out
}

/// SiLU (swish): `x · sigmoid(x)`, evaluated in f64.
pub fn silu(x: f32) -> f32 {
    let x = f64::from(x);
    (x / (1.0 + (-x).exp())) as f32
}

/// GELU with GPT-2's tanh approximation:
/// `0.5 · x · (1 + tanh(sqrt(2/π) · (x + 0.044715 · x³)))`, evaluated in f64.
pub fn gelu_tanh(x: f32) -> f32 {
    let x = f64::from(x);
    let k = (2.0 / std::f64::consts::PI).sqrt();
    (0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())) as f32
}

/// One row of an embedding table `table: [rows, width]` of any storage type, dequantized:
/// `[width]`. Only that row's bytes are read, so a large quantized table is never expanded.
///
/// Errors when `id` is not a row of the table, the table is not two-dimensional, its byte size
/// does not match its shape, or a row is not a whole number of quantization blocks.
pub fn embedding_row(table: &Tensor<'_>, id: u32) -> Result<Vec<f32>> {
    let &[rows, width] = table.shape.as_slice() else {
        return Err(Error::invalid(
            "table",
            format!(
                "an embedding table must be [rows, width], got shape {:?}",
                table.shape
            ),
        ));
    };
    let id = id as usize;
    if id >= rows {
        return Err(Error::invalid(
            "id",
            format!("token id {id} is outside the embedding table of {rows} rows"),
        ));
    }
    let row_bytes = usize::try_from(table.dtype.bytes_for(width as u64, "embedding row")?)
        .map_err(|_| Error::invalid("table", "row size does not fit in memory"))?;
    let bytes = id
        .checked_mul(row_bytes)
        .and_then(|start| table.data.get(start..start.checked_add(row_bytes)?))
        .ok_or_else(|| {
            Error::invalid(
                "table",
                format!(
                    "embedding table data ({} bytes) is too short for row {id} of {row_bytes} bytes",
                    table.data.len()
                ),
            )
        })?;
    dequantize(table.dtype, bytes, width as u64, "embedding row")
}

/// `Y = X·Wᵀ (+ bias)` for several tokens at once: `w: [rows, cols]`, `x: [n, cols]`,
/// `bias: [rows]` → `[n, rows]`, accumulated in f64.
///
/// Each weight row is read once for all `n` tokens (a prefill streams the weights once, not once
/// per token), and each output is the same f64 dot product whatever `n` is, so a prefill and a
/// token-by-token decode give identical bits. Natively the rows are split over threads when the
/// product is large enough to pay for them.
///
/// # Panics
/// When the slices do not match the shapes (a programming error in the caller).
pub fn matmul(w: &[f32], x: &[f32], bias: Option<&[f32]>, rows: usize, cols: usize) -> Vec<f32> {
    assert_eq!(w.len(), rows * cols, "w must be [rows, cols]");
    assert!(
        cols > 0 && x.len().is_multiple_of(cols),
        "x must be [n, cols]"
    );
    if let Some(b) = bias {
        assert_eq!(b.len(), rows, "bias must be [rows]");
    }
    let n = x.len() / cols;
    // Computed row-major by weight row (`[rows, n]`), the order the work is split in, then
    // transposed into the `[n, rows]` the caller wants.
    let by_row = |r0: usize, r1: usize| -> Vec<f32> {
        let mut out = Vec::with_capacity((r1 - r0) * n);
        for r in r0..r1 {
            let row = &w[r * cols..(r + 1) * cols];
            let b = bias.map_or(0.0, |b| f64::from(b[r]));
            out.extend(x.chunks_exact(cols).map(|xt| (dot(row, xt) + b) as f32));
        }
        out
    };
    let parts = split_rows(rows, rows * cols * n, &by_row);
    let mut y = vec![0.0f32; n * rows];
    let mut r = 0;
    for part in parts {
        for chunk in part.chunks_exact(n.max(1)) {
            for (t, &v) in chunk.iter().enumerate() {
                y[t * rows + r] = v;
            }
            r += 1;
        }
    }
    y
}

/// Multiply-adds below which one thread does the whole product: spawning costs tens of
/// microseconds, as much as a quarter of a million f64 multiply-adds.
#[cfg(not(target_arch = "wasm32"))]
const THREAD_MIN_WORK: usize = 1 << 18;

/// Runs `f(r0, r1)` over `0..rows` cut into contiguous ranges, one per thread, and returns the
/// results in row order.
#[cfg(not(target_arch = "wasm32"))]
fn split_rows<F>(rows: usize, work: usize, f: &F) -> Vec<Vec<f32>>
where
    F: Fn(usize, usize) -> Vec<f32> + Sync,
{
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let threads = *THREADS.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(16)
    });
    let threads = threads.min(work / THREAD_MIN_WORK).min(rows).max(1);
    if threads == 1 {
        return vec![f(0, rows)];
    }
    let per = rows.div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..rows)
            .step_by(per)
            .map(|r0| s.spawn(move || f(r0, (r0 + per).min(rows))))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// The browser's wasm32 has no threads here: one range, on the caller's thread.
#[cfg(target_arch = "wasm32")]
fn split_rows<F>(rows: usize, _work: usize, f: &F) -> Vec<Vec<f32>>
where
    F: Fn(usize, usize) -> Vec<f32>,
{
    vec![f(0, rows)]
}

// ---------------------------------------------------------------------------------------------
// The whole model
// ---------------------------------------------------------------------------------------------

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
        c.validate(&weights.file)?;
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
        let d = c.hidden_size;
        if c.arch == Architecture::Gpt2 && c.kv_dim() != d {
            // The fused QKV is `[3d, d]`: K and V are as wide as Q, so GPT-2 has no GQA.
            return Err(Error::format(
                &weights.file,
                format!(
                    "GPT-2 needs n_kv_heads = n_heads, got {} and {}",
                    c.n_kv_heads, c.n_heads
                ),
            ));
        }
        let mut blocks = Vec::with_capacity(c.n_layers);
        for i in 0..c.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}");
            let (wq, wk, wv, bq, bk, bv, bo, up_bias, down_bias) = match c.arch {
                Architecture::Llama => {
                    let bias = |s: &str| -> Result<Option<Vec<f32>>> {
                        if c.qkv_bias {
                            load(&n(s)).map(Some)
                        } else {
                            Ok(None)
                        }
                    };
                    (
                        load(&n("attn_q.weight"))?,
                        load(&n("attn_k.weight"))?,
                        load(&n("attn_v.weight"))?,
                        bias("attn_q.bias")?,
                        bias("attn_k.bias")?,
                        bias("attn_v.bias")?,
                        None,
                        None,
                        None,
                    )
                }
                Architecture::Gpt2 => {
                    // Fused `[3d, d]` rows and `[3d]` bias: q, then k, then v, each `d` wide
                    // (q_dim = d is checked by `validate`, kv_dim = d above).
                    let qkv = load(&n("attn_qkv.weight"))?;
                    let qkv_b = load(&n("attn_qkv.bias"))?;
                    let (m, b) = (d * d, d);
                    (
                        qkv[..m].to_vec(),
                        qkv[m..2 * m].to_vec(),
                        qkv[2 * m..].to_vec(),
                        Some(qkv_b[..b].to_vec()),
                        Some(qkv_b[b..2 * b].to_vec()),
                        Some(qkv_b[2 * b..].to_vec()),
                        Some(load(&n("attn_output.bias"))?),
                        Some(load(&n("ffn_up.bias"))?),
                        Some(load(&n("ffn_down.bias"))?),
                    )
                }
            };
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
                gate: match c.activation {
                    Activation::SwiGlu => Some(load(&n("ffn_gate.weight"))?),
                    Activation::GeluTanh => None,
                },
                up: load(&n("ffn_up.weight"))?,
                up_bias,
                down: load(&n("ffn_down.weight"))?,
                down_bias,
            });
        }
        Ok(ReferenceModel {
            token_embd: load("token_embd.weight")?,
            position_embd: match c.arch {
                Architecture::Gpt2 => Some(load("position_embd.weight")?),
                Architecture::Llama => None,
            },
            blocks,
            output_norm: norm("output_norm")?,
            output: if c.tied_embeddings {
                None
            } else {
                Some(load("output.weight")?)
            },
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

        // x: [n, d], the residual stream.
        let mut x = Vec::with_capacity(n * d);
        for (i, &t) in tokens.iter().enumerate() {
            let row = &self.token_embd[t as usize * d..][..d];
            match &self.position_embd {
                Some(p) => {
                    let prow = &p[(start + i) * d..][..d];
                    x.extend(row.iter().zip(prow).map(|(a, b)| a + b));
                }
                None => x.extend_from_slice(row),
            }
        }

        for (l, b) in self.blocks.iter().enumerate() {
            let h = b.attn_norm.apply(&x, c.norm_eps);
            let mut q = matmul(&b.wq, &h, b.bq.as_deref(), q_dim, d);
            let mut k = matmul(&b.wk, &h, b.bk.as_deref(), kv_dim, d);
            let v = matmul(&b.wv, &h, b.bv.as_deref(), kv_dim, d);
            for (i, (qi, ki)) in q
                .chunks_exact_mut(q_dim)
                .zip(k.chunks_exact_mut(kv_dim))
                .enumerate()
            {
                rope(qi, c.n_heads, hd, start + i, c.rope_theta, c.rope_layout);
                rope(ki, c.n_kv_heads, hd, start + i, c.rope_theta, c.rope_layout);
            }
            cache.k[l].extend_from_slice(&k);
            cache.v[l].extend_from_slice(&v);
            let mut att = Vec::with_capacity(n * q_dim);
            for (i, qi) in q.chunks_exact(q_dim).enumerate() {
                // Causal: token i sees the cached prefix and itself, nothing after.
                att.extend(attention(
                    qi,
                    &cache.k[l],
                    &cache.v[l],
                    start + i + 1,
                    c.n_heads,
                    c.n_kv_heads,
                    hd,
                ));
            }
            add_in_place(&mut x, &matmul(&b.wo, &att, b.bo.as_deref(), d, q_dim));

            let h = b.ffn_norm.apply(&x, c.norm_eps);
            let up = matmul(&b.up, &h, b.up_bias.as_deref(), ff, d);
            let act: Vec<f32> = match &b.gate {
                Some(gate) => {
                    let g = matmul(gate, &h, None, ff, d);
                    g.iter().zip(&up).map(|(&g, &u)| silu(g) * u).collect()
                }
                None => up.iter().map(|&u| gelu_tanh(u)).collect(),
            };
            add_in_place(
                &mut x,
                &matmul(&b.down, &act, b.down_bias.as_deref(), d, ff),
            );
        }
        cache.pos = end;

        let h = self.output_norm.apply(&x, c.norm_eps);
        let head = self.output.as_deref().unwrap_or(&self.token_embd);
        let logits = matmul(head, &h, None, c.vocab_size, d);
        Ok(logits
            .chunks_exact(c.vocab_size)
            .map(<[f32]>::to_vec)
            .collect())
    }
}

/// `x += y`, elementwise (the residual connections).
fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Dot product accumulated in f64. Eight independent partial sums, so the loop vectorizes and
/// does not serialise on one add chain.
fn dot(a: &[f32], b: &[f32]) -> f64 {
    let mut acc = [0.0f64; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f64 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += f64::from(x[i]) * f64::from(y[i]);
        }
    }
    acc.iter().sum::<f64>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::weights::DType;
    use std::borrow::Cow;

    fn close(a: f32, b: f64, tol: f64) -> bool {
        (f64::from(a) - b).abs() <= tol
    }

    #[test]
    fn matvec_small_exact() {
        let w = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let x = [1.0, 0.5, -1.0];
        assert_eq!(matvec(&w, &x, None, 2, 3), vec![-1.0, 0.5]);
        assert_eq!(matvec(&w, &x, Some(&[1.0, -1.0]), 2, 3), vec![0.0, -0.5]);
    }

    #[test]
    fn rms_norm_unit_rows() {
        // mean of squares of [3, 4] is 12.5
        let y = rms_norm(&[3.0, 4.0, 0.0, 0.0], &[1.0, 2.0], 2, 0.0);
        let s = 1.0 / 12.5f64.sqrt();
        assert!((f64::from(y[0]) - 3.0 * s).abs() < 1e-6);
        assert!((f64::from(y[1]) - 8.0 * s).abs() < 1e-6);
        // an all-zero row with eps = 0 divides 0 by 0: the reference says NaN, honestly
        assert!(y[2].is_nan());
    }

    #[test]
    fn layer_norm_centres_scales_and_shifts() {
        // [1, 2, 3, 4]: mean 2.5, population variance 1.25
        let x = [1.0, 2.0, 3.0, 4.0, 7.0, 7.0, 7.0, 7.0];
        let y = layer_norm(&x, &[1.0, 1.0, 2.0, 1.0], &[0.0, 0.0, 0.0, 10.0], 4, 0.0);
        let s = 1.0 / 1.25f64.sqrt();
        for (got, want) in y[..4]
            .iter()
            .zip([-1.5 * s, -0.5 * s, 1.0 * s, 1.5 * s + 10.0])
        {
            assert!(close(*got, want, 1e-6), "{got} vs {want}");
        }
        // a constant row is all bias once eps keeps the division finite
        let y = layer_norm(&x[4..], &[1.0; 4], &[0.5; 4], 4, 1e-5);
        assert!(y.iter().all(|&v| v == 0.5), "{y:?}");
    }

    #[test]
    fn rope_rotates_pairs_by_position() {
        // pair 0 has frequency 1: rotating (1, 0) by `pos` radians gives (cos pos, sin pos)
        let (heads, hd, pos) = (2, 4, 3);
        let mut x = vec![0.0f32; heads * hd];
        x[0] = 1.0;
        x[hd] = 1.0;
        rope(&mut x, heads, hd, pos, 10000.0, RopeLayout::Interleaved);
        for h in 0..heads {
            assert!(close(x[h * hd], 3f64.cos(), 1e-6));
            assert!(close(x[h * hd + 1], 3f64.sin(), 1e-6));
        }
        // rotate-half pairs (0, 2) instead; pair 1 has frequency 10000^(-1/2) = 0.01
        let mut y = vec![0.0, 1.0, 0.0, 0.0];
        rope(&mut y, 1, 4, pos, 10000.0, RopeLayout::RotateHalf);
        assert!(close(y[1], 0.03f64.cos(), 1e-6) && close(y[3], 0.03f64.sin(), 1e-6));
        assert_eq!((y[0], y[2]), (0.0, 0.0));
        // position 0 and RopeLayout::None change nothing
        let orig: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
        let mut z = orig.clone();
        rope(&mut z, 2, 4, 0, 10000.0, RopeLayout::RotateHalf);
        assert_eq!(z, orig);
        rope(&mut z, 2, 4, 17, 10000.0, RopeLayout::None);
        assert_eq!(z, orig);
    }

    #[test]
    fn rope_layouts_agree_under_the_gguf_permutation() {
        // GGUF stores dimension j·hd/2 + i of a head at 2i + j: interleaved RoPE on the permuted
        // vector must equal rotate-half RoPE on the original, permuted the same way.
        let (heads, hd) = (3, 8);
        let orig: Vec<f32> = (0..heads * hd)
            .map(|i| ((i * 7) % 11) as f32 - 5.0)
            .collect();
        let perm = |v: &[f32]| {
            let mut out = vec![0.0; v.len()];
            for h in 0..heads {
                for i in 0..hd / 2 {
                    for j in 0..2 {
                        out[h * hd + 2 * i + j] = v[h * hd + j * hd / 2 + i];
                    }
                }
            }
            out
        };
        let mut half = orig.clone();
        rope(&mut half, heads, hd, 41, 500.0, RopeLayout::RotateHalf);
        let mut inter = perm(&orig);
        rope(&mut inter, heads, hd, 41, 500.0, RopeLayout::Interleaved);
        assert_eq!(perm(&half), inter);
    }

    #[test]
    fn softmax_is_stable_and_normalised() {
        let mut x = [1.0, 2.0, 3.0];
        softmax(&mut x);
        let e: Vec<f64> = [1.0f64, 2.0, 3.0].iter().map(|v| v.exp()).collect();
        let s: f64 = e.iter().sum();
        for (got, want) in x.iter().zip(&e) {
            assert!(close(*got, want / s, 1e-7));
        }
        let mut big = [1000.0, 1000.0, f32::NEG_INFINITY];
        softmax(&mut big);
        assert_eq!(big, [0.5, 0.5, 0.0]);
        softmax(&mut []);
    }

    #[test]
    fn activations_match_closed_forms() {
        assert_eq!(silu(0.0), 0.0);
        assert!(close(silu(1.0), 1.0 / (1.0 + (-1f64).exp()), 1e-7));
        assert!(close(silu(-30.0), -30.0 * (-30f64).exp(), 1e-15));
        assert_eq!(gelu_tanh(0.0), 0.0);
        // 0.5·(1 + tanh(sqrt(2/π)·1.044715))
        assert!(close(gelu_tanh(1.0), 0.841_191_990_608_276_8, 1e-7));
        assert!(close(gelu_tanh(-1.0), -0.158_808_009_391_723_2, 1e-7));
        assert_eq!(gelu_tanh(20.0), 20.0);
    }

    #[test]
    fn attention_matches_a_direct_computation_with_gqa() {
        let (n_heads, n_kv_heads, hd, n_kv) = (4, 2, 2, 3);
        let kv_dim = n_kv_heads * hd;
        let q: Vec<f32> = (0..n_heads * hd).map(|i| (i as f32 * 0.37).sin()).collect();
        let k: Vec<f32> = (0..(n_kv + 1) * kv_dim)
            .map(|i| (i as f32 * 0.91).cos())
            .collect();
        let v: Vec<f32> = (0..(n_kv + 1) * kv_dim)
            .map(|i| i as f32 * 0.1 - 0.5)
            .collect();
        // the extra cached position (a "future" token) must be ignored
        let out = attention(&q, &k, &v, n_kv, n_heads, n_kv_heads, hd);
        for h in 0..n_heads {
            let g = h / 2;
            let s: Vec<f64> = (0..n_kv)
                .map(|t| {
                    (0..hd)
                        .map(|d| f64::from(q[h * hd + d]) * f64::from(k[t * kv_dim + g * hd + d]))
                        .sum::<f64>()
                        / (hd as f64).sqrt()
                })
                .collect();
            let z: f64 = s.iter().map(|v| v.exp()).sum();
            for d in 0..hd {
                let want: f64 = (0..n_kv)
                    .map(|t| s[t].exp() / z * f64::from(v[t * kv_dim + g * hd + d]))
                    .sum();
                assert!(close(out[h * hd + d], want, 1e-6), "head {h} dim {d}");
            }
        }
        // one position: the output is that position's value row, whatever the scores
        let one = attention(&q, &k, &v, 1, n_heads, n_kv_heads, hd);
        assert_eq!(one, [&v[0..2], &v[0..2], &v[2..4], &v[2..4]].concat());
    }

    #[test]
    fn embedding_row_dequantizes_one_row_of_any_type() {
        // Q8_0, two rows of 32: f16 scale then 32 signed bytes per block
        let mut data = Vec::new();
        for (scale, base) in [(0.5f32, 0i8), (0.25, -16)] {
            data.extend(half::f16::from_f32(scale).to_le_bytes());
            data.extend((0..32).map(|i| (base + i as i8) as u8));
        }
        let table = Tensor {
            shape: vec![2, 32],
            dtype: DType::Q8_0,
            data: Cow::Owned(data),
        };
        let row = embedding_row(&table, 1).unwrap();
        let want: Vec<f32> = (0..32).map(|i| 0.25 * (i as f32 - 16.0)).collect();
        assert_eq!(row, want);
        let all = dequantize(table.dtype, &table.data, 64, "t").unwrap();
        assert_eq!(embedding_row(&table, 0).unwrap(), all[..32]);

        let f = Tensor {
            shape: vec![3, 2],
            dtype: DType::F32,
            data: Cow::Owned(
                [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            ),
        };
        assert_eq!(embedding_row(&f, 2).unwrap(), vec![5.0, 6.0]);
        let err = embedding_row(&f, 3).unwrap_err().to_string();
        assert!(err.contains("token id 3"), "{err}");
        let short = Tensor {
            data: Cow::Owned(vec![0; 20]),
            ..f.clone()
        };
        assert!(embedding_row(&short, 2).is_err());
        let flat = Tensor {
            shape: vec![6],
            ..f
        };
        assert!(embedding_row(&flat, 0).is_err());
    }

    #[test]
    fn matmul_matches_matvec_per_token_single_and_threaded() {
        // 300·100·10 multiply-adds is above THREAD_MIN_WORK, so this also runs split over
        // threads where the machine has more than one core; n = 1 stays on one thread.
        let (rows, cols) = (300, 100);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37) % 101) as f32 * 0.01 - 0.5)
            .collect();
        let bias: Vec<f32> = (0..rows).map(|r| r as f32 * 0.001).collect();
        for n in [1, 10] {
            let x: Vec<f32> = (0..n * cols)
                .map(|i| ((i * 13) % 29) as f32 * 0.1 - 1.4)
                .collect();
            let y = matmul(&w, &x, Some(&bias), rows, cols);
            assert_eq!(y.len(), n * rows);
            for t in 0..n {
                let want = matvec(&w, &x[t * cols..(t + 1) * cols], Some(&bias), rows, cols);
                for (a, b) in y[t * rows..(t + 1) * rows].iter().zip(&want) {
                    assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
                }
            }
            // a token's outputs do not depend on which other tokens share the call
            assert_eq!(matmul(&w, &x[..cols], Some(&bias), rows, cols), y[..rows]);
        }
    }

    #[test]
    fn dot_handles_every_length() {
        for n in [0, 1, 7, 8, 9, 33] {
            let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
            let b = vec![2.0f32; n];
            assert_eq!(dot(&a, &b), (n * n.saturating_sub(1)) as f64);
        }
    }
}
