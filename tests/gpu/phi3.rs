//! Phi-3 (the Llama graph with one `qkv_proj` and one `gate_up_proj` per layer, rotate-half
//! RoPE) in both forms the engine loads, built from the tiny Llama's Hugging Face weights: a
//! folder with `model_type: phi3` and the fused tensors, and a `phi3` GGUF. The loader splits
//! the fused matrices by rows (quantized rows are whole blocks: a Q8_0 GGUF is split without
//! dequantizing), and both run on the GPU as the unfused Llama folder does. A trained sliding
//! window caps the context.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use std::path::Path;

use common::model_forms::{
    as_f32, fixtures, logits, max_diff, tiny_llama_tensors, write_folder, write_gguf, Tensors,
};
use emberlm::loader::ModelFiles;

/// The tiny Llama's HF tensors with each layer's q, k, v and gate, up stacked as Phi-3 does.
fn phi3_tensors() -> Tensors {
    let mut t = tiny_llama_tensors();
    for layer in 0..2 {
        let p = |m: &str| format!("model.layers.{layer}.{m}.weight");
        let stack = |t: &mut Tensors, parts: &[String], name: String| {
            let mut rows = 0;
            let mut values = Vec::new();
            let mut cols = 0;
            for part in parts {
                let (shape, v) = t.remove(part).unwrap();
                rows += shape[0];
                cols = shape[1];
                values.extend(v);
            }
            t.insert(name, (vec![rows, cols], values));
        };
        let qkv = [
            p("self_attn.q_proj"),
            p("self_attn.k_proj"),
            p("self_attn.v_proj"),
        ];
        stack(&mut t, &qkv, p("self_attn.qkv_proj"));
        stack(
            &mut t,
            &[p("mlp.gate_proj"), p("mlp.up_proj")],
            p("mlp.gate_up_proj"),
        );
    }
    t
}

fn phi3_folder(t: &Tensors, dir: &Path, extra: &str) {
    write_folder(t, dir, |c| {
        c.replace(
            "\"model_type\": \"llama\"",
            &format!("\"model_type\": \"phi3\"{extra}"),
        )
    });
}

/// Q8_0 blocks of `v` (rows are multiples of 32 here).
fn q8_0(v: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for block in v.chunks_exact(32) {
        let amax = block.iter().fold(0.0f32, |a, x| a.max(x.abs()));
        let d = half::f16::from_f32(amax / 127.0);
        let id = if d.to_f32() == 0.0 {
            0.0
        } else {
            1.0 / d.to_f32()
        };
        out.extend_from_slice(&d.to_le_bytes());
        out.extend(
            block
                .iter()
                .map(|x| (x * id).round().clamp(-127.0, 127.0) as i8 as u8),
        );
    }
    out
}

/// The GPU's logits alone.
fn gpu_logits(path: &Path, tokens: &[u32]) -> Option<Vec<f32>> {
    logits(path, tokens).map(|(gpu, _)| gpu)
}

#[test]
fn phi3_folders_and_ggufs_split_their_fused_matrices() {
    let tokens: Vec<u32> = (0..40u32).map(|i| (i * 71 + 3) % 512).collect();
    let Some(want) = gpu_logits(&fixtures().join("tiny-llama"), &tokens) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("emberlm-phi3-{}", std::process::id()));
    let t = phi3_tensors();
    let folder = dir.join("hf");
    phi3_folder(&t, &folder, "");
    let got = gpu_logits(&folder, &tokens).unwrap();
    assert!(
        max_diff(&got, &want) < 1e-4,
        "HF phi3: {}",
        max_diff(&got, &want)
    );
    let f32_gguf = dir.join("phi3.gguf");
    write_gguf(&t, &f32_gguf, "phi3", as_f32);
    let got = gpu_logits(&f32_gguf, &tokens).unwrap();
    assert!(
        max_diff(&got, &want) < 1e-4,
        "GGUF phi3: {}",
        max_diff(&got, &want)
    );
    // Q8_0 rows split as bytes: each part holds exactly the blocks of its own rows
    let q8_gguf = dir.join("phi3-q8_0.gguf");
    write_gguf(&t, &q8_gguf, "phi3", |v| (8, q8_0(v)));
    let files = ModelFiles::open(&q8_gguf).unwrap();
    let w = files.weights().unwrap();
    assert!(!w.tensors.contains_key("blk.0.attn_qkv.weight"));
    let bytes = std::fs::read(fixtures().join("tiny-llama/model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    for layer in 0..2 {
        for (hf, gguf) in [
            ("self_attn.q_proj", "attn_q"),
            ("self_attn.k_proj", "attn_k"),
            ("self_attn.v_proj", "attn_v"),
            ("mlp.gate_proj", "ffn_gate"),
            ("mlp.up_proj", "ffn_up"),
        ] {
            let view = st
                .tensor(&format!("model.layers.{layer}.{hf}.weight"))
                .unwrap();
            let part = &w.tensors[&format!("blk.{layer}.{gguf}.weight")];
            assert_eq!(part.shape, view.shape().to_vec(), "{gguf} {layer}");
            let original: Vec<f32> = bytemuck::pod_collect_to_vec(view.data());
            assert!(
                part.data[..] == q8_0(&original)[..],
                "{gguf} {layer}: other bytes"
            );
        }
    }
    let got = gpu_logits(&q8_gguf, &tokens).unwrap();
    assert!(got.iter().all(|v| v.is_finite()));
    // a trained sliding window caps the context
    let windowed = dir.join("windowed");
    phi3_folder(&t, &windowed, ", \"sliding_window\": 47");
    let files = ModelFiles::open(&windowed).unwrap();
    assert_eq!(files.weights().unwrap().config.context_length, 47);
    std::fs::remove_dir_all(&dir).ok();
}
