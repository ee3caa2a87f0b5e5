//! The GPU forward pass against the float64 goldens: every fixture model (GGUF and HF
//! folders) and SmolLM2, through prefill (one chunk and several) and through decode (one token
//! at a time through the KV cache), plus greedy decoding.

#![cfg(not(target_arch = "wasm32"))]

mod common;

use std::path::{Path, PathBuf};

use common::golden::Golden;
use emberlm::format::ModelFiles;
use emberlm::gpu::KernelCache;
use emberlm::model::forward::Forward;
use emberlm::{GpuContext, GpuOptions};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs every golden prompt of `golden_file` through `model` three ways and checks each.
/// `decode_prompts` limits the (slow, token-by-token) decode and greedy checks to the first
/// prompts; prefill is checked on all of them.
fn check(
    ctx: &GpuContext,
    model: &Path,
    golden_file: &str,
    tol: f64,
    nll_tol: f64,
    decode_prompts: usize,
) {
    let golden = Golden::parse(
        &std::fs::read_to_string(root().join("tests/fixtures/golden").join(golden_file)).unwrap(),
    );
    let files = ModelFiles::open(model).unwrap();
    let weights = files.weights().unwrap();
    let vocab = weights.config.vocab_size;
    let context = weights.config.context_length.min(256);
    let cache = KernelCache::new();
    let mut worst = 0.0f64;
    for chunk in [64, 5] {
        let mut fwd = pollster::block_on(Forward::new(ctx, &cache, &weights, context, chunk))
            .unwrap_or_else(|e| panic!("{}: {e}", model.display()));
        for (i, r) in golden.results.iter().enumerate() {
            let seq = r.sequence();
            fwd.truncate(0).unwrap();
            let logits = pollster::block_on(fwd.forward(ctx, &seq, true)).unwrap();
            worst = worst
                .max(r.check(&logits, vocab, tol, nll_tol).unwrap_or_else(|e| {
                    panic!("{} prefill (chunk {chunk}): {e}", model.display())
                }));
            if chunk == 5 && i < decode_prompts {
                fwd.truncate(0).unwrap();
                let mut rows = Vec::new();
                for &t in &seq {
                    rows.extend(pollster::block_on(fwd.forward(ctx, &[t], true)).unwrap());
                }
                worst = worst.max(
                    r.check(&rows, vocab, tol, nll_tol)
                        .unwrap_or_else(|e| panic!("{} decode: {e}", model.display())),
                );
                // greedy: prefill the prompt, then feed back the argmax
                fwd.truncate(0).unwrap();
                let mut last =
                    pollster::block_on(fwd.forward(ctx, &r.prompt_tokens, false)).unwrap();
                let mut generated = Vec::new();
                for _ in 0..r.f64_greedy_tokens.len() {
                    let next = last
                        .iter()
                        .enumerate()
                        .fold(
                            (0, f32::NEG_INFINITY),
                            |b, (i, &v)| if v > b.1 { (i, v) } else { b },
                        )
                        .0 as u32;
                    generated.push(next);
                    if generated.len() < r.f64_greedy_tokens.len() {
                        last = pollster::block_on(fwd.forward(ctx, &[next], false)).unwrap();
                    }
                }
                assert_eq!(
                    generated,
                    r.f64_greedy_tokens,
                    "{}: greedy {:?}",
                    model.display(),
                    r.prompt
                );
            }
        }
    }
    eprintln!("{}: max |Δ logit| vs f64 = {worst:.2e}", model.display());
}

#[test]
fn tiny_models_match_f64_goldens() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let fx = root().join("tests/fixtures");
    for (model, golden) in [
        ("tiny-gpt2-f32.gguf", "tiny-gpt2-f32.golden.json"),
        ("tiny-gpt2-f16.gguf", "tiny-gpt2-f16.golden.json"),
        ("tiny-gpt2", "tiny-gpt2-f32.golden.json"),
        ("tiny-llama-f32.gguf", "tiny-llama-f32.golden.json"),
        ("tiny-llama-q8_0.gguf", "tiny-llama-q8_0.golden.json"),
        ("tiny-llama-q4_0.gguf", "tiny-llama-q4_0.golden.json"),
        ("tiny-llama-q4_1.gguf", "tiny-llama-q4_1.golden.json"),
        ("tiny-llama", "tiny-llama-f32.golden.json"),
        ("tiny-llama-256-f32.gguf", "tiny-llama-256-f32.golden.json"),
        (
            "tiny-llama-256-q4_k_m.gguf",
            "tiny-llama-256-q4_k_m.golden.json",
        ),
        (
            "tiny-llama-256-q5_k_m.gguf",
            "tiny-llama-256-q5_k_m.golden.json",
        ),
        (
            "tiny-llama-256-q6_k.gguf",
            "tiny-llama-256-q6_k.golden.json",
        ),
        ("tiny-llama-256", "tiny-llama-256-f32.golden.json"),
        ("tiny-llama-spm-f32.gguf", "tiny-llama-spm-f32.golden.json"),
        ("tiny-llama-spm", "tiny-llama-spm-f32.golden.json"),
    ] {
        check(&ctx, &fx.join(model), golden, 2e-3, 1e-3, usize::MAX);
    }
}

#[test]
fn smollm2_matches_f64_goldens() {
    let model = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !model.is_file() {
        eprintln!(
            "SKIPPED: {} is absent (./build.sh setup fetches it)",
            model.display()
        );
        return;
    }
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    // decode and greedy on two of the four prompts: lavapipe takes about a second per token
    check(&ctx, &model, "smollm2-135m-q4_1.golden.json", 2e-2, 1e-2, 2);
}
