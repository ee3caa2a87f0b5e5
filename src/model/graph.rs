//! The forward pass as data: a list of operations over the step's activation buffers and the
//! model's weights, built once per model by its architecture's file (`llama.rs`,
//! `gpt2.rs`) and compiled by a backend into what it runs. Nothing here knows which
//! backend runs it.
//!
//! Weights are named by the tensors the backend holds (GGUF names, or the stacked tensors
//! [`super::fuse`] builds); the architecture files look each one up once, check its shape, and
//! hand out typed structs, so a missing or misshapen tensor fails at load with its name.

use crate::config::{ModelConfig, NormKind};
use crate::error::{Error, Result};

/// One of the step's activation buffers (f32 unless noted). `chunk` is the most tokens a step
/// holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    /// Token ids, `[chunk]` u32.
    Ids,
    /// Residual stream, `[chunk, d]`.
    X,
    /// Queries, `[chunk, q_dim]`, or stacked `[chunk, q_dim + 2·kv_dim]` (`q | k | v`).
    Q,
    /// Keys of the step before they enter the cache, `[chunk, kv_dim]`.
    K,
    /// Values of the step before they enter the cache, `[chunk, kv_dim]`.
    V,
    /// Attention output, `[chunk, q_dim]`.
    Attn,
    /// Feed-forward gate projection, `[chunk, ffn]`.
    Gate,
    /// Feed-forward up projection, `[chunk, ffn]`.
    Up,
    /// The feed-forward's hidden activations, `[chunk, ffn]`.
    Hidden,
    /// Logits, `[chunk, vocab]`.
    Logits,
    /// A sub-layer's output before its norm joins the residual (Gemma), `[chunk, d]`.
    Branch,
}

/// A weight matrix `[out, in]` and its bias `[out]`, by tensor name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Matrix {
    /// The matrix's tensor.
    pub weight: String,
    /// The bias's tensor, when the model has one.
    pub bias: Option<String>,
}

/// A normalisation folded into the linear that reads its output: weight `[d]`, and for
/// LayerNorm a bias `[d]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Norm {
    /// RMSNorm or LayerNorm.
    pub kind: NormKind,
    /// Scale, `[d]`.
    pub weight: String,
    /// Shift, `[d]` (LayerNorm only).
    pub bias: Option<String>,
}

/// What a linear computes after its product.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Post {
    /// `y = W·x (+ bias)`.
    #[default]
    None,
    /// Rows are interleaved (gate, up) pairs: `y = silu(gate) · up`, `[tokens, rows / 2]`.
    SwiGlu,
    /// `y = gelu_tanh(W·x + bias)`.
    Gelu,
    /// `y = gelu(W·x + bias)` with the exact GELU, `x · Φ(x)` (BERT).
    GeluErf,
    /// As [`Post::SwiGlu`] with `gelu_tanh` for `silu` (Gemma's GeGLU).
    GeGlu,
}

/// `y (+)= post(W · norm(x) + bias)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinearOp {
    /// The weights.
    pub matrix: Matrix,
    /// Input, `[tokens, in]`.
    pub x: Act,
    /// Output, `[tokens, out]` (`[tokens, out / 2]` for [`Post::SwiGlu`]).
    pub y: Act,
    /// Normalisation of `x` on the way in.
    pub norm: Option<Norm>,
    /// Adds into `y` (a residual connection) instead of overwriting it.
    pub accumulate: bool,
    /// After the product.
    pub post: Post,
    /// The stacked `q | k | v` projection of this layer: rotates Q and K (when the model uses
    /// RoPE) and writes K and V into the layer's cache.
    pub kv_layer: Option<usize>,
}

impl LinearOp {
    /// The plain layer `y = W·x + b` (no norm, no residual, nothing after).
    pub fn new(matrix: Matrix, x: Act, y: Act) -> Self {
        Self {
            matrix,
            x,
            y,
            norm: None,
            accumulate: false,
            post: Post::None,
            kv_layer: None,
        }
    }

    /// With `norm` applied to the input.
    pub fn normed(mut self, norm: &Norm) -> Self {
        self.norm = Some(norm.clone());
        self
    }

    /// Adding into the output (a residual connection).
    pub fn residual(mut self) -> Self {
        self.accumulate = true;
        self
    }

    /// With `post` after the product.
    pub fn then(mut self, post: Post) -> Self {
        self.post = post;
        self
    }
}

/// Where an embedding's row index comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows {
    /// The step's token ids ([`Act::Ids`]).
    Tokens,
    /// The tokens' positions in the sequence.
    Positions,
    /// Row 0 for every token (BERT's token-type embedding: every token is of the first
    /// segment).
    First,
}

/// What an embedding's rows are multiplied by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EmbedScale {
    /// The rows as stored.
    #[default]
    One,
    /// √d, d the model width (Gemma).
    SqrtDim,
}

/// One operation of the graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `X (+)= table[rows]`, `table: [rows, d]`.
    Embed {
        /// The table's tensor.
        table: String,
        /// Which row each token reads.
        rows: Rows,
        /// Adds into [`Act::X`] instead of overwriting it.
        accumulate: bool,
        /// What every row is multiplied by.
        scale: EmbedScale,
    },
    /// A linear layer.
    Linear(LinearOp),
    /// RoPE on [`Act::Q`] and [`Act::K`] in place (when the model uses it) and the write of
    /// K and V ([`Act::K`], [`Act::V`]) into `layer`'s cache, for separate projections.
    RopeKvWrite {
        /// The layer whose cache is written.
        layer: usize,
    },
    /// Attention of the step's queries over `layer`'s cache into [`Act::Attn`]: causal, or
    /// over every position of the text where the model is bidirectional
    /// ([`ModelConfig::bidirectional`]).
    Attention {
        /// The layer whose cache is read.
        layer: usize,
        /// Whether [`Act::Q`] holds the stacked `q | k | v` rows or the queries alone.
        stacked: bool,
    },
    /// `Hidden = silu(Gate) · Up`.
    SwiGlu,
    /// `Hidden = gelu_tanh(Gate) · Up`.
    GeGlu,
    /// RMSNorm of every head of `act` in place (QK-norm): each token's `heads` rows of
    /// `head_dim` values, gain `[head_dim]`.
    HeadNorm {
        /// [`Act::Q`] (`n_heads` heads) or [`Act::K`] (`n_kv_heads`).
        act: Act,
        /// The gain's tensor, `[head_dim]`.
        weight: String,
    },
    /// `X += rms_norm(Branch) · weight`: a sub-layer's output normalised before it joins the
    /// residual (Gemma's post-norms), gain `[d]`.
    AddNormed {
        /// The gain's tensor, `[d]`.
        weight: String,
    },
    /// `X = norm(X)` in place, `[tokens, d]`: a norm after the residual joins (BERT's
    /// post-norms, and its embedding norm).
    Norm(Norm),
}

/// A model's forward pass: the per-layer operations, then the head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Graph {
    /// Operations in order, from the embedding to the last layer's residual.
    pub ops: Vec<Op>,
    /// The final norm and LM head, `X → Logits`; the backend runs it for the rows a step
    /// reads back. `None` for an encoder (BERT), which has no LM head: its final hidden
    /// states are [`Act::X`] after the last operation, and it embeds text but cannot
    /// generate.
    pub head: Option<LinearOp>,
}

impl Graph {
    /// The LM head, or an error saying that this model (an encoder) has none: it embeds text
    /// but does not generate.
    pub fn lm_head(&self, config: &ModelConfig) -> Result<&LinearOp> {
        self.head.as_ref().ok_or_else(|| no_lm_head(config))
    }

    /// Whether some operation reads or writes [`Act::Branch`] (a sub-layer's output kept
    /// apart from the residual), so that a backend allocates it only when it is used.
    pub fn uses_branch(&self) -> bool {
        self.ops.iter().any(|op| match op {
            Op::AddNormed { .. } => true,
            Op::Linear(l) => l.x == Act::Branch || l.y == Act::Branch,
            _ => false,
        })
    }
}

/// The error for a step that asks an encoder's logits: it has no LM head.
pub fn no_lm_head(config: &ModelConfig) -> Error {
    Error::invalid(
        "model",
        format!(
            "this {} model is an encoder with no LM head: it embeds text (embed, \
             /v1/embeddings) but does not generate",
            config.arch.name()
        ),
    )
}

/// Name of layer `layer`'s stacked `[q | k | v]` matrix (and, with `.bias`, its bias), as
/// the loader fuses it ([`crate::model::fuse`]).
pub fn qkv_name(layer: usize, suffix: &str) -> String {
    format!("blk.{layer}.attn_qkv.{suffix}")
}

/// Name of layer `layer`'s interleaved `[gate₀, up₀, gate₁, up₁, …]` matrix (and bias).
pub fn gate_up_name(layer: usize, suffix: &str) -> String {
    format!("blk.{layer}.ffn_gate_up.{suffix}")
}

/// The tensors a backend holds, as the architecture files see them.
pub trait WeightIndex {
    /// The shape of `name` (outermost first), or `None` when there is no such tensor.
    fn shape(&self, name: &str) -> Option<&[usize]>;
}

/// Looks tensors up for an architecture file, checking shapes, with errors that name them.
pub struct Lookup<'w> {
    index: &'w dyn WeightIndex,
    file: &'w str,
}

impl<'w> Lookup<'w> {
    /// Lookups into `index`, naming `file` in errors.
    pub fn new(index: &'w dyn WeightIndex, file: &'w str) -> Self {
        Self { index, file }
    }

    /// Whether `name` exists.
    pub fn has(&self, name: &str) -> bool {
        self.index.shape(name).is_some()
    }

    /// `name`, which must have `shape`.
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<String> {
        match self.index.shape(name) {
            None => Err(Error::format(self.file, format!("missing tensor `{name}`"))),
            Some(s) if s != shape => Err(Error::format(
                self.file,
                format!("tensor `{name}` has shape {s:?}, expected {shape:?}"),
            )),
            Some(_) => Ok(name.to_string()),
        }
    }

    /// `{prefix}.weight` of shape `[out, inp]`, and `{prefix}.bias` (`[out]`) when present.
    pub fn matrix(&self, prefix: &str, out: usize, inp: usize) -> Result<Matrix> {
        self.matrix_named(
            &format!("{prefix}.weight"),
            &format!("{prefix}.bias"),
            out,
            inp,
        )
    }

    /// `weight` of shape `[out, inp]`, and `bias` (`[out]`) when present.
    pub fn matrix_named(&self, weight: &str, bias: &str, out: usize, inp: usize) -> Result<Matrix> {
        let weight = self.tensor(weight, &[out, inp])?;
        let bias = match self.has(bias) {
            true => Some(self.tensor(bias, &[out])?),
            false => None,
        };
        Ok(Matrix { weight, bias })
    }

    /// The norm `{prefix}` of width `d` in `config`'s kind (LayerNorm has a bias).
    pub fn norm(&self, config: &ModelConfig, prefix: &str, d: usize) -> Result<Norm> {
        let weight = self.tensor(&format!("{prefix}.weight"), &[d])?;
        let bias = match config.norm {
            NormKind::RmsNorm => None,
            NormKind::LayerNorm => Some(self.tensor(&format!("{prefix}.bias"), &[d])?),
        };
        Ok(Norm {
            kind: config.norm,
            weight,
            bias,
        })
    }
}

/// The final norm and LM head shared by the architectures: `output_norm`, then `output.weight`
/// (or the token embedding when tied) with `output.bias` when present, `X → Logits`.
pub fn head(config: &ModelConfig, w: &Lookup<'_>) -> Result<Option<LinearOp>> {
    let (d, vocab) = (config.hidden_size, config.vocab_size);
    let weight = match config.tied_embeddings {
        true => "token_embd.weight",
        false => "output.weight",
    };
    // The head's bias, if any, is `output.bias` even when the matrix is tied.
    let matrix = w.matrix_named(weight, "output.bias", vocab, d)?;
    let norm = w.norm(config, "output_norm", d)?;
    Ok(Some(
        LinearOp::new(matrix, Act::X, Act::Logits).normed(&norm),
    ))
}
