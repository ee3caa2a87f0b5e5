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
