//! Browser tests of speculative decoding through the JavaScript `Engine`: a draft model
//! (`loadDraft`, the `draft` load option) and prompt lookup give greedy output identical to
//! plain decoding, `stats.speculative` reports the acceptance, `info().draft` names the draft,
//! and bad settings and a draft of another vocabulary are refused by name.

#![cfg(target_arch = "wasm32")]

use crate::common;

use common::web_engine::*;
use emberlm::web::Engine;
use js_sys::Uint8Array;
use serde_json::{json, Value};
use wasm_bindgen::JsValue;
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::wasm_bindgen_test;

fn bytes(name: &str) -> JsValue {
    Uint8Array::from(fixture(name)).into()
}

async fn load_draft(engine: &Engine, name: &str) -> Result<(), String> {
    JsFuture::from(engine.load_draft(bytes(name), JsValue::UNDEFINED))
        .await
        .map(|_| ())
        .map_err(|e| message(&e))
}

#[wasm_bindgen_test]
async fn speculation_matches_plain_greedy_decoding() {
    let engine = load("tiny-llama-q4_1.gguf").await;
    assert!(rust(&engine.info().unwrap())["draft"].is_null());
    load_draft(&engine, "tiny-llama-q4_0.gguf").await.unwrap();
    let info = rust(&engine.info().unwrap());
    assert!(info["draft"].is_string(), "{info}");
    let prompts = [
        json!("Once upon a time"),
        json!([1, 17, 300, 4, 17, 300, 4, 17]),
    ];
    for prompt in &prompts {
        let plain = json!({ "temperature": 0, "maxNewTokens": 20 });
        let want = generate(&engine, prompt, plain.clone(), &Events::new())
            .await
            .unwrap();
        assert!(want["stats"].get("speculative").is_none(), "{want}");
        for speculative in [
            json!({ "method": "draft", "k": 3 }),
            json!({ "method": "lookup", "k": 2, "adaptive": true }),
            json!(true),
        ] {
            let mut options = plain.clone();
            options["speculative"] = speculative.clone();
            let events = Events::new();
            let got = generate(&engine, prompt, options, &events).await.unwrap();
            assert_eq!(got["tokens"], want["tokens"], "{speculative}: {got}");
            assert_eq!(got["text"], want["text"], "{speculative}");
            assert_eq!(events.text(), want["text"].as_str().unwrap());
            let s = &got["stats"]["speculative"];
            let (drafted, accepted) = (
                s["drafted"].as_u64().unwrap(),
                s["accepted"].as_u64().unwrap(),
            );
            assert!(accepted <= drafted, "{s}");
            assert!(
                s["acceptanceRate"].is_number() && s["targetSteps"].is_number(),
                "{s}"
            );
            assert!(s["kFinal"].is_number(), "{s}");
        }
    }
    JsFuture::from(engine.unload_draft()).await.unwrap();
    assert!(rust(&engine.info().unwrap())["draft"].is_null());
}

#[wasm_bindgen_test]
async fn the_draft_load_option_and_bad_settings() {
    let options = json!({ "name": "target.gguf", "backend": "webgpu" });
    let opts = js(&options);
    js_sys::Reflect::set(&opts, &"draft".into(), &bytes("tiny-llama-q4_1.gguf")).unwrap();
    let engine = Engine::open(bytes("tiny-llama-q4_1.gguf"), opts)
        .await
        .unwrap();
    assert!(rust(&engine.info().unwrap())["draft"].is_string());
    // a draft equal to the model accepts every drafted token
    let got = generate(
        &engine,
        &json!("Once upon a time"),
        json!({ "temperature": 0, "maxNewTokens": 16, "speculative": { "method": "draft" } }),
        &Events::new(),
    )
    .await
    .unwrap();
    let s: &Value = &got["stats"]["speculative"];
    assert_eq!(s["accepted"], s["drafted"], "{s}");
    for (bad, name) in [
        (json!({ "k": 0 }), "spec_k"),
        (json!({ "k": 65 }), "spec_k"),
        (
            json!({ "disableBelowAccept": 2 }),
            "spec_disable_below_accept",
        ),
        (json!({ "method": "oracle" }), "speculative.method"),
    ] {
        let err = generate(
            &engine,
            &json!("Once"),
            json!({ "maxNewTokens": 4, "speculative": bad }),
            &Events::new(),
        )
        .await
        .unwrap_err();
        assert!(err.contains(name), "{bad}: {err}");
    }
    let err = load_draft(&engine, "tiny-llama-spm-f32.gguf")
        .await
        .unwrap_err();
    assert!(err.contains("vocabulary differs"), "{err}");
}
