//! The CPU backend against the float64 goldens: every fixture model (GGUF in every weight type
//! and HF folders), SmolLM2 and Gemma 3, through prefill, decode and greedy decoding, within
//! the tolerances `common::cpu_cases::tolerance` derives from llama.cpp's own distance from
//! the same goldens. No GPU is involved.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use std::path::{Path, PathBuf};

use common::golden::{Golden, TINY_MODELS};
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
