//! The engine's requests: cancellation before a request's turn, abort while it runs, closing,
//! and resetting the conversation.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use std::path::Path;

use emberlm::engine::{Engine, EngineOptions};
use emberlm::loader::ModelFiles;
use emberlm::sampling::SamplingParams;
use emberlm::session::{FinishReason, GenerateOptions, Prompt};
use emberlm::{Error, GpuOptions};

fn options(max_new_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        sampling: SamplingParams {
            max_new_tokens,
            ..SamplingParams::greedy()
        },
        ..GenerateOptions::default()
    }
}

fn load() -> Option<Engine> {
    let ctx = common::native_gpu(GpuOptions::default())?;
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/tiny-llama-q4_1.gguf"
    );
    let files = ModelFiles::open(Path::new(path)).unwrap();
    Some(
        pollster::block_on(Engine::new(
            ctx,
            files,
            EngineOptions::default(),
            &mut |_, _| {},
        ))
        .unwrap(),
    )
}

#[test]
fn cancel_abort_reset_and_close() {
    let Some(engine) = load() else {
        return;
    };
    let prompt = Prompt::from("Permission is hereby granted");

    // Cancelled before its turn: dropped unrun, the conversation untouched.
    let cancel = engine.cancel_handle();
    cancel.cancel();
    let err =
        pollster::block_on(engine.generate_cancellable(&cancel, &prompt, &options(8), &mut |_| {}))
            .unwrap_err();
    assert!(matches!(err, Error::Cancelled(_)), "{err}");
    assert!(engine.cached_tokens().is_empty());

    // Cancelled while it runs: it stops after the current token.
    let cancel = engine.cancel_handle();
    let mut seen = 0;
    let g =
        pollster::block_on(
            engine.generate_cancellable(&cancel, &prompt, &options(32), &mut |e| {
                if e.id.is_some() {
                    seen += 1;
                    cancel.cancel();
                }
            }),
        )
        .unwrap();
    assert_eq!(seen, 1);
    assert_eq!(g.sequences[0].finish_reason, FinishReason::Abort);
    assert!(!cancel.is_running());
    assert!(!engine.cached_tokens().is_empty());

    // A later request is not affected by that cancel.
    cancel.cancel();
    let g = pollster::block_on(engine.generate(&prompt, &options(4), &mut |_| {})).unwrap();
    assert_eq!(g.sequences[0].finish_reason, FinishReason::Length);

    pollster::block_on(engine.reset()).unwrap();
    assert!(engine.cached_tokens().is_empty());

    engine.close();
    assert!(engine.is_closed());
    let err = pollster::block_on(engine.generate(&prompt, &options(4), &mut |_| {})).unwrap_err();
    assert!(matches!(err, Error::Cancelled(_)), "{err}");
}

/// `kvCache: 'auto'` on the CPU backend measures the kinds as on the GPU (the CPU stores every
/// kind): under a budget only the 4-bit kinds fit, those are measured against f32 and one is
/// chosen and used, the decision is stored under the CPU's identity and reused.
#[test]
fn the_cpu_backend_measures_the_automatic_kv_plan() {
    use emberlm::engine::{LoadOptions, Surface};
    let dir = std::env::temp_dir().join(format!("emberlm-cpu-kv-plan-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/tiny-llama-q4_1.gguf"
    );
    // tiny-llama at 128 positions: f32 64 KiB, f16 32 KiB, q8_0 18 KiB, the 4-bit kinds 10 KiB;
    // loose gates for the random fixture
    let load_options = LoadOptions::from_json(
        &serde_json::json!({
            "backend": "cpu",
            "contextLength": 128,
            "cache_kind": "auto",
            "cacheBudgetMb": 12.0 / 1024.0,
            "cacheQualityMaxDeltaNll": 10.0,
            "cacheQualityMaxPplRatio": 1e4,
            "cacheQualityMaxMeanKl": 10.0,
            "cacheAutoBenchSteps": 2,
            "cachePlanPath": dir.display().to_string(),
        }),
        Surface::File,
    )
    .unwrap()
    .resolve()
    .unwrap();
    let load = || {
        let files = ModelFiles::open(Path::new(path)).unwrap();
        pollster::block_on(Engine::load(files, load_options.clone())).unwrap()
    };
    let engine = load();
    let (decision, kinds) = engine
        .inspect(|s| (s.cache_decision().cloned(), s.forward().kv_kinds()))
        .unwrap();
    let d = decision.expect("a decision");
    assert_eq!(d.source, "measured", "{d:#?}");
    assert!(["q4_0", "nf4"].contains(&d.kind.as_str()), "{d:#?}");
    assert_eq!(kinds.to_string(), d.kind);
    for c in &d.candidates {
        match c.kind.as_str() {
            "f32" | "f16" | "q8_0" => {
                assert!(
                    c.dropped.as_deref().unwrap_or("").contains("budget"),
                    "{c:?}"
                );
            }
            _ => assert!(c.delta_nll.is_some() && c.decode_tok_s.is_some(), "{c:?}"),
        }
    }
    assert!(d.stored_at.is_some(), "{d:#?}");
    let result = pollster::block_on(engine.generate(
        &Prompt::Tokens(vec![1, 5, 9]),
        &options(4),
        &mut |_| {},
    ));
    assert_eq!(result.unwrap().sequences[0].tokens.len(), 4);
    let again = load();
    let d = again
        .inspect(|s| s.cache_decision().cloned())
        .unwrap()
        .unwrap();
    assert_eq!(d.source, "reused", "{d:#?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fixed KV-cache kind on the CPU backend is the cache's kind from the start: the session
/// reports it and the memory of its cache, and `info` sizes the cache in it.
#[test]
fn the_cpu_backend_starts_in_the_kind_asked_for() {
    use emberlm::engine::{LoadOptions, Surface};
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/tiny-llama-q4_1.gguf"
    );
    // K and V rows of 32 values: q8_0 one block (a word of scales, 32 bytes), f32 128 bytes
    for (kind, row_bytes) in [("q8", 2 * 36), ("f32", 2 * 32 * 4)] {
        let options = LoadOptions::from_json(
            &serde_json::json!({ "backend": "cpu", "contextLength": 100, "cache_kind": kind }),
            Surface::File,
        )
        .unwrap()
        .resolve()
        .unwrap();
        let files = ModelFiles::open(Path::new(path)).unwrap();
        let engine = pollster::block_on(Engine::load(files, options)).unwrap();
        let (kinds, memory, layers, kv_dim) = engine
            .inspect(|s| {
                let c = s.config();
                (
                    s.forward().kv_kinds(),
                    s.forward().memory(),
                    c.n_layers,
                    c.kv_dim(),
                )
            })
            .unwrap();
        assert_eq!(kv_dim, 32, "the fixture's shape");
        let want = if kind == "q8" { "q8_0" } else { "f32" };
        assert_eq!(kinds.to_string(), want);
        assert_eq!(
            memory.kv_bytes_per_token,
            (row_bytes * layers) as u64,
            "{kind}"
        );
        assert_eq!(memory.kv_cache, memory.kv_bytes_per_token * 100, "{kind}");
    }
}
