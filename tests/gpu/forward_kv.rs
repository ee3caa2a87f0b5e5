//! The KV cache: decoding N tokens one at a time gives the logits of one prefill of the whole
//! sequence, at N = 1, 7, 64 and at the context limit; past the limit is an error, not a wrap.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use emberlm::backend::gpu::Forward;
use emberlm::backend::gpu::KernelCache;
use emberlm::loader::ModelFiles;
use emberlm::GpuOptions;
use rand::Rng;

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn decode_matches_prefill_up_to_the_context_limit() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let mut rng = common::rng("forward_kv", &|m| eprintln!("{m}"));
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/tiny-llama-q4_1.gguf"
    );
    let files = ModelFiles::open(std::path::Path::new(path)).unwrap();
    let weights = files.weights().unwrap();
    let (vocab, context) = (weights.config.vocab_size, weights.config.context_length);
    let cache = KernelCache::new();
    let mut fwd = pollster::block_on(Forward::new(&ctx, &cache, &weights, context, 16)).unwrap();
    for n in [1, 7, 64, context] {
        let tokens: Vec<u32> = (0..n).map(|_| rng.random_range(0..vocab as u32)).collect();
        fwd.truncate(0).unwrap();
        let prefill = pollster::block_on(fwd.forward(&ctx, &tokens, true)).unwrap();
        assert_eq!(prefill.len(), n * vocab);
        fwd.truncate(0).unwrap();
        let mut decode = Vec::new();
        for &t in &tokens {
            decode.extend(pollster::block_on(fwd.forward(&ctx, &[t], true)).unwrap());
        }
        let d = max_diff(&prefill, &decode);
        eprintln!("N = {n}: max |prefill - decode| = {d:e}");
        assert!(d <= 1e-4, "N = {n}: prefill and decode differ by {d}");
        assert_eq!(fwd.kv().pos(), n);
        // only the last row when not asked for all
        fwd.truncate(0).unwrap();
        let last = pollster::block_on(fwd.forward(&ctx, &tokens, false)).unwrap();
        assert!(max_diff(&last, &prefill[(n - 1) * vocab..]) <= 1e-4);
    }
    // the cache is full: one more token is refused and nothing moves
    let err = pollster::block_on(fwd.forward(&ctx, &[1], false)).unwrap_err();
    assert!(err.to_string().contains("exceed the context"), "{err}");
    assert_eq!(fwd.kv().pos(), context);
    // bad ids are refused before anything runs
    fwd.truncate(0).unwrap();
    let err = pollster::block_on(fwd.forward(&ctx, &[vocab as u32], false)).unwrap_err();
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
    assert_eq!(fwd.kv().pos(), 0);
    ctx.check().expect("no GPU error along the way");
}

#[test]
fn truncate_reuses_a_cached_prefix() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/tiny-gpt2-f16.gguf"
    );
    let files = ModelFiles::open(std::path::Path::new(path)).unwrap();
    let weights = files.weights().unwrap();
    let cache = KernelCache::new();
    let mut fwd = pollster::block_on(Forward::new(&ctx, &cache, &weights, 64, 8)).unwrap();
    let a: Vec<u32> = (1..20).collect();
    let full = pollster::block_on(fwd.forward(&ctx, &a, false)).unwrap();
    // keep the first 10 positions, recompute the rest: same last logits
    fwd.truncate(10).unwrap();
    let again = pollster::block_on(fwd.forward(&ctx, &a[10..], false)).unwrap();
    assert!(max_diff(&full, &again) <= 1e-5);
    assert!(fwd.truncate(30).is_err(), "cannot move past what is cached");
}

/// Decode planning changes how attention's keys are cut, never the results: the tiny Llama
/// decoded to its full context with every key in one block (`none`), with the bucketed plan
/// (`auto`, buckets shrunk to 6 and 20 keys so both split tiers run) and with fixed 5-key
/// blocks gives the same logits to float rounding; the split plans record more dispatches (the
/// merges), so the splits did run. A local window on a model trained without one is refused.
#[test]
fn decode_plans_agree_to_rounding() {
    use emberlm::backend::gpu::{DecodePlan, DecodePlanMode};
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/tiny-llama-q4_1.gguf"
    );
    let files = ModelFiles::open(std::path::Path::new(path)).unwrap();
    let weights = files.weights().unwrap();
    let (vocab, context) = (weights.config.vocab_size, weights.config.context_length);
    let mut rng = common::rng("decode_plans", &|m| eprintln!("{m}"));
    let tokens: Vec<u32> = (0..context)
        .map(|_| rng.random_range(0..vocab as u32))
        .collect();
    let plans = [
        DecodePlan {
            mode: DecodePlanMode::None,
            ..DecodePlan::default()
        },
        DecodePlan {
            bucket_short: 6,
            bucket_mid: 20,
            ..DecodePlan::default()
        },
        DecodePlan {
            mode: DecodePlanMode::Fixed,
            q_chunk: Some(5),
            ..DecodePlan::default()
        },
    ];
    let mut runs: Vec<(Vec<f32>, u64)> = Vec::new();
    for plan in plans {
        let Some(ctx) = common::native_gpu(GpuOptions {
            decode_plan: plan,
            ..GpuOptions::default()
        }) else {
            return;
        };
        let cache = KernelCache::new();
        let mut fwd =
            pollster::block_on(Forward::new(&ctx, &cache, &weights, context, 16)).unwrap();
        let before = ctx.counters().dispatches;
        let mut logits = Vec::new();
        for &t in &tokens {
            logits.extend(pollster::block_on(fwd.forward(&ctx, &[t], false)).unwrap());
        }
        runs.push((logits, ctx.counters().dispatches - before));
        ctx.check().expect("no GPU error");
    }
    let (whole, whole_dispatches) = &runs[0];
    for (plan, (logits, dispatches)) in plans.iter().zip(&runs).skip(1) {
        let d = max_diff(whole, logits);
        eprintln!(
            "{}: max |Δ logit| vs none = {d:e}, {dispatches} dispatches",
            plan.describe(context as u32)
        );
        assert!(d <= 1e-4, "{plan:?}: logits differ from none by {d}");
        assert!(
            dispatches > whole_dispatches,
            "{plan:?}: {dispatches} dispatches, none ran {whole_dispatches}: no split ran"
        );
    }
    // a window would change a model trained without one
    let windowed = DecodePlan {
        mode: DecodePlanMode::Fixed,
        q_chunk: Some(5),
        local_window: Some(8),
        ..DecodePlan::default()
    };
    let Some(ctx) = common::native_gpu(GpuOptions {
        decode_plan: windowed,
        ..GpuOptions::default()
    }) else {
        return;
    };
    let err = pollster::block_on(Forward::new(
        &ctx,
        &KernelCache::new(),
        &weights,
        context,
        16,
    ))
    .unwrap_err();
    assert!(err.to_string().contains("decode_local_window"), "{err}");
}
