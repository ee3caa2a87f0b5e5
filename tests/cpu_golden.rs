//! The CPU backend against the float64 goldens: every fixture model (GGUF in every weight type
//! and HF folders), SmolLM2 and Gemma 3, through prefill, decode and greedy decoding. No GPU is
//! involved.

#![cfg(not(target_arch = "wasm32"))]

mod common;

use std::path::{Path, PathBuf};

use common::golden::Golden;
use emberlm::loader::ModelFiles;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn check(model: &Path, golden_file: &str, tol: f64, decode_all: bool) -> f64 {
    let golden = Golden::parse(
        &std::fs::read_to_string(root().join("tests/fixtures/golden").join(golden_file)).unwrap(),
    );
    let files = ModelFiles::open(model).unwrap();
    let weights = files.weights().unwrap();
    let name = model.display().to_string();
    let worst = common::cpu_cases::check_model(
        &name,
        &weights,
        &golden,
        tol,
        tol / 2.0,
        decode_all,
        tol < 0.01,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{name}: max |Δ logit| vs f64 = {worst:.2e}");
    worst
}

/// Fixture models and their goldens, with the tolerance of each weight type.
const TINY: &[(&str, &str, f64)] = &[
    ("tiny-gpt2-f32.gguf", "tiny-gpt2-f32.golden.json", 2e-3),
    ("tiny-gpt2-f16.gguf", "tiny-gpt2-f16.golden.json", 2e-3),
    ("tiny-gpt2", "tiny-gpt2-f32.golden.json", 2e-3),
    ("tiny-llama-f32.gguf", "tiny-llama-f32.golden.json", 2e-3),
    ("tiny-llama-q8_0.gguf", "tiny-llama-q8_0.golden.json", 5.0),
    ("tiny-llama-q4_0.gguf", "tiny-llama-q4_0.golden.json", 5.0),
    ("tiny-llama-q4_1.gguf", "tiny-llama-q4_1.golden.json", 5.0),
    ("tiny-llama", "tiny-llama-f32.golden.json", 2e-3),
    (
        "tiny-llama-256-f32.gguf",
        "tiny-llama-256-f32.golden.json",
        2e-3,
    ),
    (
        "tiny-llama-256-q4_k_m.gguf",
        "tiny-llama-256-q4_k_m.golden.json",
        1.0,
    ),
    (
        "tiny-llama-256-q5_k_m.gguf",
        "tiny-llama-256-q5_k_m.golden.json",
        1.0,
    ),
    (
        "tiny-llama-256-q6_k.gguf",
        "tiny-llama-256-q6_k.golden.json",
        1.0,
    ),
    ("tiny-llama-256", "tiny-llama-256-f32.golden.json", 2e-3),
    (
        "tiny-llama-spm-f32.gguf",
        "tiny-llama-spm-f32.golden.json",
        2e-3,
    ),
    ("tiny-llama-spm", "tiny-llama-spm-f32.golden.json", 2e-3),
];

#[test]
fn tiny_models_match_f64_goldens_on_the_cpu() {
    let fx = root().join("tests/fixtures");
    for (model, golden, tol) in TINY {
        check(&fx.join(model), golden, *tol, true);
    }
}

#[test]
fn smollm2_matches_f64_goldens_on_the_cpu() {
    let Some(model) = common::require::smollm2() else {
        return;
    };
    check(&model, "smollm2-135m-q4_1.golden.json", 1.0, false);
}

#[test]
fn gemma3_matches_f64_goldens_on_the_cpu() {
    let Some(model) = common::require::gemma3() else {
        return;
    };
    check(&model, "gemma-3-270m-q4_k_m.golden.json", 1.0, false);
}
