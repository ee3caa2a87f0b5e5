//! Test helpers shared by the native GPU tests and the browser tests.

#![allow(dead_code)]

pub mod attention_cases;
pub mod cpu_cases;
pub mod cpu_kernel_cases;
pub mod forward_cases;
pub mod gguf_meta;
pub mod golden;
pub mod kernel_cases;
pub mod kv_kind_cases;
pub mod linear_cases;
pub mod linear_fused_cases;
pub mod linear_kv_block_cases;
#[cfg(not(target_arch = "wasm32"))]
pub mod memory_files;
#[cfg(not(target_arch = "wasm32"))]
pub mod model_forms;
pub mod ops_cases;
#[cfg(not(target_arch = "wasm32"))]
pub mod own_process;
#[cfg(not(target_arch = "wasm32"))]
pub mod require;
pub mod select_ref;
#[cfg(target_arch = "wasm32")]
pub mod web_engine;
#[cfg(target_arch = "wasm32")]
pub mod web_fixtures;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Speculative decoding from `source` with `k` drafts per step, the draft length adaptive or
/// not, the other settings at their defaults.
pub fn spec(
    source: emberlm::session::SpecSource,
    k: usize,
    adaptive: bool,
) -> emberlm::session::SpecOptions {
    emberlm::session::SpecOptions {
        source: Some(source),
        k,
        adaptive,
        ..emberlm::session::SpecOptions::default()
    }
}

/// A fresh random seed, or `EMBERLM_TEST_SEED` when set (to replay a failure). The browser
/// has no environment, so there the value seen when the tests were compiled is used.
pub fn seed() -> u64 {
    let fixed = std::env::var("EMBERLM_TEST_SEED")
        .ok()
        .or(option_env!("EMBERLM_TEST_SEED").map(String::from));
    if let Some(s) = fixed.and_then(|s| s.parse().ok()) {
        return s;
    }
    getrandom::u64().unwrap_or(0x5eed)
}

/// A seeded generator; the seed goes to `log` so any failure can be replayed.
pub fn rng(test: &str, log: &dyn Fn(&str)) -> ChaCha8Rng {
    let s = seed();
    log(&format!(
        "{test}: seed {s} (replay with EMBERLM_TEST_SEED={s})"
    ));
    ChaCha8Rng::seed_from_u64(s)
}

/// A GPU context for native tests, or `None` (with the reason printed) when the machine has no
/// usable adapter. Where [`require::gpu_required`] holds, a missing adapter fails the test
/// instead.
#[cfg(not(target_arch = "wasm32"))]
pub fn native_gpu(options: emberlm::GpuOptions) -> Option<emberlm::GpuContext> {
    match pollster::block_on(emberlm::GpuContext::new(options)) {
        Ok(ctx) => {
            eprintln!("GPU adapter: {}", ctx.report());
            Some(ctx)
        }
        Err(e) if require::gpu_required() => {
            panic!("a GPU is required (EMBERLM_REQUIRE_GPU=1 or CI=true) but none is usable: {e}")
        }
        Err(e) => {
            eprintln!(
                "SKIPPED: no usable GPU ({e}); set EMBERLM_REQUIRE_GPU=1 to make this a failure"
            );
            None
        }
    }
}

/// The mean NLL of a `cpu_perplexity` case of `tests/fixtures/native_browser_agreement.json`,
/// exactly: from its IEEE bits (`nll_bits`), which no JSON number parser can round.
pub fn agreement_nll(case: &serde_json::Value) -> f64 {
    let bits = case["nll_bits"]
        .as_str()
        .expect("a cpu_perplexity case has nll_bits");
    f64::from_bits(u64::from_str_radix(bits, 16).expect("nll_bits are 16 hex digits"))
}

/// A GPU context and a kernel cache shared by every native test of this binary that asks for
/// the same `options` (as [`native_gpu`] otherwise): a model's pipelines are compiled once per
/// binary instead of once per model and test (lavapipe compiles each for a tenth of a second or
/// more, and the tiny models share most of theirs). For tests that only run kernels and read
/// results: a test that destroys its device, counts what a device allocated or compiled, or
/// provokes GPU errors takes its own context from [`native_gpu`].
#[cfg(not(target_arch = "wasm32"))]
pub fn shared_native_gpu(
    options: emberlm::GpuOptions,
) -> Option<(
    &'static emberlm::GpuContext,
    &'static emberlm::backend::gpu::KernelCache,
)> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock, PoisonError};
    type Shared = (
        &'static emberlm::GpuContext,
        &'static emberlm::backend::gpu::KernelCache,
    );
    static SHARED: OnceLock<Mutex<HashMap<String, Shared>>> = OnceLock::new();
    // GpuOptions' fields are plain values: their Debug form tells two option sets apart
    let key = format!("{options:?}");
    let mut shared = SHARED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(&found) = shared.get(&key) {
        return Some(found);
    }
    let ctx: &'static emberlm::GpuContext = Box::leak(Box::new(native_gpu(options)?));
    let cache: &'static emberlm::backend::gpu::KernelCache =
        Box::leak(Box::new(emberlm::backend::gpu::KernelCache::new()));
    shared.insert(key, (ctx, cache));
    Some((ctx, cache))
}

/// Writes a line to the browser test's output.
#[cfg(target_arch = "wasm32")]
pub fn browser_log(msg: &str) {
    wasm_bindgen_test::console_log!("{msg}");
}

/// The browser's WebGPU context; the browser tests require one (no skipping there).
#[cfg(target_arch = "wasm32")]
pub async fn browser_gpu() -> emberlm::GpuContext {
    let ctx = emberlm::GpuContext::new(emberlm::GpuOptions::default())
        .await
        .unwrap_or_else(|e| panic!("WebGPU is required for the browser tests: {e}"));
    browser_log(&format!("GPU adapter: {}", ctx.report()));
    ctx
}

/// One WebGPU device and one pipeline cache shared by the page's kernel and forward tests:
/// SwiftShader compiles each pipeline for a tenth of a second to a second, and these tests build
/// the same pipelines over and over (every model's linears are the linear tests' kernels). Tests
/// that destroy their device or hand it to a session take their own from [`browser_gpu`].
#[cfg(target_arch = "wasm32")]
pub async fn shared_browser_gpu() -> (
    &'static emberlm::GpuContext,
    &'static emberlm::backend::gpu::KernelCache,
) {
    type Shared = (
        &'static emberlm::GpuContext,
        &'static emberlm::backend::gpu::KernelCache,
    );
    thread_local! {
        static SHARED: std::cell::Cell<Option<Shared>> = const { std::cell::Cell::new(None) };
    }
    if let Some(shared) = SHARED.with(|s| s.get()) {
        return shared;
    }
    let ctx: &'static emberlm::GpuContext = Box::leak(Box::new(browser_gpu().await));
    let cache: &'static emberlm::backend::gpu::KernelCache =
        Box::leak(Box::new(emberlm::backend::gpu::KernelCache::new()));
    SHARED.with(|s| s.set(Some((ctx, cache))));
    (ctx, cache)
}

#[cfg(target_arch = "wasm32")]
#[wasm_bindgen::prelude::wasm_bindgen]
extern "C" {
    /// The global `fetch` (window or worker).
    #[wasm_bindgen(js_name = fetch)]
    fn fetch_url(url: &str) -> js_sys::Promise;
}

#[cfg(target_arch = "wasm32")]
/// Fetches `url` into one `Vec` in wasm memory (the JS `ArrayBuffer` is garbage afterwards).
pub async fn fetch_bytes(url: &str) -> Result<Vec<u8>, String> {
    use wasm_bindgen::JsCast;
    use wasm_bindgen_futures::JsFuture;
    let js = |e: wasm_bindgen::JsValue| format!("{url}: {e:?}");
    let response: web_sys::Response = JsFuture::from(fetch_url(url))
        .await
        .map_err(js)?
        .dyn_into()
        .map_err(js)?;
    if !response.ok() {
        return Err(format!(
            "{url}: HTTP {} {}",
            response.status(),
            response.status_text()
        ));
    }
    let buffer = JsFuture::from(response.array_buffer().map_err(js)?)
        .await
        .map_err(js)?;
    Ok(js_sys::Uint8Array::new(&buffer).to_vec())
}

/// The URL of `tests/fixtures/NAME` for the browser tests: the compile-time
/// `EMBERLM_TEST_SERVER_URL` (the root of this repository on the model server `./build.sh test`
/// starts) joined with the fixture's path. Unset, `None` with the reason logged for `test`;
/// compiled with `CI=true`, that fails the test instead.
#[cfg(target_arch = "wasm32")]
pub fn fixture_url(test: &str, name: &str) -> Option<String> {
    if let Some(root) = option_env!("EMBERLM_TEST_SERVER_URL").filter(|u| !u.is_empty()) {
        return Some(format!("{root}tests/fixtures/{name}"));
    }
    let reason = "EMBERLM_TEST_SERVER_URL was not set at compile time (`./build.sh test` serves \
                  the repository on loopback and sets it)";
    if option_env!("CI").is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true")) {
        panic!("{test}: CI=true runs every test, but {reason}");
    }
    browser_log(&format!("SKIPPED {test}: {reason}"));
    None
}

/// The URL of SmolLM2 for the browser tests (the page cannot read files): the compile-time
/// `EMBERLM_TEST_MODEL_URL`, which `./build.sh test` sets to the GGUF on its model server. When
/// it was not set, `None` with the reason logged for `test`; compiled with `CI=true`, that fails
/// the test instead, saying how to provide the model.
#[cfg(target_arch = "wasm32")]
pub fn smollm2_url(test: &str) -> Option<&'static str> {
    if let Some(url) = option_env!("EMBERLM_TEST_MODEL_URL").filter(|u| !u.is_empty()) {
        return Some(url);
    }
    let reason = "EMBERLM_TEST_MODEL_URL was not set at compile time (`./build.sh setup` fetches \
                  the model into models/, `./build.sh test` serves it and sets the URL)";
    if option_env!("CI").is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true")) {
        panic!("{test}: CI=true runs every model test, but {reason}");
    }
    browser_log(&format!("SKIPPED {test}: {reason}"));
    None
}
