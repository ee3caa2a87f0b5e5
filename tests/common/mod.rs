//! Test helpers shared by the native GPU tests and the browser tests.

#![allow(dead_code)]

pub mod attention_cases;
pub mod forward_cases;
pub mod golden;
pub mod kernel_cases;
pub mod linear_cases;
pub mod linear_fused_cases;
pub mod ops_cases;
pub mod select_ref;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

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
/// usable adapter. With `EMBERLM_REQUIRE_GPU=1` (as `./build.sh test` sets) a missing adapter
/// fails the test instead of skipping it.
#[cfg(not(target_arch = "wasm32"))]
pub fn native_gpu(options: emberlm::GpuOptions) -> Option<emberlm::GpuContext> {
    match pollster::block_on(emberlm::GpuContext::new(options)) {
        Ok(ctx) => {
            eprintln!("GPU adapter: {}", ctx.report());
            Some(ctx)
        }
        Err(e) if std::env::var("EMBERLM_REQUIRE_GPU").is_ok_and(|v| v == "1") => {
            panic!("EMBERLM_REQUIRE_GPU=1 but no usable GPU: {e}")
        }
        Err(e) => {
            eprintln!(
                "SKIPPED: no usable GPU ({e}); set EMBERLM_REQUIRE_GPU=1 to make this a failure"
            );
            None
        }
    }
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
