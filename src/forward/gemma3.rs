//! Gemma 3: the embedding scaled by √d; RMSNorm before and after attention and the
//! feed-forward (the post-norms apply to the sub-layer's output before it joins the residual);
//! RMSNorm of each query and key head before RoPE (QK-norm); a GeGLU feed-forward; local
//! (sliding-window) layers with their own RoPE base between global ones, which the backend
//! reads from [`ModelConfig::layer_window`] and [`ModelConfig::layer_rope`].

use super::graph::{Act, EmbedScale, Graph, LinearOp, Lookup, Matrix, Norm, Op, Rows};
use super::llama::GateUp;
use crate::config::ModelConfig;
use crate::error::Result;

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
pub fn build(c: &ModelConfig, w: &Lookup<'_>) -> Result<Graph> {
    let table = w.tensor("token_embd.weight", &[c.vocab_size, c.hidden_size])?;
    let mut ops = vec![Op::Embed {
        table,
        rows: Rows::Tokens,
        accumulate: false,
        scale: EmbedScale::SqrtDim,
    }];
    for layer in 0..c.n_layers {
        Block::find(c, w, layer)?.ops(layer, &mut ops);
    }
    let head = super::graph::head(c, w)?;
    Ok(Graph { ops, head })
}
