//! The Llama family (Llama 2/3, SmolLM2, TinyLlama, Mistral, Qwen2, Qwen3): pre-norm blocks
//! with RMSNorm, RoPE attention with grouped K/V heads (Qwen3 normalises each query and key
//! head first), and a SwiGLU feed-forward.

use super::fuse;
use super::graph::{Act, Graph, LinearOp, Lookup, Matrix, Norm, Op, Post};
use crate::config::ModelConfig;
use crate::error::Result;

/// Q, K and V projections of one block.
#[derive(Debug)]
enum Qkv {
    /// Stacked at load ([`fuse`]): `[q_dim + 2·kv_dim, d]`, rows `q | k | v`, Q and K rows in
    /// adjacent-pair RoPE order. One product, whose epilogue rotates and writes the cache.
    Stacked(Matrix),
    /// Separate (their types differ): `q: [q_dim, d]`, `k, v: [kv_dim, d]`.
    Separate { q: Matrix, k: Matrix, v: Matrix },
}

/// Gate and up projections of one block's feed-forward (shared with Gemma 3's GeGLU).
#[derive(Debug)]
pub(super) enum GateUp {
    /// Interleaved at load ([`fuse`]): `[2·ffn, d]`, rows `gate₀, up₀, gate₁, up₁, …`.
    Interleaved(Matrix),
    /// Separate: `gate, up: [ffn, d]`.
    Separate { gate: Matrix, up: Matrix },
}

impl GateUp {
    /// Layer `layer`'s gate and up (interleaved when [`fuse`] did so), shapes checked.
    pub(super) fn find(c: &ModelConfig, w: &Lookup<'_>, layer: usize) -> Result<Self> {
        let b = |s: &str| format!("blk.{layer}.{s}");
        let (d, ff) = (c.hidden_size, c.ffn_size);
        Ok(if w.has(&fuse::gate_up_name(layer, "weight")) {
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
        let qkv = if w.has(&fuse::qkv_name(layer, "weight")) && qk_norm.is_none() {
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
pub fn build(c: &ModelConfig, w: &Lookup<'_>) -> Result<Graph> {
    let table = w.tensor("token_embd.weight", &[c.vocab_size, c.hidden_size])?;
    let mut ops = vec![Op::Embed {
        table,
        rows: super::graph::Rows::Tokens,
        accumulate: false,
        scale: super::graph::EmbedScale::One,
    }];
    for layer in 0..c.n_layers {
        Block::find(c, w, layer)?.ops(layer, &mut ops);
    }
    let head = super::graph::head(c, w)?;
    Ok(Graph { ops, head })
}
