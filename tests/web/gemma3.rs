//! Gemma 3 270M in the browser (WebGPU), fetched from the model server `./build.sh test`
//! runs: with the storage binding capped at WebGPU's default 128 MiB, its 178 MB tied
//! embedding is split across bindings as on lavapipe; the first golden prompt's teacher-forced
//! top-5 within 3e-2 of f64 (NLL within 1.5e-2), then its last 4 tokens decoded one per step
//! through the KV cache the prefill left (cut back to before them), within 3e-2.

#![cfg(target_arch = "wasm32")]

use crate::common;

use common::browser_log as log;
use common::forward_cases;
use common::golden::Golden;
use emberlm::forward::Forward;
use emberlm::gpu::KernelCache;
use emberlm::loader::ModelFiles;
use emberlm::{GpuContext, GpuOptions};
use wasm_bindgen_test::wasm_bindgen_test;

fn now_ms() -> f64 {
    js_sys::Date::now()
}

#[wasm_bindgen_test]
async fn gemma3_matches_f64_goldens_with_a_split_embedding() {
    let Some(url) = common::gemma3_url("gemma3_matches_f64_goldens_with_a_split_embedding") else {
        return;
    };
    let ctx = GpuContext::new(GpuOptions {
        binding_cap: Some(128 << 20),
        ..GpuOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("WebGPU is required for the browser tests: {e}"));
    log(&format!("GPU adapter: {}", ctx.report()));
    let start = now_ms();
    let bytes = common::fetch_bytes(url)
        .await
        .unwrap_or_else(|e| panic!("fetching the model failed: {e}"));
    let golden = Golden::parse(include_str!(
        "../fixtures/golden/gemma-3-270m-q4_k_m.golden.json"
    ));
    let r = &golden.results[0];
    let cache = KernelCache::new();
    let mut fwd = {
        let files = ModelFiles::from_bytes(bytes, &golden.model).unwrap();
        let weights = files.weights().unwrap();
        let context = r.sequence().len().next_power_of_two();
        Forward::new(&ctx, &cache, &weights, context, context)
            .await
            .unwrap_or_else(|e| panic!("Gemma 3: {e}"))
    };
    log(&format!(
        "browser: Gemma 3 on the GPU ({:.1} s)",
        (now_ms() - start) / 1e3
    ));
    let worst = forward_cases::check_prefill(&ctx, &mut fwd, r, 3e-2, 1.5e-2)
        .await
        .unwrap_or_else(|e| panic!("Gemma 3 prefill: {e}"));
    log(&format!(
        "browser: Gemma 3 {:?}: teacher-forced max |Δ logit| vs f64 = {worst:.2e} ({:.1} s)",
        r.prompt,
        (now_ms() - start) / 1e3
    ));
    // the last 4 tokens decoded one per step through the prefill's KV cache, their logits
    // checked (the argmax chain of every greedy token is checked natively,
    // tests/gpu/gemma3_golden.rs)
    let worst = forward_cases::check_tail_after_prefill(&ctx, &mut fwd, r, 4, 3e-2)
        .await
        .unwrap_or_else(|e| panic!("Gemma 3 decode: {e}"));
    log(&format!(
        "browser: Gemma 3 last 4 tokens decoded: max |Δ logit| vs f64 = {worst:.2e} ({:.1} s)",
        (now_ms() - start) / 1e3
    ));
}
