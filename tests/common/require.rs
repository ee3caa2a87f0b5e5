//! What a native test does when the machine lacks what it needs (a GPU adapter, the SmolLM2
//! model file): skip with the reason printed, or fail where nothing may be skipped
//! (`EMBERLM_REQUIRE_GPU=1` for the GPU, as `./build.sh test` sets; `CI=true` for both).
//! Shared by the GPU tests (through `common`) and the tests that only need the CPU (included
//! with `#[path]`).

#![allow(dead_code)]

/// Whether `name` is set to `1` or `true`.
fn env_on(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// Whether the tests run in CI (`CI=true`), where nothing may be skipped for want of a GPU or
/// a model file.
pub fn in_ci() -> bool {
    env_on("CI")
}

/// Whether a missing GPU adapter fails the test instead of skipping it: with
/// `EMBERLM_REQUIRE_GPU=1` (as `./build.sh test` sets) or in CI.
pub fn gpu_required() -> bool {
    env_on("EMBERLM_REQUIRE_GPU") || in_ci()
}

/// For tests of the `emberlm` binary: whether its `stderr` says it found no GPU adapter, in
/// which case the test should stop (the reason is printed). Where [`gpu_required`] holds, that
/// fails the test instead.
pub fn cli_found_no_gpu(stderr: &str) -> bool {
    if !stderr.contains("no GPU adapter") {
        return false;
    }
    if gpu_required() {
        panic!("a GPU is required (EMBERLM_REQUIRE_GPU=1 or CI=true) but the binary found none: {stderr}");
    }
    eprintln!("SKIPPED: {stderr}");
    true
}

/// SmolLM2-135M-Instruct Q4_1, relative to the crate root (`./build.sh setup` fetches it).
pub const SMOLLM2: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// Gemma 3 270M Q4_K_M, relative to the crate root (`./build.sh setup` fetches it).
pub const GEMMA3: &str = "models/gemma-3-270m-q4_k_m.gguf";

/// all-MiniLM-L6-v2's weights in its Hugging Face folder, relative to the crate root
/// (`./build.sh setup` fetches it).
pub const MINILM: &str = "models/all-MiniLM-L6-v2/model.safetensors";

/// The path of SmolLM2 ([`SMOLLM2`]) when it is present, or `None` (with the reason printed)
/// when it is absent. In CI ([`in_ci`]) an absent model fails the test, saying how to fetch it.
pub fn smollm2() -> Option<std::path::PathBuf> {
    real_model(SMOLLM2)
}

/// The path of Gemma 3 270M ([`GEMMA3`]), as [`smollm2`].
pub fn gemma3() -> Option<std::path::PathBuf> {
    real_model(GEMMA3)
}

/// The path of all-MiniLM-L6-v2's weights ([`MINILM`]; the folder holds its config and
/// tokenizer), as [`smollm2`].
pub fn minilm() -> Option<std::path::PathBuf> {
    real_model(MINILM)
}

/// Whether the quick tier runs (`./build.sh test --quick` sets `EMBERLM_TEST_TIER=quick`): the
/// real-model tests then skip, saying so; the full tier (and CI) runs them.
pub fn quick_tier() -> bool {
    std::env::var("EMBERLM_TEST_TIER").is_ok_and(|v| v == "quick") && !in_ci()
}

fn real_model(relative: &str) -> Option<std::path::PathBuf> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    if quick_tier() {
        eprintln!(
            "SKIPPED: {} (real-model tests run in the full tier, not with --quick)",
            path.display()
        );
        return None;
    }
    if path.is_file() {
        return Some(path);
    }
    if in_ci() {
        panic!(
            "{} is absent, and CI=true runs every model test: fetch it with `./build.sh setup` \
             (see tests/fixtures/README.md)",
            path.display()
        );
    }
    eprintln!(
        "SKIPPED: {} is absent (`./build.sh setup` fetches it; with CI=true this fails)",
        path.display()
    );
    None
}
