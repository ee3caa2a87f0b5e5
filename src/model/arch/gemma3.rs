//! Gemma 3: the embedding scaled by √d; RMSNorm before and after attention and the
//! feed-forward (the post-norms apply to the sub-layer's output before it joins the residual);
//! RMSNorm of each query and key head before RoPE (QK-norm); a GeGLU feed-forward; local
//! (sliding-window) layers with their own RoPE base between global ones, which the backend
//! reads from [`ModelConfig::layer_window`] and [`ModelConfig::layer_rope`].

use super::hf::{self, required, rope_scaling_of, unsupported, HfConfig};
use super::llama::{gated_tensors, GateUp};
use super::{ArchSpec, Fusion, GgufName, HfFix, Window};
use crate::config::{
    Activation, Architecture, LocalAttention, ModelConfig, NormKind, RopeLayout,
    GEMMA3_LOCAL_ROPE_THETA, GEMMA3_PATTERN,
};
use crate::error::Result;
use crate::model::graph::{Act, EmbedScale, Graph, LinearOp, Lookup, Matrix, Norm, Op, Rows};

/// Gemma 3: the embedding scaled by √d, RMSNorm before and after attention and the
/// feed-forward, RMSNorm of each query and key head (QK-norm), GeGLU, and local
/// (sliding-window) layers between global ones ([`crate::config::LocalAttention`]).
pub const ARCH: Architecture = Architecture::named("gemma3");

/// Gemma 3.
pub static SPEC: ArchSpec = ArchSpec {
    arch: ARCH,
    gguf_names: &[GgufName {
        name: "gemma3",
        // rotate-half RoPE, unpermuted
        rope_layout: RopeLayout::RotateHalf,
        qkv_bias: false,
        qk_norm: true,
    }],
    norm: NormKind::RmsNorm,
    gguf_eps_key: "attention.layer_norm_rms_epsilon",
    activation: Activation::GeGlu,
    window: Window::Interleaved {
        window: 512,
        pattern: GEMMA3_PATTERN,
        rope_theta: GEMMA3_LOCAL_ROPE_THETA,
    },
    embedding_scale: EmbedScale::SqrtDim,
    bidirectional: false,
    pooling: None,
    // the query and key heads are normalised between the projection and RoPE, so Q, K and V
    // stay separate; gate and up interleave for a GeGLU epilogue
    fusion: Fusion {
        qkv: false,
        gate_up: true,
    },
    splits_stacked: false,
    hf_model_types: &["gemma3_text", "gemma3"],
    hf_config,
    hf_tensor,
    hf_fix: |gguf_name, _| gguf_name.ends_with("norm.weight").then_some(HfFix::PlusOne),
    check: |c| {
        (!c.qk_norm)
            .then(|| "Gemma 3 normalises its query and key heads: qk_norm must be set".into())
    },
    tensors: |c, f| gated_tensors(c, true, f),
    build,
};

/// Gemma's Hugging Face tensor names: the Llama layout with its norms around each block.
fn hf_tensor(hf_name: &str) -> Option<String> {
    hf::llama_layout_name(hf_name, |module| match module {
        // after attention, before and after the feed-forward
        "post_attention_layernorm" => Some("post_attention_norm"),
        "pre_feedforward_layernorm" => Some("ffn_norm"),
        "post_feedforward_layernorm" => Some("post_ffw_norm"),
        _ => None,
    })
}

/// Gemma 3's text model (`gemma3_text`; the multimodal `gemma3` is refused naming the text
/// form): Hugging Face's defaults where a field is absent; the
/// local layers from `layer_types` (which must repeat one pattern of local layers then a
/// global one) or `sliding_window_pattern`; soft-capping and a query scale other than
/// `1/√head_dim` are refused by name.
fn hf_config(raw: &HfConfig, file: &str) -> Result<ModelConfig> {
    let unsupported = |what: String| unsupported(file, what);
    if raw.model_type.as_deref() == Some("gemma3") {
        return Err(unsupported(
            "model_type `gemma3` (the multimodal checkpoint: load its text-only form, model_type `gemma3_text`)".into(),
        ));
    }
    let act = raw
        .hidden_activation
        .as_deref()
        .unwrap_or("gelu_pytorch_tanh");
    if act != "gelu_pytorch_tanh" {
        return Err(unsupported(format!(
            "hidden_activation `{act}` (only `gelu_pytorch_tanh`)"
        )));
    }
    for (name, v) in [
        ("final_logit_softcapping", raw.final_logit_softcapping),
        ("attn_logit_softcapping", raw.attn_logit_softcapping),
    ] {
        if let Some(v) = v {
            return Err(unsupported(format!("{name} = {v} (Gemma 3 has none)")));
        }
    }
    let hidden = required(raw.hidden_size, "hidden_size", file)?;
    let heads = required(raw.num_attention_heads, "num_attention_heads", file)?;
    let head_dim = raw.head_dim.unwrap_or(256);
    if let Some(q) = raw.query_pre_attn_scalar {
        if q != head_dim as f64 {
            return Err(unsupported(format!(
                "query_pre_attn_scalar = {q} (only head_dim, {head_dim}, which scales queries by 1/√head_dim)"
            )));
        }
    }
    let n_layers = required(raw.num_hidden_layers, "num_hidden_layers", file)?;
    let pattern = match &raw.layer_types {
        None => raw.sliding_window_pattern.unwrap_or(GEMMA3_PATTERN),
        Some(types) => {
            let pattern = types
                .iter()
                .position(|t| t == "full_attention")
                .map_or(usize::MAX, |i| i.saturating_add(1));
            let expected = |i: usize| match i.saturating_add(1).is_multiple_of(pattern) {
                true => "full_attention",
                false => "sliding_attention",
            };
            if types.len() != n_layers || types.iter().enumerate().any(|(i, t)| t != expected(i)) {
                return Err(unsupported(format!(
                    "layer_types {types:?} (only a repeated run of sliding layers then one full layer, one entry per layer)"
                )));
            }
            pattern
        }
    };
    let rope_scaling = rope_scaling_of(raw, file)?;
    Ok(ModelConfig {
        arch: ARCH,
        vocab_size: required(raw.vocab_size, "vocab_size", file)?,
        hidden_size: hidden,
        n_layers,
        n_heads: heads,
        n_kv_heads: raw.num_key_value_heads.unwrap_or(heads),
        head_dim,
        ffn_size: required(raw.intermediate_size, "intermediate_size", file)?,
        context_length: raw.max_position_embeddings.unwrap_or(131_072),
        norm: NormKind::RmsNorm,
        norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
        rope_theta: raw.rope_theta.unwrap_or(1_000_000.0),
        rope_layout: RopeLayout::RotateHalf,
        rope_scaling,
        activation: Activation::GeGlu,
        tied_embeddings: raw.tie_word_embeddings.unwrap_or(true),
        qkv_bias: raw.attention_bias.unwrap_or(false),
        qk_norm: true,
        bos_id: None,
        eos_ids: Vec::new(),
        local_attention: Some(LocalAttention {
            window: raw.sliding_window.unwrap_or(4096),
            pattern,
            rope_theta: raw.rope_local_base_freq.unwrap_or(GEMMA3_LOCAL_ROPE_THETA),
        }),
        bidirectional: false,
        pooling: None,
    })
}

/// One block's weights.
#[derive(Debug)]
struct Block {
    /// Before attention, `[d]`.
    attn_norm: Norm,
    /// `q: [q_dim, d]`, `k, v: [kv_dim, d]`.
    q: Matrix,
    k: Matrix,
    v: Matrix,
    /// QK-norm gains, `[head_dim]` each.
    q_norm: String,
    k_norm: String,
    /// Attention output projection, `[d, q_dim]`.
    attn_output: Matrix,
    /// After the attention output, `[d]`.
    post_attention_norm: String,
    /// Before the feed-forward, `[d]`.
    ffn_norm: Norm,
    /// Gate and up.
    gate_up: GateUp,
    /// Feed-forward down projection, `[d, ffn]`.
    ffn_down: Matrix,
    /// After the feed-forward, `[d]`.
    post_ffw_norm: String,
}

impl Block {
    /// Layer `layer`'s weights, shapes checked.
    fn find(c: &ModelConfig, w: &Lookup<'_>, layer: usize) -> Result<Self> {
        let b = |s: &str| format!("blk.{layer}.{s}");
        let (d, q, kv, ff, hd) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.ffn_size, c.head_dim);
        let gate_up = GateUp::find(c, w, layer)?;
        Ok(Self {
            attn_norm: w.norm(c, &b("attn_norm"), d)?,
            q: w.matrix(&b("attn_q"), q, d)?,
            k: w.matrix(&b("attn_k"), kv, d)?,
            v: w.matrix(&b("attn_v"), kv, d)?,
            q_norm: w.tensor(&b("attn_q_norm.weight"), &[hd])?,
            k_norm: w.tensor(&b("attn_k_norm.weight"), &[hd])?,
            attn_output: w.matrix(&b("attn_output"), d, q)?,
            post_attention_norm: w.tensor(&b("post_attention_norm.weight"), &[d])?,
            ffn_norm: w.norm(c, &b("ffn_norm"), d)?,
            gate_up,
            ffn_down: w.matrix(&b("ffn_down"), d, ff)?,
            post_ffw_norm: w.tensor(&b("post_ffw_norm.weight"), &[d])?,
        })
    }

    /// The block's operations, residual stream in [`Act::X`].
    fn ops(self, layer: usize, ops: &mut Vec<Op>) {
        for (m, y) in [(self.q, Act::Q), (self.k, Act::K), (self.v, Act::V)] {
            ops.push(Op::Linear(
                LinearOp::new(m, Act::X, y).normed(&self.attn_norm),
            ));
        }
        ops.push(Op::HeadNorm {
            act: Act::Q,
            weight: self.q_norm,
        });
        ops.push(Op::HeadNorm {
            act: Act::K,
            weight: self.k_norm,
        });
        ops.push(Op::RopeKvWrite { layer });
        ops.push(Op::Attention {
            layer,
            stacked: false,
        });
        ops.push(Op::Linear(LinearOp::new(
            self.attn_output,
            Act::Attn,
            Act::Branch,
        )));
        ops.push(Op::AddNormed {
            weight: self.post_attention_norm,
        });
        self.gate_up.ops(&self.ffn_norm, true, ops);
        ops.push(Op::Linear(LinearOp::new(
            self.ffn_down,
            Act::Hidden,
            Act::Branch,
        )));
        ops.push(Op::AddNormed {
            weight: self.post_ffw_norm,
        });
    }
}

/// The graph of a Gemma 3 model.
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
