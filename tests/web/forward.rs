//! Browser tests of the GPU forward pass (wasm-bindgen-test in headless Chromium on WebGPU;
//! SwiftShader in CI) against the float64 goldens: the checks of `tests/gpu/forward_golden.rs` on
//! the tiny fixture models (compiled in), and SmolLM2-135M fetched from the model server that
//! `./build.sh test` starts. A missing WebGPU adapter fails.

#![cfg(target_arch = "wasm32")]

use crate::common;

use common::browser_log as log;

use common::forward_cases::{self, Decode};
use common::golden::Golden;
use emberlm::backend::gpu::Forward;
use emberlm::loader::ModelFiles;
use wasm_bindgen_test::wasm_bindgen_test;

/// Milliseconds since the page started.
fn now_ms() -> f64 {
    js_sys::Date::now()
}

/// A Hugging Face folder in the browser (files as a picker would give them): GPT-2, whose
/// Conv1D weights are transposed on load, against its f32 GGUF twin's goldens.
#[wasm_bindgen_test]
async fn hf_folder_matches_its_gguf_twins_goldens() {
    use emberlm::format::safetensors::HfFolder;

    let (ctx, cache) = common::shared_browser_gpu().await;
    let files = vec![
        (
            "config.json".to_string(),
            include_bytes!("../fixtures/tiny-gpt2/config.json").to_vec(),
        ),
        (
            "model.safetensors".to_string(),
            include_bytes!("../fixtures/tiny-gpt2/model.safetensors").to_vec(),
        ),
        (
            "tokenizer.json".to_string(),
            include_bytes!("../fixtures/tiny-gpt2/tokenizer.json").to_vec(),
        ),
    ];
    let folder = HfFolder::from_files("tiny-gpt2", files).unwrap();
    let weights = folder.load().unwrap();
    let golden = Golden::parse(include_str!("../fixtures/golden/tiny-gpt2-f32.golden.json"));
    let worst = forward_cases::check_model(
        "tiny-gpt2 (HF)",
        ctx,
        cache,
        &weights,
        &golden,
        2e-3,
        1e-3,
        Decode::Longest,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    log(&format!(
        "browser: tiny-gpt2 (HF folder): max |Δ logit| vs f64 = {worst:.2e}"
    ));
}

/// The tiny models [`tiny_models_match_f64_goldens`] runs in the browser: every architecture,
/// and the weight types whose fused kernels (Q/K/V with RoPE, norms folded in, GLU epilogues)
/// differ in the browser's shader compiler: f32, f16, q8_0, q4_1 (the default model's) and the
/// k-quants (q4_k_m holds q4_k and q6_k tensors). The other fixtures (gpt2-f32, llama-f32,
/// llama-q8_0, llama-q4_0, llama-256-f32, llama-256-q5_k_m, llama-256-q6_k) repeat an
/// architecture and a type covered here; their weight kernels run in the browser in
/// `linear::linear_matches_reference`, and every fixture runs natively on the GPU
/// (`tests/gpu/forward_golden.rs`) and in WebAssembly on the CPU (`cpu.rs`). On SwiftShader a
/// model's time is almost all the compiling of its pipelines (~20-50 s a model on two cores).
const BROWSER_TINY_MODELS: [&str; 9] = [
    "tiny-gpt2-f16.gguf",
    "tiny-llama-spm-f32.gguf",
    "tiny-llama-q4_1.gguf",
    "tiny-llama-256-q4_k_m.gguf",
    "tiny-qwen2-f32.gguf",
    "tiny-qwen3-q8_0.gguf",
    "tiny-phi3-f32.gguf",
    "tiny-gemma3-f32.gguf",
    "tiny-llama3-rope-f32.gguf",
];

/// Every golden prompt of the tiny models in [`BROWSER_TINY_MODELS`]: prefill in one chunk and
/// in chunks of 5; decode token by token on the longest one (every step is a submit and a
/// readback, slow on SwiftShader). Logits within 2e-3 of f64, NLL within 1e-3. Greedy runs (the
/// argmax chain) are checked on the HF folder above and on SmolLM2, and natively on every tiny
/// model.
#[wasm_bindgen_test]
async fn tiny_models_match_f64_goldens() {
    let (ctx, cache) = common::shared_browser_gpu().await;
    let fixtures = common::web_fixtures::TINY_GGUFS;
    for wanted in BROWSER_TINY_MODELS {
        assert!(
            fixtures.iter().any(|(name, _, _)| *name == wanted),
            "{wanted} is not a tiny fixture"
        );
    }
    for (name, gguf, golden) in fixtures {
        if !BROWSER_TINY_MODELS.contains(&name) {
            continue;
        }
        let start = now_ms();
        let golden = Golden::parse(golden);
        let files = ModelFiles::from_bytes(gguf.to_vec(), name).unwrap();
        let weights = files.weights().unwrap();
        let worst = forward_cases::check_model(
            name,
            ctx,
            cache,
            &weights,
            &golden,
            2e-3,
            1e-3,
            Decode::LongestWithoutGreedy,
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        log(&format!(
            "browser: {name}: max |Δ logit| vs f64 = {worst:.2e} ({:.1} s)",
            (now_ms() - start) / 1e3
        ));
    }
}

/// Tokens the real-model browser checks decode one per step through the KV cache.
const TAIL: usize = 4;

/// SmolLM2-135M Q4_1 on its first golden prompt: the teacher-forced top-5 within 2e-2 of f64
/// (NLL within 1e-2), then its last [`TAIL`] tokens decoded one per step, within 2e-2.
#[wasm_bindgen_test]
async fn smollm2_matches_f64_goldens() {
    let Some(url) = common::smollm2_url("smollm2_matches_f64_goldens") else {
        return;
    };
    let (ctx, cache) = common::shared_browser_gpu().await;
    let start = now_ms();
    let bytes = common::fetch_bytes(url)
        .await
        .unwrap_or_else(|e| panic!("fetching the model failed: {e}"));
    log(&format!(
        "browser: fetched {} bytes from {url} ({:.1} s)",
        bytes.len(),
        (now_ms() - start) / 1e3
    ));
    let golden = Golden::parse(include_str!(
        "../fixtures/golden/smollm2-135m-q4_1.golden.json"
    ));
    let r = &golden.results[0];
    let mut fwd = {
        let files = ModelFiles::from_bytes(bytes, &golden.model).unwrap();
        let weights = files.weights().unwrap();
        let context = r.sequence().len().next_power_of_two();
        Forward::new(ctx, cache, &weights, context, context)
            .await
            .unwrap_or_else(|e| panic!("SmolLM2: {e}"))
        // the file's bytes are freed here: the weights live on the GPU
    };
    log(&format!(
        "browser: SmolLM2 on the GPU ({:.1} s)",
        (now_ms() - start) / 1e3
    ));
    let worst = forward_cases::check_prefill(ctx, &mut fwd, r, 2e-2, 1e-2)
        .await
        .unwrap_or_else(|e| panic!("SmolLM2 prefill: {e}"));
    log(&format!(
        "browser: SmolLM2 {:?}: teacher-forced max |Δ logit| vs f64 = {worst:.2e} ({:.1} s)",
        r.prompt,
        (now_ms() - start) / 1e3
    ));
    // the last 4 tokens decoded one per step through the KV cache, their logits checked (the
    // argmax chain of all 16 greedy tokens is checked natively and on the CPU in WebAssembly)
    let worst = forward_cases::check_tail_after_prefill(ctx, &mut fwd, r, TAIL, 2e-2)
        .await
        .unwrap_or_else(|e| panic!("SmolLM2 decode: {e}"));
    log(&format!(
        "browser: SmolLM2 last {TAIL} tokens decoded: max |Δ logit| vs f64 = {worst:.2e} ({:.1} s)",
        (now_ms() - start) / 1e3
    ));
}
