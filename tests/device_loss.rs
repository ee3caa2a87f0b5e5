//! A lost device mid-conversation: the running call fails with `DeviceLost` (no panic, no
//! hang), and a session rebuilt on a new device from the same model files carries the
//! conversation on from its text history, giving the same tokens as if nothing had happened.

#![cfg(not(target_arch = "wasm32"))]

mod common;

use std::path::Path;

use emberlm::chat::ChatMessage;
use emberlm::format::ModelFiles;
use emberlm::sampling::SamplingParams;
use emberlm::session::{GenerateOptions, Prompt, Session};
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

#[test]
fn a_lost_device_fails_the_call_and_a_rebuilt_session_continues() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/tiny-llama-q4_1.gguf"
    );
    let files = ModelFiles::open(Path::new(path)).unwrap();
    let mut session = pollster::block_on(Session::new(ctx, &files, None)).unwrap();
    let mut history = vec![ChatMessage::new("user", "Permission is hereby granted")];
    let first = pollster::block_on(session.generate(
        &Prompt::Chat(history.clone()),
        &options(),
        &mut |_| {},
    ))
    .unwrap();
    history.push(ChatMessage::new(
        "assistant",
        first.sequences[0].text.clone(),
    ));
    history.push(ChatMessage::new(
        "user",
        "subject to the following conditions",
    ));

    // What the second turn gives on a healthy device.
    let ctx = common::native_gpu(GpuOptions::default()).unwrap();
    let mut healthy = pollster::block_on(Session::new(ctx, &files, None)).unwrap();
    let want = pollster::block_on(healthy.generate(
        &Prompt::Chat(history.clone()),
        &options(),
        &mut |_| {},
    ))
    .unwrap();

    session.gpu().destroy_for_test();
    let err = pollster::block_on(session.generate(
        &Prompt::Chat(history.clone()),
        &options(),
        &mut |_| {},
    ))
    .unwrap_err();
    assert!(matches!(err, Error::DeviceLost { .. }), "{err}");
    assert!(session.gpu().is_lost());
    // Every later call on the lost session fails the same way, quickly.
    let again = pollster::block_on(session.generate(
        &Prompt::Chat(history.clone()),
        &options(),
        &mut |_| {},
    ))
    .unwrap_err();
    assert!(matches!(again, Error::DeviceLost { .. }), "{again}");

    // Rebuild on a new device from the same files and continue from the text history.
    let ctx = common::native_gpu(GpuOptions::default()).unwrap();
    let mut rebuilt = pollster::block_on(Session::new(ctx, &files, None)).unwrap();
    let got = pollster::block_on(rebuilt.generate(&Prompt::Chat(history), &options(), &mut |_| {}))
        .unwrap();
    assert_eq!(got.sequences[0].tokens, want.sequences[0].tokens);
    assert_eq!(got.sequences[0].text, want.sequences[0].text);
}
