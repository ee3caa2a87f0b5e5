//! The CPU backend against the float64 goldens: every fixture model (GGUF in every weight type
//! and HF folders), SmolLM2 and Gemma 3, through prefill, decode and greedy decoding, within
//! the tolerances `common::cpu_cases::tolerance` derives from llama.cpp's own distance from
//! the same goldens. No GPU is involved.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use std::path::{Path, PathBuf};

use common::golden::{Golden, TINY_MODELS};
use emberlm::backend::cpu::CpuPrecision;
use emberlm::loader::ModelFiles;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn check(model: &Path, golden_file: &str, decode_all: bool) {
    let golden = Golden::parse(
        &std::fs::read_to_string(root().join("tests/fixtures/golden").join(golden_file)).unwrap(),
    );
    let files = ModelFiles::open(model).unwrap();
    let weights = files.weights().unwrap();
    let name = model.display().to_string();
    let tol = common::cpu_cases::tolerance(&name);
    let d = common::cpu_cases::check_model(
        &name,
        &weights,
        &golden,
        tol.max,
        tol.max / 2.0,
        decode_all,
        tol.greedy,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "{name}: |Δ logit| vs f64: max {:.3e}, mean {:.3e} ({tol:?})",
        d.max, d.mean
    );
    if let Some(mean) = tol.mean {
        assert!(
            d.mean <= mean,
            "{name}: mean |Δ logit| {:.4} is above llama.cpp's {mean:.4}",
            d.mean
        );
    }
}

#[test]
fn tiny_models_match_f64_goldens_on_the_cpu() {
    let fx = root().join("tests/fixtures");
    for (model, golden) in TINY_MODELS {
        check(&fx.join(model), golden, true);
    }
}

/// The GPU path's distance from the float64 goldens (`tests/gpu/forward_golden.rs`).
const GPU_TOL: f64 = 2e-3;

/// `precision: 'f32'` by name on the CPU: every quantized tiny model (every weight type) within
/// the GPU path's distance of the float64 goldens, prefill and decode, greedy tokens equal;
/// where 8-bit activations (the default) are further, as llama.cpp's are.
#[test]
fn exact_f32_products_match_f64_goldens_as_the_gpu_does() {
    let fx = root().join("tests/fixtures");
    let quantized = TINY_MODELS
        .iter()
        .filter(|(m, _)| m.ends_with(".gguf") && !m.contains("-f32") && !m.contains("-f16"));
    let mut n = 0;
    for (model, golden_file) in quantized {
        let golden =
            Golden::parse(&std::fs::read_to_string(fx.join("golden").join(golden_file)).unwrap());
        let files = ModelFiles::open(&fx.join(model)).unwrap();
        let weights = files.weights().unwrap();
        let exact = common::cpu_cases::check_model_in(
            model,
            &weights,
            &golden,
            (GPU_TOL, GPU_TOL / 2.0),
            true,
            true,
            CpuPrecision::F32,
        )
        .unwrap_or_else(|e| panic!("f32 on the CPU: {e}"));
        let int8 = common::cpu_cases::check_model_in(
            model,
            &weights,
            &golden,
            (f64::INFINITY, f64::INFINITY),
            false,
            false,
            CpuPrecision::Int8,
        )
        .unwrap();
        eprintln!(
            "{model}: max |Δ logit| vs f64: f32 products {:.2e}, int8 activations {:.2e}",
            exact.max, int8.max
        );
        assert!(
            int8.max > GPU_TOL,
            "{model}: 8-bit activations came within {GPU_TOL} ({:.2e}): did they run?",
            int8.max
        );
        n += 1;
    }
    assert!(n >= 6, "only {n} quantized tiny models");
}

#[test]
fn smollm2_matches_f64_goldens_on_the_cpu() {
    let Some(model) = common::require::smollm2() else {
        return;
    };
    check(&model, "smollm2-135m-q4_1.golden.json", false);
}

#[test]
fn gemma3_matches_f64_goldens_on_the_cpu() {
    let Some(model) = common::require::gemma3() else {
        return;
    };
    check(&model, "gemma-3-270m-q4_k_m.golden.json", false);
}
