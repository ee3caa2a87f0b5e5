//! Browser tests of the GPU forward pass (wasm-bindgen-test in headless Chromium on WebGPU;
//! SwiftShader in CI) against the float64 goldens: the checks of `tests/gpu/forward_golden.rs` on
//! the tiny fixture models (compiled in), and SmolLM2-135M fetched from the model server that
//! `./build.sh test` starts. A missing WebGPU adapter fails.

#![cfg(target_arch = "wasm32")]

use crate::common;

use common::browser_log as log;

use common::forward_cases::{self, Decode};
use common::golden::Golden;
use emberlm::forward::Forward;
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

/// Every golden prompt of every tiny model: prefill in one chunk and in chunks of 5; decode
/// token by token on the longest one (every step is a submit and a readback, slow on
/// SwiftShader). Logits within 2e-3 of f64, NLL within 1e-3. Greedy runs (the argmax chain)
/// are checked on the HF folder below and on SmolLM2, and natively on every tiny model.
#[wasm_bindgen_test]
async fn tiny_models_match_f64_goldens() {
    let (ctx, cache) = common::shared_browser_gpu().await;
    for (name, gguf, golden) in common::web_fixtures::TINY_GGUFS {
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

/// SmolLM2-135M Q4_1 on its first golden prompt: the teacher-forced top-5 within 2e-2 of f64
/// (NLL within 1e-2) and the 16 greedy tokens.
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
    forward_cases::check_greedy(ctx, &mut fwd, r, 16)
        .await
        .unwrap_or_else(|e| panic!("SmolLM2 greedy: {e}"));
    log(&format!(
        "browser: SmolLM2 greedy: {} tokens as f64 ({:.1} s)",
        r.f64_greedy_tokens.len().min(16),
        (now_ms() - start) / 1e3
    ));
}
