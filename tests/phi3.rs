//! Phi-3 (the Llama graph with one `qkv_proj` and one `gate_up_proj` per layer, rotate-half
//! RoPE) in both forms the engine loads, built from the tiny Llama's Hugging Face weights: a
//! folder with `model_type: phi3` and the fused tensors, and a `phi3` GGUF. The loader splits
//! the fused matrices by rows (quantized rows are whole blocks: a Q8_0 GGUF is split without
//! dequantizing), and both run on the GPU as the unfused Llama folder does. A trained sliding
//! window caps the context.

#![cfg(not(target_arch = "wasm32"))]

mod common;
#[path = "common/gguf_meta.rs"]
mod gguf_meta;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use emberlm::config::Architecture;
use emberlm::format::gguf::GgufValue;
use emberlm::format::safetensors::gguf_name;
use emberlm::forward::{Forward, DEFAULT_CHUNK};
use emberlm::gpu::KernelCache;
use emberlm::loader::ModelFiles;
use emberlm::GpuOptions;
use safetensors::tensor::{Dtype, TensorView};

type Tensors = BTreeMap<String, (Vec<usize>, Vec<f32>)>;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The tiny Llama's HF tensors with each layer's q, k, v and gate, up stacked as Phi-3 does.
fn phi3_tensors() -> Tensors {
    let bytes = std::fs::read(fixtures().join("tiny-llama/model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut t: Tensors = st
        .tensors()
        .into_iter()
        .map(|(n, v)| {
            (
                n,
                (v.shape().to_vec(), bytemuck::pod_collect_to_vec(v.data())),
            )
        })
        .collect();
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

fn write_folder(t: &Tensors, dir: &Path, model_type: &str, extra: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let src = fixtures().join("tiny-llama");
    std::fs::copy(src.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    let config = std::fs::read_to_string(src.join("config.json"))
        .unwrap()
        .replace(
            "\"model_type\": \"llama\"",
            &format!("\"model_type\": \"{model_type}\"{extra}"),
        );
    std::fs::write(dir.join("config.json"), config).unwrap();
    let raw: Vec<(String, Vec<usize>, Vec<u8>)> = t
        .iter()
        .map(|(n, (s, v))| (n.clone(), s.clone(), bytemuck::cast_slice(v).to_vec()))
        .collect();
    let views: Vec<(String, TensorView<'_>)> = raw
        .iter()
        .map(|(n, s, b)| {
            (
                n.clone(),
                TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
            )
        })
        .collect();
    std::fs::write(
        dir.join("model.safetensors"),
        safetensors::serialize(views, None).unwrap(),
    )
    .unwrap();
}

/// A `phi3` GGUF of `t` (f32, or Q8_0 rows for the matrices when `q8`).
fn write_gguf(t: &Tensors, path: &Path, q8: bool) {
    let meta: gguf_meta::Metadata = gguf_meta::read(&fixtures().join("tiny-llama-f32.gguf"))
        .into_iter()
        .map(|(k, v)| match k.strip_prefix("llama.") {
            Some(rest) => (format!("phi3.{rest}"), v),
            None if k == "general.architecture" => (k, GgufValue::String("phi3".into())),
            None => (k, v),
        })
        .collect();
    let tensors: Vec<gguf_meta::TensorBytes> = t
        .iter()
        .filter_map(|(n, (s, v))| {
            let name = gguf_name(Architecture::Llama, n)?;
            let dims = s.iter().rev().map(|&d| d as u64).collect();
            if q8 && s.len() == 2 {
                Some((name, dims, 8, q8_0(v)))
            } else {
                Some((name, dims, 0, bytemuck::cast_slice(v).to_vec()))
            }
        })
        .collect();
    std::fs::write(path, gguf_meta::write_with_tensors(&meta, &tensors)).unwrap();
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

fn logits(path: &Path, tokens: &[u32]) -> Option<Vec<f32>> {
    let ctx = common::native_gpu(GpuOptions::default())?;
    let files = ModelFiles::open(path).unwrap();
    let weights = files.weights().unwrap();
    let cache = KernelCache::new();
    let mut fwd = pollster::block_on(Forward::new(
        &ctx,
        &cache,
        &weights,
        tokens.len(),
        DEFAULT_CHUNK,
    ))
    .unwrap();
    Some(pollster::block_on(fwd.forward(&ctx, tokens, true)).unwrap())
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn phi3_folders_and_ggufs_split_their_fused_matrices() {
    let tokens: Vec<u32> = (0..40u32).map(|i| (i * 71 + 3) % 512).collect();
    let Some(want) = logits(&fixtures().join("tiny-llama"), &tokens) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("emberlm-phi3-{}", std::process::id()));
    let t = phi3_tensors();
    let folder = dir.join("hf");
    write_folder(&t, &folder, "phi3", "");
    let got = logits(&folder, &tokens).unwrap();
    assert!(
        max_diff(&got, &want) < 1e-4,
        "HF phi3: {}",
        max_diff(&got, &want)
    );
    let f32_gguf = dir.join("phi3.gguf");
    write_gguf(&t, &f32_gguf, false);
    let got = logits(&f32_gguf, &tokens).unwrap();
    assert!(
        max_diff(&got, &want) < 1e-4,
        "GGUF phi3: {}",
        max_diff(&got, &want)
    );
    // Q8_0 rows split as bytes: each part holds exactly the blocks of its own rows
    let q8_gguf = dir.join("phi3-q8_0.gguf");
    write_gguf(&t, &q8_gguf, true);
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
    let got = logits(&q8_gguf, &tokens).unwrap();
    assert!(got.iter().all(|v| v.is_finite()));
    // a trained sliding window caps the context
    let windowed = dir.join("windowed");
    write_folder(&t, &windowed, "phi3", ", \"sliding_window\": 47");
    let files = ModelFiles::open(&windowed).unwrap();
    assert_eq!(files.weights().unwrap().config.context_length, 47);
    std::fs::remove_dir_all(&dir).ok();
}
