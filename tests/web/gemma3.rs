//! Gemma 3 in the browser (WebGPU) with its tied embedding split across storage bindings: the
//! tiny Gemma 3 fixture (512 × 64 f32 rows of 256 bytes, 128 KiB) with the binding capped at
//! 40,000 bytes, so that the token lookup and the tied head each read four parts (156, 156, 156
//! and 44 rows). Every golden prompt prefilled in one chunk and in chunks of 5, and the longest
//! decoded token by token, within 2e-3 of f64 (NLL within 1e-3).
//!
//! The real Gemma 3 270M (its 178 MB embedding split at WebGPU's default 128 MiB) runs natively
//! on lavapipe, whose binding limit splits it the same way (`tests/gpu/gemma3_golden.rs`), and
//! the same kernels run in the browser here; the architecture's own kernels (local attention,
//! GELU, the extra norms) run unsplit in `forward::tiny_models_match_f64_goldens`.

#![cfg(target_arch = "wasm32")]

use crate::common;

use common::browser_log as log;
use common::forward_cases::{self, Decode};
use common::golden::Golden;
use emberlm::backend::gpu::KernelCache;
use emberlm::loader::ModelFiles;
use emberlm::{GpuContext, GpuOptions};
use wasm_bindgen_test::wasm_bindgen_test;

/// The binding cap: under the embedding's 131,072 bytes and over every other weight's.
const CAP: u64 = 40_000;

#[wasm_bindgen_test]
async fn gemma3_with_a_split_embedding_matches_f64_goldens() {
    let name = "tiny-gemma3-f32.gguf";
    let (_, gguf, golden) = common::web_fixtures::TINY_GGUFS
        .iter()
        .find(|(n, _, _)| *n == name)
        .unwrap_or_else(|| panic!("{name} is not a tiny fixture"));
    let ctx = GpuContext::new(GpuOptions {
        binding_cap: Some(CAP),
        ..GpuOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("WebGPU is required for the browser tests: {e}"));
    assert_eq!(ctx.binding_limit(), CAP);
    let start = js_sys::Date::now();
    let golden = Golden::parse(golden);
    let files = ModelFiles::from_bytes(gguf.to_vec(), name).unwrap();
    let weights = files.weights().unwrap();
    let config = &weights.config;
    let embedding_bytes = (config.vocab_size * config.hidden_size * 4) as u64;
    assert!(
        embedding_bytes > 3 * CAP,
        "the embedding ({embedding_bytes} bytes) must need four bindings of {CAP}"
    );
    let cache = KernelCache::new();
    let worst = forward_cases::check_model(
        name,
        &ctx,
        &cache,
        &weights,
        &golden,
        2e-3,
        1e-3,
        Decode::LongestWithoutGreedy,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    log(&format!(
        "browser: {name}, embedding split at {CAP} bytes: max |Δ logit| vs f64 = {worst:.2e} ({:.1} s)",
        (js_sys::Date::now() - start) / 1e3
    ));
}
