//! The GPU forward pass against the float64 goldens: every fixture model (GGUF and HF
//! folders) and SmolLM2, through prefill (one chunk and several) and through decode (one token
//! at a time through the KV cache), plus greedy decoding.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use std::path::{Path, PathBuf};

use common::forward_cases::{self, Decode};
use common::golden::{Golden, TINY_MODELS};
use emberlm::gpu::{KernelCache, KernelOverrides, SplitOverride, Variant};
use emberlm::loader::ModelFiles;
use emberlm::{GpuContext, GpuOptions};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs every golden prompt of `golden_file` through `model` three ways and checks each.
fn check(ctx: &GpuContext, model: &Path, golden_file: &str, tol: f64, decode: Decode) {
    let golden = Golden::parse(
        &std::fs::read_to_string(root().join("tests/fixtures/golden").join(golden_file)).unwrap(),
    );
    let files = ModelFiles::open(model).unwrap();
    let weights = files.weights().unwrap();
    let cache = KernelCache::new();
    let name = model.display().to_string();
    let worst = pollster::block_on(forward_cases::check_model(
        &name,
        ctx,
        &cache,
        &weights,
        &golden,
        tol,
        tol / 2.0,
        decode,
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{name}: max |Δ logit| vs f64 = {worst:.2e}");
}

/// A context whose every kernel family runs `variant`, with attention splitting the keys of
/// decode steps from 14 keys on into splits of 7 (flash-decoding, which the engine's policy
/// keeps for contexts far longer than these models'), so the goldens cover the split path
/// through the whole graph too.
fn forced(variant: Variant) -> GpuOptions {
    GpuOptions {
        kernels: KernelOverrides::all(variant).with_split(SplitOverride::Keys(7)),
        ..GpuOptions::default()
    }
}

#[test]
fn tiny_models_match_f64_goldens() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let fx = root().join("tests/fixtures");
    for (model, golden) in TINY_MODELS {
        check(&ctx, &fx.join(model), golden, 2e-3, Decode::All);
    }
}

#[test]
fn tiny_models_match_f64_goldens_in_every_kernel_variant() {
    for variant in Variant::ALL {
        let Some(ctx) = common::native_gpu(forced(variant)) else {
            return;
        };
        eprintln!("every kernel family forced to {variant}");
        let fx = root().join("tests/fixtures");
        for (model, golden) in TINY_MODELS {
            check(&ctx, &fx.join(model), golden, 2e-3, Decode::All);
        }
    }
}

#[test]
fn smollm2_matches_f64_goldens() {
    let Some(model) = common::require::smollm2() else {
        return;
    };
    // both kernel shapes, each prefilling every prompt in one chunk and decoding the last 8
    // tokens of the longest through the KV cache (lavapipe takes 1-2 s per SmolLM2 step): the
    // small chunks, decoding every position and the argmax chain run on the tiny models in
    // every shape, and for SmolLM2 in the browser
    for variant in Variant::ALL {
        let Some(ctx) = common::native_gpu(forced(variant)) else {
            return;
        };
        eprintln!("every kernel family forced to {variant}");
        check(
            &ctx,
            &model,
            "smollm2-135m-q4_1.golden.json",
            2e-2,
            Decode::Tail(8),
        );
    }
}
