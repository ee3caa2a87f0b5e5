//! Browser tests of batched decoding (wasm-bindgen-test in headless Chromium on WebGPU):
//! `engine.generateBatch` gives every prompt of mixed lengths, with its own options, the
//! result it gets alone (greedy at B = 1, 3 and 8 with sequences ending at different steps,
//! seeded sampling with several samples per prompt), events name their prompt and sample,
//! and bad batches are rejected with the option named.

#![cfg(target_arch = "wasm32")]

use crate::common;

use common::browser_log as log;
use emberlm::web::Engine;
use serde_json::{json, Value};
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::wasm_bindgen_test;

use common::web_engine::*;

const TEXTS: [&str; 8] = [
    "A",
    "The license terms and conditions",
    "Copyright (c) 2024, all rights reserved. Redistribution and use in source",
    "Hello",
    "Permission is hereby granted, free of charge",
    "x y z",
    "The software is provided as is",
    "Once",
];

async fn batch(
    engine: &Engine,
    prompts: &Value,
    options: Value,
    events: &Events,
) -> Result<Vec<Value>, String> {
    let promise = engine.generate_batch(js(prompts), js(&options), events.function());
    JsFuture::from(promise)
        .await
        .map(|v| rust(&v).as_array().cloned().unwrap_or_default())
        .map_err(|e| message(&e))
}

/// `{ prompt, ...options }` for prompt `i`: its own token limit (they end at different steps).
fn item(i: usize, extra: &Value) -> Value {
    let mut v = json!({ "prompt": TEXTS[i], "maxNewTokens": 2 + (i * 5) % 11 });
    for (k, x) in extra.as_object().into_iter().flatten() {
        v[k] = x.clone();
    }
    v
}

fn same(got: &Value, want: &Value, what: &str) {
    for key in ["tokens", "text", "finishReason"] {
        assert_eq!(got[key], want[key], "{what}: {key}");
    }
    let (g, w) = (&got["sequences"], &want["sequences"]);
    assert_eq!(
        g.as_array().map(Vec::len),
        w.as_array().map(Vec::len),
        "{what}"
    );
    for (a, b) in g
        .as_array()
        .into_iter()
        .flatten()
        .zip(w.as_array().into_iter().flatten())
    {
        assert_eq!(
            (&a["tokens"], &a["text"]),
            (&b["tokens"], &b["text"]),
            "{what}"
        );
    }
}

#[wasm_bindgen_test]
async fn a_batch_gives_every_prompt_its_result_alone() {
    let engine = load("tiny-llama-q4_1.gguf").await;
    for (n, extra) in [
        (8, json!({ "temperature": 0 })),
        (
            5,
            json!({ "temperature": 0.9, "topK": 40, "seed": 5, "numReturnSequences": 2 }),
        ),
    ] {
        let items: Vec<Value> = (0..n).map(|i| item(i, &extra)).collect();
        let mut alone = Vec::new();
        for it in &items {
            JsFuture::from(engine.reset()).await.unwrap();
            let mut options = it.clone();
            options.as_object_mut().map(|o| o.remove("prompt"));
            alone.push(
                generate(&engine, &it["prompt"], options, &Events::new())
                    .await
                    .unwrap(),
            );
        }
        for max_batch in [1, 3, 8] {
            let events = Events::new();
            let got = batch(
                &engine,
                &json!(items),
                json!({ "maxBatch": max_batch }),
                &events,
            )
            .await
            .unwrap();
            assert_eq!(got.len(), n);
            for (i, (g, w)) in got.iter().zip(&alone).enumerate() {
                same(g, w, &format!("B ≤ {max_batch}, prompt {i} of {extra}"));
                let streamed: String = events
                    .seen
                    .borrow()
                    .iter()
                    .filter(|e| e["prompt"] == json!(i) && e["sequence"] == json!(0))
                    .map(|e| e["text"].as_str().unwrap_or_default().to_string())
                    .collect();
                assert_eq!(
                    json!(streamed),
                    g["sequences"][0]["text"],
                    "prompt {i} as streamed"
                );
            }
        }
        log(&format!(
            "generateBatch: {n} prompts ({extra}) match generating alone"
        ));
    }
}

#[wasm_bindgen_test]
async fn bad_batches_are_rejected_with_the_option_named() {
    let engine = load("tiny-llama-q4_1.gguf").await;
    let e = batch(&engine, &json!([]), json!({}), &Events::new())
        .await
        .unwrap_err();
    assert!(e.contains("at least one"), "{e}");
    let e = batch(
        &engine,
        &json!(["a", { "prompt": "b", "topK": -2 }]),
        json!({}),
        &Events::new(),
    )
    .await
    .unwrap_err();
    assert!(e.contains("prompts[1]"), "{e}");
    let e = batch(
        &engine,
        &json!(["a"]),
        json!({ "maxBatch": 0 }),
        &Events::new(),
    )
    .await
    .unwrap_err();
    assert!(e.contains("maxBatch"), "{e}");
    // still usable
    let ok = batch(
        &engine,
        &json!(["a", "b"]),
        json!({ "maxNewTokens": 2, "temperature": 0 }),
        &Events::new(),
    )
    .await
    .unwrap();
    assert_eq!(ok.len(), 2);
}
