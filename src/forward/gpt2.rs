//! GPT-2: learned position embeddings, pre-norm blocks with LayerNorm, a stacked `c_attn`
//! projection with biases, no RoPE, and a GELU feed-forward.

use super::graph::{Act, Graph, LinearOp, Lookup, Matrix, Norm, Op, Post, Rows};
use crate::config::ModelConfig;
use crate::error::Result;

/// One block's weights.
#[derive(Debug)]
struct Block {
    /// LayerNorm before attention, weight and bias `[d]`.
    attn_norm: Norm,
    /// Stacked Q, K, V projection (`c_attn`), `[3·d, d]`, bias `[3·d]`.
    attn_qkv: Matrix,
    /// Attention output projection (`c_proj`), `[d, d]`, bias `[d]`.
    attn_output: Matrix,
    /// LayerNorm before the feed-forward, weight and bias `[d]`.
    ffn_norm: Norm,
    /// Feed-forward up projection (`c_fc`), `[ffn, d]`, bias `[ffn]`.
    ffn_up: Matrix,
    /// Feed-forward down projection (`c_proj`), `[d, ffn]`, bias `[d]`.
    ffn_down: Matrix,
}

impl Block {
    /// Layer `layer`'s weights, shapes checked.
    fn find(c: &ModelConfig, w: &Lookup<'_>, layer: usize) -> Result<Self> {
        let b = |s: &str| format!("blk.{layer}.{s}");
        let (d, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.ffn_size);
        Ok(Self {
            attn_norm: w.norm(c, &b("attn_norm"), d)?,
            attn_qkv: w.matrix(&b("attn_qkv"), q + 2 * kv, d)?,
            attn_output: w.matrix(&b("attn_output"), d, q)?,
            ffn_norm: w.norm(c, &b("ffn_norm"), d)?,
            ffn_up: w.matrix(&b("ffn_up"), ff, d)?,
            ffn_down: w.matrix(&b("ffn_down"), d, ff)?,
        })
    }

    /// The block's operations, residual stream in [`Act::X`].
    fn ops(self, layer: usize, ops: &mut Vec<Op>) {
        let mut qkv = LinearOp::new(self.attn_qkv, Act::X, Act::Q).normed(&self.attn_norm);
        qkv.kv_layer = Some(layer);
        ops.push(Op::Linear(qkv));
        ops.push(Op::Attention {
            layer,
            stacked: true,
        });
        ops.push(Op::Linear(
            LinearOp::new(self.attn_output, Act::Attn, Act::X).residual(),
        ));
        ops.push(Op::Linear(
            LinearOp::new(self.ffn_up, Act::X, Act::Hidden)
                .normed(&self.ffn_norm)
                .then(Post::Gelu),
        ));
        ops.push(Op::Linear(
            LinearOp::new(self.ffn_down, Act::Hidden, Act::X).residual(),
        ));
    }
}

/// The graph of a GPT-2 model.
pub fn build(c: &ModelConfig, w: &Lookup<'_>) -> Result<Graph> {
    let d = c.hidden_size;
    let mut ops = vec![
        Op::Embed {
            table: w.tensor("token_embd.weight", &[c.vocab_size, d])?,
            rows: Rows::Tokens,
            accumulate: false,
            scale: super::graph::EmbedScale::One,
        },
        Op::Embed {
            table: w.tensor("position_embd.weight", &[c.context_length, d])?,
            rows: Rows::Positions,
            accumulate: true,
            scale: super::graph::EmbedScale::One,
        },
    ];
    for layer in 0..c.n_layers {
        Block::find(c, w, layer)?.ops(layer, &mut ops);
    }
    let head = super::graph::head(c, w)?;
    Ok(Graph { ops, head })
}
