//! The Llama family (Llama 2/3, SmolLM2, TinyLlama, Mistral, Qwen2, Qwen3, Phi-3): pre-norm
//! blocks with RMSNorm, RoPE attention with grouped K/V heads (Qwen2 with Q/K/V biases, Qwen3
//! normalising each query and key head first), and a SwiGLU feed-forward.

use super::hf::{self, required, rope_scaling_of, unsupported, HfConfig};
use super::{ArchSpec, Fusion, GgufName, TensorVisitor, Window};
use crate::config::{Activation, Architecture, ModelConfig, NormKind, RopeLayout};
use crate::error::{Error, Result};
use crate::model::graph::{
    gate_up_name, qkv_name, Act, EmbedScale, Graph, LinearOp, Lookup, Matrix, Norm, Op, Post, Rows,
};

/// Llama 2/3, SmolLM/SmolLM2, TinyLlama, Mistral, Qwen2 (with q/k/v biases), Qwen3 (with
/// QK-norm): RMSNorm, RoPE, grouped-query attention, SwiGLU feed-forward.
pub const ARCH: Architecture = Architecture::named("llama");

/// The Llama family.
pub static SPEC: ArchSpec = ArchSpec {
    arch: ARCH,
    gguf_names: &[
        // llama.cpp's converter permutes llama's Q/K rows for interleaved-pair RoPE ...
        gguf("llama", RopeLayout::Interleaved, false, false),
        // ... but not Qwen2's, which keeps the rotate-half pairing (and has q/k/v biases)
        gguf("qwen2", RopeLayout::RotateHalf, true, false),
        // Qwen3: Qwen2 without the biases, with QK-norm
        gguf("qwen3", RopeLayout::RotateHalf, false, true),
        // Phi-3: fused qkv and gate|up matrices (split on load), rotate-half RoPE, unpermuted
        gguf("phi3", RopeLayout::RotateHalf, false, false),
    ],
    norm: NormKind::RmsNorm,
    gguf_eps_key: "attention.layer_norm_rms_epsilon",
    activation: Activation::SwiGlu,
    window: Window::CapsContext,
    embedding_scale: EmbedScale::One,
    bidirectional: false,
    pooling: None,
    fusion: Fusion {
        qkv: true,
        gate_up: true,
    },
    splits_stacked: true,
    hf_model_types: &["llama", "mistral", "qwen2", "qwen3", "phi3"],
    hf_config,
    hf_tensor,
    hf_fix: |_, _| None,
    check: |_| None,
    tensors: |c, f| gated_tensors(c, false, f),
    build,
};

/// A GGUF name of the family.
const fn gguf(
    name: &'static str,
    rope_layout: RopeLayout,
    qkv_bias: bool,
    qk_norm: bool,
) -> GgufName {
    GgufName {
        name,
        rope_layout,
        qkv_bias,
        qk_norm,
    }
}

/// The family's `config.json`: SiLU only; Qwen2 always has Q/K/V biases, others when
/// `attention_bias` says so; Qwen3 has QK-norm; a sliding window caps the context.
fn hf_config(raw: &HfConfig, file: &str) -> Result<ModelConfig> {
    let model_type = raw.model_type.as_deref().unwrap_or("llama");
    let rope_scaling = rope_scaling_of(raw, file)?;
    let act = raw.hidden_act.as_deref().unwrap_or("silu");
    if act != "silu" {
        return Err(unsupported(
            file,
            format!("hidden_act `{act}` (only `silu`)"),
        ));
    }
    let hidden = required(raw.hidden_size, "hidden_size", file)?;
    let heads = required(raw.num_attention_heads, "num_attention_heads", file)?;
    if heads == 0 {
        return Err(Error::format(file, "num_attention_heads is 0"));
    }
    Ok(ModelConfig {
        arch: ARCH,
        vocab_size: required(raw.vocab_size, "vocab_size", file)?,
        hidden_size: hidden,
        n_layers: required(raw.num_hidden_layers, "num_hidden_layers", file)?,
        n_heads: heads,
        n_kv_heads: raw.num_key_value_heads.unwrap_or(heads),
        head_dim: raw
            .head_dim
            .unwrap_or(hidden.checked_div(heads).unwrap_or(0)),
        ffn_size: required(raw.intermediate_size, "intermediate_size", file)?,
        // a model trained with a sliding window is exact only within it: its context is
        // capped there rather than run past it with full attention
        context_length: required(raw.max_position_embeddings, "max_position_embeddings", file)?
            .min(raw.sliding_window.filter(|&w| w > 0).unwrap_or(usize::MAX)),
        norm: NormKind::RmsNorm,
        norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
        rope_theta: raw.rope_theta.unwrap_or(10_000.0),
        rope_layout: RopeLayout::RotateHalf,
        rope_scaling,
        activation: Activation::SwiGlu,
        tied_embeddings: raw.tie_word_embeddings.unwrap_or(false),
        qkv_bias: model_type == "qwen2" || raw.attention_bias.unwrap_or(false),
        qk_norm: model_type == "qwen3",
        bos_id: None,
        eos_ids: Vec::new(),
        local_attention: None,
        bidirectional: false,
        pooling: None,
    })
}

/// The family's Hugging Face tensor names; Phi-3's fused projections keep their stacked form
/// for [`crate::model::unfuse`].
fn hf_tensor(hf_name: &str) -> Option<String> {
    hf::llama_layout_name(hf_name, |module| match module {
        "self_attn.qkv_proj" => Some("attn_qkv"),
        "mlp.gate_up_proj" => Some("ffn_up"),
        "post_attention_layernorm" => Some("ffn_norm"),
        _ => None,
    })
}

/// The tensors of a gated (SwiGLU or GeGLU) RMSNorm model: embedding; per layer the attention
/// norm, Q/K/V (with biases and QK-norm gains when the config has them), the output
/// projection, the feed-forward norm, gate, up and down; with `post_norms` (Gemma 3) the norms
/// of each sub-layer's output; then the head.
pub(super) fn gated_tensors(c: &ModelConfig, post_norms: bool, f: TensorVisitor<'_>) -> Result<()> {
    let (d, ff, v) = (c.hidden_size, c.ffn_size, c.vocab_size);
    let (q, kv) = (c.q_dim(), c.kv_dim());
    f("token_embd.weight".into(), vec![v, d])?;
    for i in 0..c.n_layers {
        let b = |s: &str| format!("blk.{i}.{s}");
        f(b("attn_norm.weight"), vec![d])?;
        f(b("attn_q.weight"), vec![q, d])?;
        f(b("attn_k.weight"), vec![kv, d])?;
        f(b("attn_v.weight"), vec![kv, d])?;
        if c.qkv_bias {
            f(b("attn_q.bias"), vec![q])?;
            f(b("attn_k.bias"), vec![kv])?;
            f(b("attn_v.bias"), vec![kv])?;
        }
        if c.qk_norm {
            f(b("attn_q_norm.weight"), vec![c.head_dim])?;
            f(b("attn_k_norm.weight"), vec![c.head_dim])?;
        }
        f(b("attn_output.weight"), vec![d, q])?;
        if post_norms {
            f(b("post_attention_norm.weight"), vec![d])?;
        }
        f(b("ffn_norm.weight"), vec![d])?;
        f(b("ffn_gate.weight"), vec![ff, d])?;
        f(b("ffn_up.weight"), vec![ff, d])?;
        f(b("ffn_down.weight"), vec![d, ff])?;
        if post_norms {
            f(b("post_ffw_norm.weight"), vec![d])?;
        }
    }
    super::head_tensors(c, f)
}

/// Q, K and V projections of one block.
#[derive(Debug)]
enum Qkv {
    /// Stacked at load ([`crate::model::fuse`]): `[q_dim + 2·kv_dim, d]`, rows `q | k | v`, Q and K rows in
    /// adjacent-pair RoPE order. One product, whose epilogue rotates and writes the cache.
    Stacked(Matrix),
    /// Separate (their types differ): `q: [q_dim, d]`, `k, v: [kv_dim, d]`.
    Separate { q: Matrix, k: Matrix, v: Matrix },
}

/// Gate and up projections of one block's feed-forward (shared with Gemma 3's GeGLU).
#[derive(Debug)]
pub(super) enum GateUp {
    /// Interleaved at load ([`crate::model::fuse`]): `[2·ffn, d]`, rows `gate₀, up₀, gate₁, up₁, …`.
    Interleaved(Matrix),
    /// Separate: `gate, up: [ffn, d]`.
    Separate { gate: Matrix, up: Matrix },
}

impl GateUp {
    /// Layer `layer`'s gate and up (interleaved when [`crate::model::fuse`] did so), shapes checked.
    pub(super) fn find(c: &ModelConfig, w: &Lookup<'_>, layer: usize) -> Result<Self> {
        let b = |s: &str| format!("blk.{layer}.{s}");
        let (d, ff) = (c.hidden_size, c.ffn_size);
        Ok(if w.has(&gate_up_name(layer, "weight")) {
            GateUp::Interleaved(w.matrix(&b("ffn_gate_up"), 2 * ff, d)?)
        } else {
            GateUp::Separate {
                gate: w.matrix(&b("ffn_gate"), ff, d)?,
                up: w.matrix(&b("ffn_up"), ff, d)?,
            }
        })
    }

    /// `Hidden = act(gate(norm(X))) · up(norm(X))`, `act` silu or (`gelu`) gelu_tanh.
    pub(super) fn ops(self, norm: &Norm, gelu: bool, ops: &mut Vec<Op>) {
        match self {
            GateUp::Interleaved(m) => ops.push(Op::Linear(
                LinearOp::new(m, Act::X, Act::Hidden)
                    .normed(norm)
                    .then(if gelu { Post::GeGlu } else { Post::SwiGlu }),
            )),
            GateUp::Separate { gate, up } => {
                for (m, y) in [(gate, Act::Gate), (up, Act::Up)] {
                    ops.push(Op::Linear(LinearOp::new(m, Act::X, y).normed(norm)));
                }
                ops.push(if gelu { Op::GeGlu } else { Op::SwiGlu });
            }
        }
    }
}

/// One block's weights.
#[derive(Debug)]
struct Block {
    /// RMSNorm before attention, `[d]`.
    attn_norm: Norm,
    /// Q, K, V.
    qkv: Qkv,
    /// QK-norm gains `(q, k)`, `[head_dim]` each (Qwen3).
    qk_norm: Option<(String, String)>,
    /// Attention output projection, `[d, q_dim]`.
    attn_output: Matrix,
    /// RMSNorm before the feed-forward, `[d]`.
    ffn_norm: Norm,
    /// Gate and up.
    gate_up: GateUp,
    /// Feed-forward down projection, `[d, ffn]`.
    ffn_down: Matrix,
}

impl Block {
    /// Layer `layer`'s weights, shapes checked.
    fn find(c: &ModelConfig, w: &Lookup<'_>, layer: usize) -> Result<Self> {
        let b = |s: &str| format!("blk.{layer}.{s}");
        let (d, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.ffn_size);
        let qk_norm = match c.qk_norm {
            true => Some((
                w.tensor(&b("attn_q_norm.weight"), &[c.head_dim])?,
                w.tensor(&b("attn_k_norm.weight"), &[c.head_dim])?,
            )),
            false => None,
        };
        let qkv = if w.has(&qkv_name(layer, "weight")) && qk_norm.is_none() {
            Qkv::Stacked(w.matrix(&b("attn_qkv"), q + 2 * kv, d)?)
        } else {
            Qkv::Separate {
                q: w.matrix(&b("attn_q"), q, d)?,
                k: w.matrix(&b("attn_k"), kv, d)?,
                v: w.matrix(&b("attn_v"), kv, d)?,
            }
        };
        let gate_up = GateUp::find(c, w, layer)?;
        Ok(Self {
            attn_norm: w.norm(c, &b("attn_norm"), d)?,
            qkv,
            qk_norm,
            attn_output: w.matrix(&b("attn_output"), d, q)?,
            ffn_norm: w.norm(c, &b("ffn_norm"), d)?,
            gate_up,
            ffn_down: w.matrix(&b("ffn_down"), d, ff)?,
        })
    }

    /// The block's operations, residual stream in [`Act::X`].
    fn ops(self, layer: usize, ops: &mut Vec<Op>) {
        let stacked = match self.qkv {
            Qkv::Stacked(m) => {
                let mut qkv = LinearOp::new(m, Act::X, Act::Q).normed(&self.attn_norm);
                qkv.kv_layer = Some(layer);
                ops.push(Op::Linear(qkv));
                true
            }
            Qkv::Separate { q, k, v } => {
                for (m, y) in [(q, Act::Q), (k, Act::K), (v, Act::V)] {
                    ops.push(Op::Linear(
                        LinearOp::new(m, Act::X, y).normed(&self.attn_norm),
                    ));
                }
                if let Some((q_norm, k_norm)) = self.qk_norm {
                    ops.push(Op::HeadNorm {
                        act: Act::Q,
                        weight: q_norm,
                    });
                    ops.push(Op::HeadNorm {
                        act: Act::K,
                        weight: k_norm,
                    });
                }
                ops.push(Op::RopeKvWrite { layer });
                false
            }
        };
        ops.push(Op::Attention { layer, stacked });
        ops.push(Op::Linear(
            LinearOp::new(self.attn_output, Act::Attn, Act::X).residual(),
        ));
        self.gate_up.ops(&self.ffn_norm, false, ops);
        ops.push(Op::Linear(
            LinearOp::new(self.ffn_down, Act::Hidden, Act::X).residual(),
        ));
    }
}

/// The graph of a Llama-family model.
fn build(c: &ModelConfig, w: &Lookup<'_>) -> Result<Graph> {
    let table = w.tensor("token_embd.weight", &[c.vocab_size, c.hidden_size])?;
    let mut ops = vec![Op::Embed {
        table,
        rows: Rows::Tokens,
        accumulate: false,
        scale: SPEC.embedding_scale,
    }];
    for layer in 0..c.n_layers {
        Block::find(c, w, layer)?.ops(layer, &mut ops);
    }
    let head = crate::model::graph::head(c, w)?;
    Ok(Graph { ops, head })
}
