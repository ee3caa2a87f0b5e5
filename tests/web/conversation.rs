//! A conversation saved in the page (`engine.saveConversation`) and restored into a new engine
//! (`engine.restoreConversation`), as after a reload: the next reply is the one the first
//! engine gives, with the restored positions reused; bytes from another model are refused and
//! that engine's conversation goes on.

#![cfg(target_arch = "wasm32")]

use crate::common;

use common::web_engine::{generate, js, load_cpu, message, rust, Events};
use js_sys::Uint8Array;
use serde_json::{json, Value};
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::wasm_bindgen_test;

fn greedy(n: u32) -> Value {
    json!({ "temperature": 0, "maxNewTokens": n })
}

#[wasm_bindgen_test]
async fn a_saved_conversation_goes_on_in_a_new_engine() {
    let model = "tiny-llama-q4_1.gguf";
    let a = load_cpu(model).await;
    let first = generate(&a, &json!([3, 4, 5, 6, 7, 8, 9]), greedy(5), &Events::new())
        .await
        .unwrap();
    let note = json!({ "messages": [{ "role": "user", "content": "hi" }] });
    let bytes: Uint8Array = JsFuture::from(a.save_conversation(js(&note)))
        .await
        .unwrap()
        .into();
    assert!(bytes.length() > 100);
    let mut next: Vec<Value> = first["promptTokenIds"].as_array().unwrap().clone();
    next.extend(first["tokens"].as_array().unwrap().iter().cloned());
    next.extend([json!(5), json!(9)]);
    let want = generate(&a, &Value::Array(next.clone()), greedy(6), &Events::new())
        .await
        .unwrap();

    let b = load_cpu(model).await;
    let restored = rust(
        &JsFuture::from(b.restore_conversation(bytes.clone()))
            .await
            .unwrap(),
    );
    assert_eq!(restored["note"], note, "{restored}");
    let held = restored["positions"].as_u64().unwrap();
    assert_eq!(
        held,
        7 + 4,
        "the prompt and the tokens fed back: {restored}"
    );
    let got = generate(&b, &Value::Array(next), greedy(6), &Events::new())
        .await
        .unwrap();
    assert_eq!(got["tokens"], want["tokens"]);
    assert_eq!(got["stats"]["cachedTokens"], json!(held), "{got}");

    // another model's engine refuses them, and keeps its own conversation
    let other = load_cpu("tiny-llama-q8_0.gguf").await;
    generate(&other, &json!([1, 2, 3]), greedy(2), &Events::new())
        .await
        .unwrap();
    let e = JsFuture::from(other.restore_conversation(bytes))
        .await
        .unwrap_err();
    assert!(message(&e).contains("another model"), "{}", message(&e));
    let again = generate(&other, &json!([1, 2, 3, 4]), greedy(2), &Events::new())
        .await
        .unwrap();
    assert!(
        again["stats"]["cachedTokens"].as_u64().unwrap() > 0,
        "{again}"
    );
}
