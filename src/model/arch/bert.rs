//! BERT, the encoder behind most small sentence-embedding models (all-MiniLM, BGE, E5, GTE):
//! bidirectional attention (every token reads every position of its text), learned position
//! and token-type embeddings with a LayerNorm, post-norm blocks (each sub-layer's residual sum
//! is normalised) with biases everywhere, the exact (`erf`) GELU, and no LM head: it embeds
//! text and does not generate.

use super::hf::{self, required, unsupported, HfConfig};
use super::{ArchSpec, Fusion, GgufName, TensorVisitor, Window};
use crate::config::{
    Activation, Architecture, ModelConfig, NormKind, Pooling, RopeLayout, RopeScaling,
};
use crate::error::{Error, Result};
use crate::model::graph::{
    qkv_name, Act, EmbedScale, Graph, LinearOp, Lookup, Matrix, Norm, Op, Post, Rows,
};

/// BERT: a bidirectional encoder with post-norm LayerNorm blocks and an `erf` GELU.
pub const ARCH: Architecture = Architecture::named("bert");

/// Rows of the token-type table (`type_vocab_size`): BERT's two segments; only the first is
/// read (every text is one segment).
pub const TOKEN_TYPES: usize = 2;

/// BERT.
pub static SPEC: ArchSpec = ArchSpec {
    arch: ARCH,
    gguf_names: &[GgufName {
        name: "bert",
        rope_layout: RopeLayout::None,
        qkv_bias: true,
        qk_norm: false,
    }],
    norm: NormKind::LayerNorm,
    gguf_eps_key: "attention.layer_norm_epsilon",
    activation: Activation::GeluErf,
    window: Window::CapsContext,
    embedding_scale: EmbedScale::One,
    bidirectional: true,
    // sentence-transformers' BERT models pool by mean, and llama.cpp's converter writes
    // `pooling_type` from their pooling config where a file has one
    pooling: Some(Pooling::Mean),
    // no gate; Q, K and V stack into one projection with its bias
    fusion: Fusion {
        qkv: true,
        gate_up: false,
    },
    splits_stacked: false,
    hf_model_types: &["bert"],
    hf_config,
    hf_tensor,
    hf_fix: |_, _| None,
    check,
    tensors,
    build,
};

/// Q, K and V are each `d` wide: no grouped-query attention, heads exactly cover the width.
fn check(c: &ModelConfig) -> Option<String> {
    if c.q_dim() != c.hidden_size || c.n_kv_heads != c.n_heads {
        return Some(format!(
            "BERT needs n_kv_heads = n_heads and n_heads · head_dim = hidden_size, got {} KV \
             heads, {} heads of {} for a width of {}",
            c.n_kv_heads, c.n_heads, c.head_dim, c.hidden_size
        ));
    }
    None
}

/// BERT's `config.json`: absolute positions, two token types, the exact GELU, an encoder.
fn hf_config(raw: &HfConfig, file: &str) -> Result<ModelConfig> {
    let act = raw.hidden_act.as_deref().unwrap_or("gelu");
    if act != "gelu" {
        return Err(unsupported(
            file,
            format!("hidden_act `{act}` (BERT runs with the exact GELU, `gelu`)"),
        ));
    }
    if let Some(kind) = raw.position_embedding_type.as_deref() {
        if kind != "absolute" {
            return Err(unsupported(
                file,
                format!("position_embedding_type `{kind}` (only `absolute`)"),
            ));
        }
    }
    if raw.is_decoder == Some(true) {
        return Err(unsupported(
            file,
            "a BERT decoder (`is_decoder`: true); BERT runs as an encoder".into(),
        ));
    }
    let types = raw.type_vocab_size.unwrap_or(TOKEN_TYPES);
    if types != TOKEN_TYPES {
        return Err(unsupported(
            file,
            format!("type_vocab_size {types} (BERT's {TOKEN_TYPES} token types)"),
        ));
    }
    let d = required(raw.hidden_size, "hidden_size", file)?;
    let heads = required(raw.num_attention_heads, "num_attention_heads", file)?;
    if heads == 0 {
        return Err(Error::format(file, "num_attention_heads is 0"));
    }
    Ok(ModelConfig {
        arch: ARCH,
        vocab_size: required(raw.vocab_size, "vocab_size", file)?,
        hidden_size: d,
        n_layers: required(raw.num_hidden_layers, "num_hidden_layers", file)?,
        n_heads: heads,
        n_kv_heads: heads,
        head_dim: d.checked_div(heads).unwrap_or(0),
        ffn_size: required(raw.intermediate_size, "intermediate_size", file)?,
        context_length: required(raw.max_position_embeddings, "max_position_embeddings", file)?,
        norm: NormKind::LayerNorm,
        norm_eps: raw.layer_norm_eps.unwrap_or(1e-12),
        rope_theta: 0.0,
        rope_layout: RopeLayout::None,
        rope_scaling: RopeScaling::None,
        activation: Activation::GeluErf,
        tied_embeddings: true,
        qkv_bias: true,
        qk_norm: false,
        bos_id: None,
        eos_ids: Vec::new(),
        local_attention: None,
        bidirectional: true,
        pooling: SPEC.pooling,
    })
}

/// BERT's Hugging Face tensor names (`bert.` optional); the pooler, the position-id buffer
/// and any pre-training heads are not read.
fn hf_tensor(hf_name: &str) -> Option<String> {
    let n = hf_name.strip_prefix("bert.").unwrap_or(hf_name);
    let whole = match n {
        "embeddings.word_embeddings.weight" => Some("token_embd.weight"),
        "embeddings.position_embeddings.weight" => Some("position_embd.weight"),
        "embeddings.token_type_embeddings.weight" => Some("token_types.weight"),
        "embeddings.LayerNorm.weight" => Some("token_embd_norm.weight"),
        "embeddings.LayerNorm.bias" => Some("token_embd_norm.bias"),
        _ => None,
    };
    if let Some(name) = whole {
        return Some(name.into());
    }
    let (layer, rest) = hf::split_layer(n.strip_prefix("encoder.layer.")?)?;
    let (module, suffix) = rest.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    let gguf = match module {
        "attention.self.query" => "attn_q",
        "attention.self.key" => "attn_k",
        "attention.self.value" => "attn_v",
        "attention.output.dense" => "attn_output",
        "attention.output.LayerNorm" => "attn_output_norm",
        "intermediate.dense" => "ffn_up",
        "output.dense" => "ffn_down",
        "output.LayerNorm" => "layer_output_norm",
        _ => return None,
    };
    Some(format!("blk.{layer}.{gguf}.{suffix}"))
}

/// The embeddings and their norm; per layer Q, K, V, the output projection, up and down with
/// their biases, and the two post-norms. No head.
fn tensors(c: &ModelConfig, f: TensorVisitor<'_>) -> Result<()> {
    let (d, ff) = (c.hidden_size, c.ffn_size);
    f("token_embd.weight".into(), vec![c.vocab_size, d])?;
    f("position_embd.weight".into(), vec![c.context_length, d])?;
    f("token_types.weight".into(), vec![TOKEN_TYPES, d])?;
    f("token_embd_norm.weight".into(), vec![d])?;
    f("token_embd_norm.bias".into(), vec![d])?;
    for i in 0..c.n_layers {
        let b = |s: &str| format!("blk.{i}.{s}");
        for m in ["attn_q", "attn_k", "attn_v", "attn_output"] {
            f(b(&format!("{m}.weight")), vec![d, d])?;
            f(b(&format!("{m}.bias")), vec![d])?;
        }
        f(b("attn_output_norm.weight"), vec![d])?;
        f(b("attn_output_norm.bias"), vec![d])?;
        f(b("ffn_up.weight"), vec![ff, d])?;
        f(b("ffn_up.bias"), vec![ff])?;
        f(b("ffn_down.weight"), vec![d, ff])?;
        f(b("ffn_down.bias"), vec![d])?;
        f(b("layer_output_norm.weight"), vec![d])?;
        f(b("layer_output_norm.bias"), vec![d])?;
    }
    Ok(())
}

/// Q, K and V: stacked by the loader ([`crate::model::fuse`]) or separate.
#[derive(Debug)]
enum Qkv {
    /// `[3·d, d]`, bias `[3·d]`.
    Stacked(Matrix),
    /// `[d, d]` each, with biases.
    Separate { q: Matrix, k: Matrix, v: Matrix },
}

/// One block's weights.
#[derive(Debug)]
struct Block {
    qkv: Qkv,
    /// `[d, d]`, bias `[d]`.
    attn_output: Matrix,
    /// After attention's residual sum, `[d]` with bias.
    attn_output_norm: Norm,
    /// `[ffn, d]`, bias `[ffn]`.
    ffn_up: Matrix,
    /// `[d, ffn]`, bias `[d]`.
    ffn_down: Matrix,
    /// After the feed-forward's residual sum, `[d]` with bias.
    layer_output_norm: Norm,
}

impl Block {
    /// Layer `layer`'s weights, shapes checked.
    fn find(c: &ModelConfig, w: &Lookup<'_>, layer: usize) -> Result<Self> {
        let b = |s: &str| format!("blk.{layer}.{s}");
        let (d, ff) = (c.hidden_size, c.ffn_size);
        let qkv = match w.has(&qkv_name(layer, "weight")) {
            true => Qkv::Stacked(w.matrix(&b("attn_qkv"), 3 * d, d)?),
            false => Qkv::Separate {
                q: w.matrix(&b("attn_q"), d, d)?,
                k: w.matrix(&b("attn_k"), d, d)?,
                v: w.matrix(&b("attn_v"), d, d)?,
            },
        };
        Ok(Self {
            qkv,
            attn_output: w.matrix(&b("attn_output"), d, d)?,
            attn_output_norm: w.norm(c, &b("attn_output_norm"), d)?,
            ffn_up: w.matrix(&b("ffn_up"), ff, d)?,
            ffn_down: w.matrix(&b("ffn_down"), d, ff)?,
            layer_output_norm: w.norm(c, &b("layer_output_norm"), d)?,
        })
    }

    /// The block's operations, residual stream in [`Act::X`]:
    /// `X = norm₁(X + out(attn(X)))`, `X = norm₂(X + down(gelu(up(X))))`.
    fn ops(self, layer: usize, ops: &mut Vec<Op>) {
        let stacked = match self.qkv {
            Qkv::Stacked(m) => {
                let mut qkv = LinearOp::new(m, Act::X, Act::Q);
                qkv.kv_layer = Some(layer);
                ops.push(Op::Linear(qkv));
                true
            }
            Qkv::Separate { q, k, v } => {
                for (m, y) in [(q, Act::Q), (k, Act::K), (v, Act::V)] {
                    ops.push(Op::Linear(LinearOp::new(m, Act::X, y)));
                }
                ops.push(Op::RopeKvWrite { layer });
                false
            }
        };
        ops.push(Op::Attention { layer, stacked });
        ops.push(Op::Linear(
            LinearOp::new(self.attn_output, Act::Attn, Act::X).residual(),
        ));
        ops.push(Op::Norm(self.attn_output_norm));
        ops.push(Op::Linear(
            LinearOp::new(self.ffn_up, Act::X, Act::Hidden).then(Post::GeluErf),
        ));
        ops.push(Op::Linear(
            LinearOp::new(self.ffn_down, Act::Hidden, Act::X).residual(),
        ));
        ops.push(Op::Norm(self.layer_output_norm));
    }
}

/// The graph of a BERT encoder: no head (its states after the last block are what it gives).
fn build(c: &ModelConfig, w: &Lookup<'_>) -> Result<Graph> {
    let d = c.hidden_size;
    let embed = |table: String, rows: Rows, accumulate: bool| Op::Embed {
        table,
        rows,
        accumulate,
        scale: SPEC.embedding_scale,
    };
    let mut ops = vec![
        embed(
            w.tensor("token_embd.weight", &[c.vocab_size, d])?,
            Rows::Tokens,
            false,
        ),
        embed(
            w.tensor("position_embd.weight", &[c.context_length, d])?,
            Rows::Positions,
            true,
        ),
        embed(
            w.tensor("token_types.weight", &[TOKEN_TYPES, d])?,
            Rows::First,
            true,
        ),
        Op::Norm(w.norm(c, "token_embd_norm", d)?),
    ];
    for layer in 0..c.n_layers {
        Block::find(c, w, layer)?.ops(layer, &mut ops);
    }
    Ok(Graph { ops, head: None })
}
