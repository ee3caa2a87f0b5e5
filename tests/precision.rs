//! Precision f16 end to end on lavapipe (which has `shader-f16`): the tiny fixtures' logits
//! with f16 matrix products against the same run in f32, over prefill and decode: largest
//! |Δ logit|, next-token KL and NLL delta within bounds that a broken f16 path (an input not
//! rounded back, a product in the wrong place, an overflow) would exceed by orders of
//! magnitude, and the kernel plan kept apart from f32's.

#![cfg(not(target_arch = "wasm32"))]

mod common;

use emberlm::forward::Forward;
use emberlm::gpu::{KernelCache, MatmulPrecision, Precision};
use emberlm::loader::ModelFiles;
use emberlm::sampling::agreement;
use emberlm::GpuOptions;
use rand::Rng;

/// The logits of `tokens` as one prefill and then decoded one at a time, at `precision`.
fn logits(path: &str, precision: Precision, tokens: &[u32]) -> Option<(Vec<f32>, Vec<f32>)> {
    let ctx = common::native_gpu(GpuOptions {
        precision,
        ..GpuOptions::default()
    })?;
    if precision == Precision::F16 && ctx.precision() != MatmulPrecision::F16 {
        eprintln!("SKIPPED: the adapter has no shader-f16");
        return None;
    }
    let files = ModelFiles::open(std::path::Path::new(path)).unwrap();
    let weights = files.weights().unwrap();
    let cache = KernelCache::new();
    let mut fwd = pollster::block_on(Forward::new(&ctx, &cache, &weights, 64, 16)).unwrap();
    let prefill = pollster::block_on(fwd.forward(&ctx, tokens, true)).unwrap();
    fwd.truncate(0).unwrap();
    let mut decode = Vec::new();
    for &t in tokens {
        decode.extend(pollster::block_on(fwd.forward(&ctx, &[t], false)).unwrap());
    }
    let key = emberlm::forward::plan_key(&ctx, &weights, 16);
    assert_eq!(
        key.shape.contains("precision=f16"),
        precision == Precision::F16,
        "the f16 plan is stored under its own key: {}",
        key.shape
    );
    ctx.check().expect("no GPU error");
    Some((prefill, decode))
}

#[test]
fn f16_products_stay_close_to_f32() {
    let mut rng = common::rng("precision", &|m| eprintln!("{m}"));
    for name in [
        "tiny-llama-q4_1.gguf",
        "tiny-gpt2-f16.gguf",
        "tiny-llama-spm-f32.gguf",
    ] {
        let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
        let vocab = ModelFiles::open(std::path::Path::new(&path))
            .unwrap()
            .weights()
            .unwrap()
            .config
            .vocab_size;
        let tokens: Vec<u32> = (0..40).map(|_| rng.random_range(0..vocab as u32)).collect();
        let Some((p32, d32)) = logits(&path, Precision::F32, &tokens) else {
            return;
        };
        let Some((p16, d16)) = logits(&path, Precision::F16, &tokens) else {
            return;
        };
        for (what, a, b) in [("prefill", &p32, &p16), ("decode", &d32, &d16)] {
            let m = agreement(a, b, &tokens, vocab);
            eprintln!("{name} {what}: {m:?}");
            assert!(m.max_abs_diff > 0.0, "{name} {what}: f16 changed nothing");
            assert!(m.max_abs_diff <= 0.15, "{name} {what}: {m:?}");
            assert!(m.mean_kl <= 1e-3, "{name} {what}: {m:?}");
            assert!(m.nll_delta.abs() <= 0.02, "{name} {what}: {m:?}");
            assert!(m.top1_agreement >= 0.9, "{name} {what}: {m:?}");
        }
    }
}
