//! Qwen2 (Llama's graph with biases on the Q, K and V projections and rotate-half RoPE) in
//! both forms the engine loads: the tiny Llama's Hugging Face folder given `model_type:
//! qwen2` and random q/k/v biases, and the same weights written as a `qwen2` GGUF (tensors
//! unpermuted, as llama.cpp's converter leaves Qwen2's). Both run on the GPU within rounding
//! of the CPU reference, agree with each other, and the biases change the logits (a loader
//! that dropped them would fail).

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use std::path::Path;

use common::model_forms::{as_f32, hf_folder, logits, tiny_llama_tensors, write_gguf, Tensors};
use emberlm::loader::ModelFiles;
use rand::{Rng, SeedableRng};

/// The tiny Llama's tensors plus random q/k/v biases.
fn qwen2_tensors() -> Tensors {
    let mut out = tiny_llama_tensors();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x0_2e2);
    for layer in 0..2 {
        for (proj, n) in [("q_proj", 64), ("k_proj", 32), ("v_proj", 32)] {
            let values = (0..n).map(|_| rng.random_range(-0.5f32..0.5)).collect();
            out.insert(
                format!("model.layers.{layer}.self_attn.{proj}.bias"),
                (vec![n], values),
            );
        }
    }
    out
}

/// Every row's logits (GPU, reference) and whether the model loaded with q/k/v biases.
fn run(path: &Path, tokens: &[u32]) -> Option<(Vec<f32>, Vec<Vec<f32>>, bool)> {
    let (gpu, want) = logits(path, tokens)?;
    let files = ModelFiles::open(path).unwrap();
    let weights = files.weights().unwrap();
    let bias = weights.config.qkv_bias && weights.tensors.contains_key("blk.1.attn_v.bias");
    Some((gpu, want, bias))
}

#[test]
fn qwen2_folders_and_ggufs_run_as_the_reference_with_their_biases() {
    let tensors = qwen2_tensors();
    let dir = std::env::temp_dir().join(format!("emberlm-qwen2-{}", std::process::id()));
    let (hf, plain, gguf) = (dir.join("hf"), dir.join("llama"), dir.join("qwen2.gguf"));
    hf_folder(&tensors, &hf, "qwen2");
    write_gguf(&tensors, &gguf, "qwen2", as_f32);
    let tokens: Vec<u32> = (0..48u32).map(|i| (i * 53 + 7) % 512).collect();
    let Some((from_hf, reference, bias)) = run(&hf, &tokens) else {
        return;
    };
    assert!(bias, "the folder's config says qwen2 and its biases load");
    let vocab = 512;
    let close = |got: &[f32], want: &[Vec<f32>], what: &str| {
        for (t, row) in want.iter().enumerate() {
            for (i, (&g, &r)) in got[t * vocab..][..vocab].iter().zip(row).enumerate() {
                assert!(
                    (g - r).abs() <= 2e-3 + 1e-3 * r.abs(),
                    "{what}: token {t} logit {i}: {g} vs {r}"
                );
            }
        }
    };
    close(&from_hf, &reference, "HF qwen2 vs reference");
    let (from_gguf, gguf_reference, gguf_bias) = run(&gguf, &tokens).unwrap();
    assert!(
        gguf_bias,
        "the GGUF's architecture is qwen2 and its biases load"
    );
    close(&from_gguf, &gguf_reference, "GGUF qwen2 vs reference");
    close(&from_gguf, &reference, "GGUF vs HF qwen2");
    // without the biases (a llama folder ignores them: they are not part of its graph), the
    // logits move
    let no_bias: Tensors = tensors
        .iter()
        .filter(|(n, _)| !n.ends_with("_proj.bias"))
        .map(|(n, t)| (n.clone(), t.clone()))
        .collect();
    hf_folder(&no_bias, &plain, "llama");
    let (from_llama, _, _) = run(&plain, &tokens).unwrap();
    let moved = from_llama
        .iter()
        .zip(&from_hf)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(moved > 0.05, "the q/k/v biases changed nothing: {moved}");
    std::fs::remove_dir_all(&dir).ok();
}
