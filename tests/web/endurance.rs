//! Long-running use in the browser: 100 sequential generations in one session leave the GPU
//! buffers the engine holds unchanged (count and bytes), create no buffers, bind groups or
//! pipelines, and grow wasm memory by no more than a bounded amount between generation 10
//! and 100.

#![cfg(target_arch = "wasm32")]

use crate::common;

use common::browser_log as log;
use emberlm::loader::ModelFiles;
use emberlm::sampling::SamplingParams;
use emberlm::session::{FinishReason, GenerateOptions, Prompt, Session};
use wasm_bindgen::JsCast;
use wasm_bindgen_test::wasm_bindgen_test;

/// Most bytes wasm memory may grow between generation 10 and generation 100.
const GROWTH_LIMIT: f64 = 1024.0 * 1024.0;

fn wasm_memory_bytes() -> f64 {
    wasm_bindgen::memory()
        .unchecked_into::<js_sys::WebAssembly::Memory>()
        .buffer()
        .unchecked_into::<js_sys::ArrayBuffer>()
        .byte_length() as f64
}

#[wasm_bindgen_test]
async fn a_hundred_generations_leave_no_trace() {
    let ctx = common::browser_gpu().await;
    let bytes = include_bytes!("../fixtures/tiny-llama-q4_1.gguf").to_vec();
    let files = ModelFiles::from_bytes(bytes, "tiny-llama-q4_1.gguf").unwrap();
    let mut session = Session::new(ctx, &files, Some(64)).await.unwrap();
    let prompts = [
        "Permission is hereby granted",
        "THE SOFTWARE IS PROVIDED",
        "Licensed under the Apache License",
    ];
    let mut bias = std::collections::BTreeMap::new();
    for &id in session.eos_ids() {
        bias.insert(id, -100.0);
    }
    let mut before = None;
    let mut memory_at_10 = 0.0;
    for i in 0..100 {
        if i == 10 {
            before = Some(session.gpu().expect("a GPU session").counters());
            memory_at_10 = wasm_memory_bytes();
        }
        let options = GenerateOptions {
            sampling: SamplingParams {
                temperature: 0.9,
                seed: Some(i),
                max_new_tokens: 6,
                logit_bias: bias.clone(),
                ..SamplingParams::unfiltered()
            },
            ..GenerateOptions::default()
        };
        let prompt = Prompt::Text(prompts[i as usize % prompts.len()].into());
        let g = session
            .generate(&prompt, &options, &mut |_| {})
            .await
            .unwrap();
        assert_eq!(g.sequences[0].finish_reason, FinishReason::Length);
        assert_eq!(g.sequences[0].tokens.len(), 6);
    }
    let after = session.gpu().expect("a GPU session").counters();
    let before = before.unwrap();
    let d = after.since(&before);
    log(&format!("generations 10..100: {d:?}"));
    assert_eq!(after.buffers_alive, before.buffers_alive);
    assert_eq!(after.buffer_bytes_alive, before.buffer_bytes_alive);
    assert_eq!(d.bind_groups_created, 0);
    assert_eq!(d.pipelines_created, 0);
    assert_eq!(d.submits, d.readback_waits, "one readback per submit");
    let growth = wasm_memory_bytes() - memory_at_10;
    log(&format!(
        "wasm memory: {memory_at_10} bytes at generation 10, grew by {growth} bytes by 100"
    ));
    assert!(
        growth <= GROWTH_LIMIT,
        "wasm memory grew by {growth} bytes between generation 10 and 100"
    );
}
