//! Which architecture builds the graph: the one place that branches on it.

use super::graph::{Graph, Lookup, WeightIndex};
use super::{gemma3, gpt2, llama};
use crate::config::{Architecture, ModelConfig};
use crate::error::Result;

/// The graph of `config`'s architecture over the tensors of `index` (`file` names the model in
/// errors).
pub fn build(config: &ModelConfig, index: &dyn WeightIndex, file: &str) -> Result<Graph> {
    let w = Lookup::new(index, file);
    match config.arch {
        Architecture::Llama => llama::build(config, &w),
        Architecture::Gpt2 => gpt2::build(config, &w),
        Architecture::Gemma3 => gemma3::build(config, &w),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::config::tests::tiny_llama;
    use crate::config::NormKind;
    use crate::forward::graph::{Act, Op, Post};

    impl WeightIndex for HashMap<String, Vec<usize>> {
        fn shape(&self, name: &str) -> Option<&[usize]> {
            self.get(name).map(Vec::as_slice)
        }
    }

    fn tensors(c: &ModelConfig) -> HashMap<String, Vec<usize>> {
        c.expected_tensors().into_iter().collect()
    }

    #[test]
    fn a_llama_layer_is_projections_attention_and_feed_forward() {
        let c = tiny_llama();
        let g = build(&c, &tensors(&c), "tiny").unwrap();
        // embedding, then per layer: q, k, v, RoPE + KV write, attention, output, gate, up,
        // SwiGLU, down (separate tensors as the file stores them)
        assert_eq!(g.ops.len(), 1 + 10 * c.n_layers);
        assert!(matches!(g.ops[4], Op::RopeKvWrite { layer: 0 }));
        assert!(matches!(
            g.ops[5],
            Op::Attention {
                layer: 0,
                stacked: false
            }
        ));
        assert_eq!(g.head.matrix.weight, "output.weight");
        assert_eq!(
            g.head.norm.as_ref().map(|n| n.kind),
            Some(NormKind::RmsNorm)
        );
    }

    #[test]
    fn stacked_tensors_make_one_projection() {
        let c = tiny_llama();
        let mut t = tensors(&c);
        let (d, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.ffn_size);
        for layer in 0..c.n_layers {
            t.insert(format!("blk.{layer}.attn_qkv.weight"), vec![q + 2 * kv, d]);
            t.insert(format!("blk.{layer}.ffn_gate_up.weight"), vec![2 * ff, d]);
        }
        let g = build(&c, &t, "tiny").unwrap();
        assert_eq!(g.ops.len(), 1 + 5 * c.n_layers);
        let Op::Linear(qkv) = &g.ops[1] else {
            panic!("{:?}", g.ops[1]);
        };
        assert_eq!(qkv.kv_layer, Some(0));
        assert_eq!(qkv.y, Act::Q);
        let Op::Linear(gate_up) = &g.ops[4] else {
            panic!("{:?}", g.ops[4]);
        };
        assert_eq!(gate_up.post, Post::SwiGlu);
    }

    #[test]
    fn missing_and_misshapen_tensors_are_named() {
        let c = tiny_llama();
        let mut t = tensors(&c);
        t.remove("blk.1.ffn_down.weight");
        let e = build(&c, &t, "tiny.gguf").unwrap_err().to_string();
        assert!(
            e.contains("blk.1.ffn_down.weight") && e.contains("tiny.gguf"),
            "{e}"
        );
        let mut t = tensors(&c);
        t.insert("blk.0.attn_output.weight".into(), vec![3, 5]);
        let e = build(&c, &t, "tiny.gguf").unwrap_err().to_string();
        assert!(
            e.contains("blk.0.attn_output.weight") && e.contains("[3, 5]"),
            "{e}"
        );
    }
}
