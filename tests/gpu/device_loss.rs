//! A lost device mid-conversation: the running call fails with `DeviceLost` (no panic, no
//! hang), the engine rebuilds itself on a new device from the model files it kept and replays
//! the conversation, and the next turn gives the same tokens as a fresh engine given the whole
//! history.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use std::path::Path;

use emberlm::chat::ChatMessage;
use emberlm::engine::{Engine, EngineOptions};
use emberlm::loader::ModelFiles;
use emberlm::sampling::SamplingParams;
use emberlm::session::{GenerateOptions, Prompt};
use emberlm::{Error, GpuOptions};

fn options() -> GenerateOptions {
    GenerateOptions {
        sampling: SamplingParams {
            max_new_tokens: 8,
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
    let options = EngineOptions::default();
    Some(pollster::block_on(Engine::new(ctx, files, options, &mut |_, _| {})).unwrap())
}

/// An engine with the Q8_0 tiny Llama as its draft model, a one-message history, its plain
/// greedy tokens and speculative options.
fn with_draft() -> Option<(Engine, Vec<ChatMessage>, Vec<u32>, GenerateOptions)> {
    let engine = load()?;
    let draft = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/tiny-llama-q8_0.gguf"
    );
    pollster::block_on(engine.load_draft(ModelFiles::open(Path::new(draft)).unwrap())).unwrap();
    let history = vec![ChatMessage::new("user", "Permission is hereby granted")];
    let want = generate(&engine, &history).unwrap();
    let speculative = GenerateOptions {
        speculative: Some(emberlm::session::SpecOptions::default()),
        ..options()
    };
    Some((engine, history, want, speculative))
}

fn generate(engine: &Engine, history: &[ChatMessage]) -> emberlm::Result<Vec<u32>> {
    let prompt = Prompt::Chat(history.to_vec());
    let g = pollster::block_on(engine.generate(&prompt, &options(), &mut |_| {}))?;
    Ok(g.sequences[0].tokens.clone())
}

#[test]
fn a_lost_device_fails_the_call_and_the_engine_recovers_the_conversation() {
    let Some(engine) = load() else {
        return;
    };
    let mut history = vec![ChatMessage::new("user", "Permission is hereby granted")];
    let prompt = Prompt::Chat(history.clone());
    let first = pollster::block_on(engine.generate(&prompt, &options(), &mut |_| {})).unwrap();
    history.push(ChatMessage::new(
        "assistant",
        first.sequences[0].text.clone(),
    ));
    history.push(ChatMessage::new(
        "user",
        "subject to the following conditions",
    ));
    let conversation = engine.cached_tokens();
    assert!(conversation.len() > first.prompt_tokens.len());
    assert_eq!(engine.rebuilds(), 0);

    // What the second turn gives on a fresh engine that never lost its device.
    let fresh = load().unwrap();
    let want = generate(&fresh, &history).unwrap();
    drop(fresh);

    pollster::block_on(engine.destroy_device_for_test());
    let err = generate(&engine, &history).unwrap_err();
    assert!(matches!(err, Error::DeviceLost { .. }), "{err}");
    assert!(engine.is_lost());
    // The conversation is kept for the rebuild.
    assert_eq!(engine.cached_tokens(), conversation);

    // The engine rebuilds on a new device and replays the conversation into the KV cache.
    pollster::block_on(engine.recover()).unwrap();
    assert_eq!(engine.rebuilds(), 1);
    assert!(!engine.is_lost());
    assert_eq!(engine.cached_tokens(), conversation);
    let kv = engine.inspect(|s| s.forward().pos()).unwrap();
    assert_eq!(kv, conversation.len());

    // The next turn reuses the replayed cache and equals the fresh engine's.
    let prompt = Prompt::Chat(history.clone());
    let got = pollster::block_on(engine.generate(&prompt, &options(), &mut |_| {})).unwrap();
    let common = conversation
        .iter()
        .zip(&got.prompt_tokens)
        .take_while(|(a, b)| a == b)
        .count();
    assert!(common > 0);
    assert_eq!(got.stats.cached_tokens, common);
    assert_eq!(got.sequences[0].tokens, want);
    assert_eq!(engine.rebuilds(), 1);
}

#[test]
fn a_request_after_device_loss_rebuilds_by_itself() {
    let Some(engine) = load() else {
        return;
    };
    let history = vec![ChatMessage::new("user", "Permission is hereby granted")];
    let want = generate(&engine, &history).unwrap();
    pollster::block_on(engine.destroy_device_for_test());
    assert!(matches!(
        generate(&engine, &history),
        Err(Error::DeviceLost { .. })
    ));
    // No explicit recover(): the request rebuilds, replays and reuses the cached prompt.
    assert_eq!(generate(&engine, &history).unwrap(), want);
    assert_eq!(engine.rebuilds(), 1);
}

/// Speculative decoding across a device loss: the verification step meets the lost device and
/// fails with `DeviceLost`; the rebuild loads the draft model again beside the model, and the
/// next request speculates with it and gives the plain tokens.
#[test]
fn a_draft_model_is_loaded_again_after_device_loss() {
    let Some((engine, history, want, speculative)) = with_draft() else {
        return;
    };
    let run = |engine: &Engine| {
        let prompt = Prompt::Chat(history.clone());
        pollster::block_on(engine.generate(&prompt, &speculative, &mut |_| {}))
    };
    assert_eq!(run(&engine).unwrap().sequences[0].tokens, want);
    pollster::block_on(engine.destroy_device_for_test());
    assert!(matches!(run(&engine), Err(Error::DeviceLost { .. })));
    let g = run(&engine).unwrap();
    assert_eq!(g.sequences[0].tokens, want);
    let s = g.stats.speculative.expect("speculative stats");
    assert_eq!(s.method, "draft", "the draft came back with the rebuild");
    assert!(s.drafted > 0, "{s:?}");
    assert_eq!(engine.rebuilds(), 1);
}

/// The device lost in the middle of a batched call (fired from the token callback after some
/// tokens came out): the call fails with `DeviceLost`, no panic or hang; the next batched call
/// rebuilds the engine and every sequence comes out as it does without the loss.
#[test]
fn a_device_lost_mid_batch_fails_the_call_and_the_next_batch_is_whole() {
    let Some(engine) = load() else {
        return;
    };
    let prompts: Vec<Prompt> = [
        "Permission is hereby granted",
        "The software is provided",
        "you may not use this file except",
    ]
    .iter()
    .map(|p| Prompt::Text(p.to_string()))
    .collect();
    let run = |engine: &Engine, on_token: &mut dyn FnMut(&emberlm::session::TokenEvent)| {
        pollster::block_on(engine.generate_batch(&prompts, &options(), on_token))
    };
    let tokens = |g: &[emberlm::session::Generation]| -> Vec<Vec<u32>> {
        g.iter().map(|g| g.sequences[0].tokens.clone()).collect()
    };
    let want = tokens(&run(&engine, &mut |_| {}).unwrap());
    assert!(want.iter().all(|t| t.len() > 2), "{want:?}");

    let trigger = engine.loss_trigger_for_test().expect("a GPU engine");
    let mut seen = 0;
    let err = run(&engine, &mut |_| {
        seen += 1;
        if seen == 4 {
            trigger.fire();
        }
    })
    .unwrap_err();
    assert!(matches!(err, Error::DeviceLost { .. }), "{err}");
    assert!(seen >= 4, "the loss came after {seen} tokens");
    assert!(
        seen < want.iter().map(Vec::len).sum::<usize>(),
        "the batch ran to its end"
    );

    assert_eq!(tokens(&run(&engine, &mut |_| {}).unwrap()), want);
    assert_eq!(engine.rebuilds(), 1);
}

/// The device lost between speculative steps (after the first token came out, so a
/// verification step meets it): the call fails with `DeviceLost`; the next call rebuilds with
/// the draft model and gives the plain tokens.
#[test]
fn a_device_lost_during_verification_fails_the_call_and_the_next_one_speculates() {
    let Some((engine, history, want, speculative)) = with_draft() else {
        return;
    };
    let prompt = Prompt::Chat(history.clone());
    let trigger = engine.loss_trigger_for_test().expect("a GPU engine");
    let mut seen = 0;
    let err = pollster::block_on(engine.generate(&prompt, &speculative, &mut |_| {
        seen += 1;
        if seen == 1 {
            trigger.fire();
        }
    }))
    .unwrap_err();
    assert!(matches!(err, Error::DeviceLost { .. }), "{err}");
    assert!(seen >= 1 && seen < want.len(), "{seen} of {}", want.len());
    let g = pollster::block_on(engine.generate(&prompt, &speculative, &mut |_| {})).unwrap();
    assert_eq!(g.sequences[0].tokens, want);
    let s = g.stats.speculative.expect("speculative stats");
    assert_eq!(s.method, "draft");
    assert_eq!(engine.rebuilds(), 1);
}
