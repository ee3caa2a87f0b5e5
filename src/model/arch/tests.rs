//! The registry's invariants, and each architecture's graph over its own expected tensors.

use std::collections::HashMap;

use super::*;
use crate::config::tests::tiny_llama;
use crate::config::NormKind;
use crate::model::graph::{Act, Op, Post, Rows};

impl WeightIndex for HashMap<String, Vec<usize>> {
    fn shape(&self, name: &str) -> Option<&[usize]> {
        self.get(name).map(Vec::as_slice)
    }
}

fn tensors(c: &ModelConfig) -> HashMap<String, Vec<usize>> {
    expected_tensors(c).into_iter().collect()
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
    let head = g.head.as_ref().expect("a Llama has an LM head");
    assert_eq!(head.matrix.weight, "output.weight");
    assert_eq!(head.norm.as_ref().map(|n| n.kind), Some(NormKind::RmsNorm));
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

#[test]
fn expected_tensors_cover_every_layer() {
    let c = tiny_llama();
    let t = expected_tensors(&c);
    // embedding + 9 per layer + output norm + untied head
    assert_eq!(t.len(), 1 + 9 * 2 + 1 + 1);
    assert!(t.contains(&("blk.1.attn_k.weight".into(), vec![32, 64])));
    let mut tied = c.clone();
    tied.tied_embeddings = true;
    assert_eq!(expected_tensors(&tied).len(), t.len() - 1);
}

#[test]
fn check_tensors_reports_missing_and_misshapen() {
    let c = tiny_llama();
    let shapes: std::collections::HashMap<String, Vec<usize>> =
        expected_tensors(&c).into_iter().collect();
    assert!(check_tensors(&c, "f", |n| shapes.get(n).map(|s| (s.as_slice(), "f"))).is_ok());
    let mut missing = shapes.clone();
    missing.remove("blk.1.ffn_up.weight");
    let err = check_tensors(&c, "f", |n| missing.get(n).map(|s| (s.as_slice(), "f"))).unwrap_err();
    assert!(err
        .to_string()
        .contains("missing tensor `blk.1.ffn_up.weight`"));
    let mut wrong = shapes;
    wrong.insert("blk.0.attn_q.weight".into(), vec![64, 65]);
    let err = check_tensors(&c, "f", |n| wrong.get(n).map(|s| (s.as_slice(), "f"))).unwrap_err();
    assert!(
        err.to_string()
            .contains("`blk.0.attn_q.weight` has shape [64, 65]"),
        "{err}"
    );
}

/// `tiny_llama` made into a small model of `arch`, as its loaders would describe it.
fn tiny(arch: Architecture) -> ModelConfig {
    let mut c = tiny_llama();
    c.arch = arch;
    let s = spec(arch);
    c.norm = s.norm;
    c.activation = s.activation;
    c.rope_layout = s.gguf_names[0].rope_layout;
    c.qkv_bias = s.gguf_names[0].qkv_bias;
    c.qk_norm = s.gguf_names[0].qk_norm;
    if arch == gpt2::ARCH || arch == bert::ARCH {
        (c.n_kv_heads, c.head_dim) = (c.n_heads, c.hidden_size / c.n_heads);
    }
    (c.bidirectional, c.pooling) = (s.bidirectional, s.pooling);
    c
}

const EVERY: [Architecture; 4] = [llama::ARCH, gpt2::ARCH, gemma3::ARCH, bert::ARCH];

#[test]
fn every_architecture_has_one_spec_in_the_registry() {
    for arch in EVERY {
        let s = spec(arch);
        assert_eq!(s.arch, arch);
        assert_eq!(
            REGISTRY.iter().filter(|r| std::ptr::eq(**r, s)).count(),
            1,
            "{arch:?}"
        );
        // the first GGUF name is the architecture's own, and finds it
        assert_eq!(s.gguf_names[0].name, arch.name());
        assert!(std::ptr::eq(by_gguf_name(arch.name()).unwrap().0, s));
    }
    assert_eq!(REGISTRY.len(), EVERY.len());
}

#[test]
fn names_belong_to_one_architecture_each() {
    let gguf: Vec<&str> = REGISTRY
        .iter()
        .flat_map(|s| s.gguf_names.iter().map(|g| g.name))
        .collect();
    let hf: Vec<&str> = REGISTRY
        .iter()
        .flat_map(|s| s.hf_model_types.iter().copied())
        .collect();
    for names in [&gguf, &hf] {
        let mut sorted = names.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "{names:?}");
    }
    assert_eq!(
        gguf_names(),
        "llama, qwen2, qwen3, phi3, gpt2, gemma3, bert"
    );
    assert!(by_gguf_name("mamba").is_none());
    assert_eq!(by_hf_model_type("qwen3").map(|s| s.arch), Some(llama::ARCH));
    assert_eq!(
        by_hf_model_type("gemma3_text").map(|s| s.arch),
        Some(gemma3::ARCH)
    );
}

#[test]
fn each_architecture_builds_its_graph_over_its_own_expected_tensors() {
    for arch in EVERY {
        let c = tiny(arch);
        validate(&c, "tiny").unwrap_or_else(|e| panic!("{arch:?}: {e}"));
        let t = tensors(&c);
        assert_eq!(
            t.len(),
            expected_tensors(&c).len(),
            "{arch:?}: a name twice"
        );
        let g = build(&c, &t, "tiny").unwrap_or_else(|e| panic!("{arch:?}: {e}"));
        assert_eq!(g.uses_branch(), arch == gemma3::ARCH, "{arch:?}");
        let Op::Embed { scale, .. } = &g.ops[0] else {
            panic!("{arch:?}: {:?}", g.ops[0]);
        };
        assert_eq!(*scale, spec(arch).embedding_scale);
    }
}

#[test]
fn each_architecture_says_which_rule_a_config_breaks() {
    let mut g = tiny(gpt2::ARCH);
    g.n_kv_heads = 1;
    let e = validate(&g, "g.gguf").unwrap_err().to_string();
    assert!(
        e.contains("n_kv_heads = n_heads") && e.starts_with("g.gguf"),
        "{e}"
    );
    let mut g = tiny(gpt2::ARCH);
    g.head_dim = 8;
    let e = validate(&g, "g.gguf").unwrap_err().to_string();
    assert!(e.contains("n_heads · head_dim = hidden_size"), "{e}");
    let mut m = tiny(gemma3::ARCH);
    m.qk_norm = false;
    let e = validate(&m, "m.gguf").unwrap_err().to_string();
    assert!(e.contains("qk_norm must be set"), "{e}");
}

#[test]
fn hugging_face_names_map_into_each_architectures_expected_tensors() {
    let cases: [(Architecture, &[&str]); 4] = [
        (
            llama::ARCH,
            &[
                "model.embed_tokens.weight",
                "model.layers.1.self_attn.k_proj.weight",
                "model.layers.0.post_attention_layernorm.weight",
                "model.norm.weight",
                "lm_head.weight",
            ],
        ),
        (
            gpt2::ARCH,
            &["transformer.h.1.mlp.c_fc.bias", "wpe.weight", "ln_f.bias"],
        ),
        (
            gemma3::ARCH,
            &[
                "model.layers.1.pre_feedforward_layernorm.weight",
                "model.layers.0.post_feedforward_layernorm.weight",
                "model.layers.0.self_attn.q_norm.weight",
            ],
        ),
        (
            bert::ARCH,
            &[
                "bert.embeddings.word_embeddings.weight",
                "embeddings.token_type_embeddings.weight",
                "embeddings.LayerNorm.bias",
                "encoder.layer.1.attention.self.value.bias",
                "encoder.layer.0.attention.output.LayerNorm.weight",
                "encoder.layer.1.intermediate.dense.weight",
                "encoder.layer.0.output.dense.bias",
                "encoder.layer.1.output.LayerNorm.bias",
            ],
        ),
    ];
    for (arch, names) in cases {
        let t = tensors(&tiny(arch));
        for hf_name in names {
            let gguf = (spec(arch).hf_tensor)(hf_name)
                .unwrap_or_else(|| panic!("{arch:?}: {hf_name} unmapped"));
            assert!(t.contains_key(&gguf), "{arch:?}: {hf_name} → {gguf}");
        }
    }
    assert_eq!(
        (spec(gpt2::ARCH).hf_fix)("blk.0.attn_qkv.weight", "h.0.attn.c_attn.weight"),
        Some(HfFix::Transpose)
    );
    assert_eq!(
        (spec(gemma3::ARCH).hf_fix)("blk.0.ffn_norm.weight", "x"),
        Some(HfFix::PlusOne)
    );
    assert_eq!(
        (spec(llama::ARCH).hf_fix)("blk.0.ffn_norm.weight", "x"),
        None
    );
    // what a BERT checkpoint holds beyond the encoder is not read
    for unread in [
        "pooler.dense.weight",
        "embeddings.position_ids",
        "cls.predictions.bias",
        "encoder.layer.0.attention.self.query.scale",
    ] {
        assert_eq!((spec(bert::ARCH).hf_tensor)(unread), None, "{unread}");
    }
}

#[test]
fn a_bert_graph_is_bidirectional_post_norm_and_headless() {
    let c = tiny(bert::ARCH);
    assert!(c.bidirectional);
    let g = build(&c, &tensors(&c), "tiny").unwrap();
    assert!(g.head.is_none());
    let e = g.lm_head(&c).unwrap_err().to_string();
    assert!(e.contains("encoder with no LM head"), "{e}");
    let rows: Vec<Rows> = g
        .ops
        .iter()
        .filter_map(|op| match op {
            Op::Embed { rows, .. } => Some(*rows),
            _ => None,
        })
        .collect();
    assert_eq!(rows, [Rows::Tokens, Rows::Positions, Rows::First]);
    // the embedding norm, then two post-norms per layer
    let norms = g.ops.iter().filter(|op| matches!(op, Op::Norm(_))).count();
    assert_eq!(norms, 1 + 2 * c.n_layers);
    assert!(g
        .ops
        .iter()
        .any(|op| matches!(op, Op::Linear(l) if l.post == Post::GeluErf)));
    // no linear has a norm folded in: each of BERT's norms follows a residual sum
    assert!(g
        .ops
        .iter()
        .all(|op| !matches!(op, Op::Linear(l) if l.norm.is_some())));
}
