//! Qwen3 (Llama's graph with each query and key head RMS-normalised before RoPE, rotate-half
//! RoPE, no biases) in both forms the engine loads: the tiny Llama's Hugging Face folder given
//! `model_type: qwen3` and random `q_norm` / `k_norm` gains, and the same weights written as a
//! `qwen3` GGUF (unpermuted, as llama.cpp's converter leaves Qwen3's). Both run on the GPU
//! within rounding of the CPU reference, agree with each
//! other, and the norms change the logits (a graph that skipped them would fail).

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use common::model_forms::{
    as_f32, hf_folder, logits, max_diff, tiny_llama_tensors, write_gguf, Tensors,
};
use emberlm::loader::ModelFiles;
use rand::{Rng, SeedableRng};

/// The tiny Llama's tensors plus random QK-norm gains (`[head_dim]` = 16).
fn qwen3_tensors() -> Tensors {
    let mut out = tiny_llama_tensors();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x0_3e3);
    for layer in 0..2 {
        for norm in ["q_norm", "k_norm"] {
            let values = (0..16).map(|_| rng.random_range(0.3f32..2.0)).collect();
            out.insert(
                format!("model.layers.{layer}.self_attn.{norm}.weight"),
                (vec![16], values),
            );
        }
    }
    out
}

fn close(got: &[f32], want: &[Vec<f32>], what: &str) {
    let vocab = want[0].len();
    for (t, row) in want.iter().enumerate() {
        for (i, (&g, &r)) in got[t * vocab..][..vocab].iter().zip(row).enumerate() {
            assert!(
                (g - r).abs() <= 2e-3 + 1e-3 * r.abs(),
                "{what}: token {t} logit {i}: {g} vs {r}"
            );
        }
    }
}

#[test]
fn qwen3_folders_and_ggufs_run_as_the_reference_with_their_qk_norms() {
    let tensors = qwen3_tensors();
    let dir = std::env::temp_dir().join(format!("emberlm-qwen3-{}", std::process::id()));
    let (hf, plain, gguf) = (dir.join("hf"), dir.join("llama"), dir.join("qwen3.gguf"));
    hf_folder(&tensors, &hf, "qwen3");
    write_gguf(&tensors, &gguf, "qwen3", as_f32);
    for path in [&hf, &gguf] {
        let files = ModelFiles::open(path).unwrap();
        let config = files.weights().unwrap().config.clone();
        assert!(config.qk_norm, "{}: QK-norm", path.display());
    }
    let tokens: Vec<u32> = (0..40u32).map(|i| (i * 37 + 11) % 512).collect();
    let Some((from_hf, reference)) = logits(&hf, &tokens) else {
        return;
    };
    close(&from_hf, &reference, "HF qwen3 vs reference");
    let (from_gguf, gguf_reference) = logits(&gguf, &tokens).unwrap();
    close(&from_gguf, &gguf_reference, "GGUF qwen3 vs reference");
    close(&from_gguf, &reference, "GGUF vs HF qwen3");
    // the same weights as a llama folder leave the gains unread: the logits move
    hf_folder(&tensors, &plain, "llama");
    let (from_llama, _) = logits(&plain, &tokens).unwrap();
    let moved = max_diff(&from_llama, &from_hf);
    assert!(moved > 0.05, "the QK-norm gains changed nothing: {moved}");
    std::fs::remove_dir_all(&dir).ok();
}
