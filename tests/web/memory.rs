//! Browser tests of memory and long-context settings through the JavaScript `Engine`: the KV
//! cache kinds and the automatic cache plan (`kvCache`, `cacheBudgetMb`, ...) and decode
//! planning (`decodePlan`, ...) and the products' precision (`precision`), each reported by
//! `engine.info()` and checked by name.

#![cfg(target_arch = "wasm32")]

use crate::common;

use common::web_engine::*;
use emberlm::web::Engine;
use js_sys::Uint8Array;
use serde_json::{json, Value};
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::wasm_bindgen_test;

#[wasm_bindgen_test]
async fn kv_cache_kinds_and_the_automatic_plan() {
    let open = |options: Value| async move {
        let bytes = Uint8Array::from(fixture("tiny-llama-q4_1.gguf"));
        Engine::open(bytes.into(), js(&on_the_adapter(options))).await
    };
    // the requirements' spellings: `cache_kind: 'q8'` is a q8_0 cache, and a fixed kind with a
    // budget it fits loads
    let engine = open(json!({ "cache_kind": "q8", "cache_budget_mb": 1 }))
        .await
        .unwrap();
    assert_eq!(rust(&engine.info().unwrap())["kvCache"], "q8_0");
    // a fixed kind: reported with its bytes per token, and it generates
    let engine = open(json!({ "kvCache": "q8_0", "vCache": "f16" }))
        .await
        .unwrap();
    let info = rust(&engine.info().unwrap());
    assert_eq!(info["kvCache"], "k q8_0 / v f16", "{info}");
    // tiny-llama: 2 layers, one block of 32 per row: (36 + 64) bytes per layer
    assert_eq!(info["kvBytesPerToken"], 200, "{info}");
    assert!(info["kvCachePlan"].is_null());
    let counters = rust(&JsFuture::from(engine.counters()).await.unwrap());
    assert_eq!(counters["memory"]["kvKinds"], "k q8_0 / v f16");
    let result = generate_greedy(&engine).await;
    assert!(!result["tokens"].as_array().unwrap().is_empty(), "{result}");
    // auto under a budget that only the 4-bit kinds fit (f32 64 KiB, q8_0 18 KiB, 4-bit 10 KiB
    // at 128 positions), with gates loose enough for the random fixture
    let auto = json!({
        "kvCache": "auto",
        "cacheBudgetMb": 0.012,
        "cacheQualityMaxDeltaNll": 10.0,
        "cacheQualityMaxPplRatio": 10000.0,
        "cacheQualityMaxMeanKl": 10.0,
        "cachePlanProbe": false,
    });
    let engine = open(auto.clone()).await.unwrap();
    let info = rust(&engine.info().unwrap());
    let plan = &info["kvCachePlan"];
    assert!(
        ["q4_0", "nf4"].contains(&plan["kind"].as_str().unwrap_or("")),
        "{plan}"
    );
    assert_eq!(info["kvCache"], plan["kind"], "{info}");
    for c in plan["candidates"].as_array().unwrap() {
        let dropped = c["dropped"].as_str().unwrap_or("");
        match c["kind"].as_str().unwrap() {
            "f32" | "f16" | "q8_0" => assert!(dropped.contains("budget"), "{c}"),
            _ => assert!(dropped.is_empty() && c["delta_nll"].is_number(), "{c}"),
        }
    }
    // the decision is kept in the Cache API and reused by the next load
    let again = open(auto).await.unwrap();
    let info = rust(&again.info().unwrap());
    assert_eq!(info["kvCachePlan"]["source"], "reused", "{info}");
    // bad settings are refused by name
    for (options, name) in [
        (json!({ "kvCache": "int3" }), "kvCache"),
        (json!({ "kvCache": "auto", "kCache": "f16" }), "kCache"),
        (json!({ "cacheQualityPromptLen": 16 }), "kvCache"),
        // f32 at 128 positions is 64 KiB, over a budget of 10 KiB
        (json!({ "cacheBudgetMb": 0.01 }), "at most 20 positions"),
        (
            json!({ "kvCache": "auto", "cacheBudgetMb": -1 }),
            "cacheBudgetMb",
        ),
        // misspelt: refused naming the key and the nearest known one, never ignored
        (
            json!({ "kvCahce": "q8_0" }),
            "`kvCahce`; did you mean `kvCache`",
        ),
        (json!({ "cachePlanPath": "/tmp" }), "Cache API"),
        (
            json!({ "kvCache": "auto", "cacheAutoBenchmark": "yes" }),
            "cacheAutoBenchmark",
        ),
    ] {
        let err = open(options.clone()).await.err().unwrap();
        assert!(message(&err).contains(name), "{options}: {}", message(&err));
    }
}

/// `decodePlan` and its values: reported in `engine.info().decodePlan`, the same greedy tokens
/// whole (`none`) and in small fixed blocks, and inconsistent settings refused by name.
#[wasm_bindgen_test]
async fn decode_plans_are_reported_and_agree() {
    let open = |options: Value| async move {
        let bytes = Uint8Array::from(fixture("tiny-llama-q4_1.gguf"));
        Engine::open(bytes.into(), js(&on_the_adapter(options))).await
    };
    let engine = open(json!({})).await.unwrap();
    let info = rust(&engine.info().unwrap());
    assert!(
        info["decodePlan"]
            .as_str()
            .unwrap_or("")
            .starts_with("auto"),
        "{info}"
    );
    let mut outputs = Vec::new();
    for options in [
        json!({ "decodePlan": "none" }),
        json!({ "decodePlan": "fixed", "decodeQChunk": 3 }),
    ] {
        let engine = open(options.clone()).await.unwrap();
        let info = rust(&engine.info().unwrap());
        let plan = info["decodePlan"].as_str().unwrap_or("").to_string();
        assert!(
            plan.starts_with(options["decodePlan"].as_str().unwrap()),
            "{plan}"
        );
        let result = generate(
            &engine,
            &json!([1, 5, 9]),
            json!({ "temperature": 0, "maxNewTokens": 24 }),
            &Events::new(),
        )
        .await
        .unwrap();
        outputs.push(result["tokens"].clone());
    }
    assert_eq!(outputs[0], outputs[1], "greedy tokens differ between plans");
    for (options, name) in [
        (json!({ "decodePlan": "sometimes" }), "decodePlan"),
        (json!({ "decodePlan": "fixed" }), "decodeQChunk"),
        (json!({ "decodeQChunk": 64 }), "decodeQChunk"),
        (
            json!({ "decodePlan": "fixed", "decodeQChunk": 8, "decodeLocalWindow": 16 }),
            "decode_local_window",
        ),
        (json!({ "decodeBucketMid": 100 }), "decodeBucketMid"),
    ] {
        let err = open(options.clone()).await.err().unwrap();
        assert!(message(&err).contains(name), "{options}: {}", message(&err));
    }
}

/// `precision`: where the adapter has no `shader-f16` (SwiftShader), `'f16'` is refused naming
/// the feature and `'auto'` runs in f32 with a notice; where it has it, `'f16'` generates. A bad
/// name is refused by name.
#[wasm_bindgen_test]
async fn precision_follows_the_adapter() {
    let open = |options: Value| async move {
        let bytes = Uint8Array::from(fixture("tiny-llama-q4_1.gguf"));
        Engine::open(bytes.into(), js(&on_the_adapter(options))).await
    };
    let engine = open(json!({ "precision": "auto" })).await.unwrap();
    let info = rust(&engine.info().unwrap());
    // auto: f16 on a GPU with the feature; f32 with a notice saying why otherwise
    if info["precision"] == "f32" {
        assert!(info["precisionNotice"].is_string(), "{info}");
    } else {
        assert_eq!(info["precision"], "f16", "{info}");
    }
    if info["shaderF16"] == true {
        let engine = open(json!({ "precision": "f16" })).await.unwrap();
        assert_eq!(rust(&engine.info().unwrap())["precision"], "f16");
        let result = generate(
            &engine,
            &json!([1, 5, 9]),
            json!({ "temperature": 0, "maxNewTokens": 8 }),
            &Events::new(),
        )
        .await
        .unwrap();
        assert!(!result["tokens"].as_array().unwrap().is_empty(), "{result}");
    } else {
        let notice = info["precisionNotice"].as_str().unwrap_or("");
        assert!(notice.contains("shader-f16"), "{info}");
        let err = open(json!({ "precision": "f16" })).await.err().unwrap();
        assert!(message(&err).contains("shader-f16"), "{}", message(&err));
    }
    let plain = rust(&open(json!({})).await.unwrap().info().unwrap());
    assert_eq!(plain["precision"], "f32");
    assert!(plain["precisionNotice"].is_null(), "{plain}");
    let err = open(json!({ "precision": "f8" })).await.err().unwrap();
    assert!(message(&err).contains("precision"), "{}", message(&err));
}

/// `options` with `backend: 'webgpu'`: these tests check the GPU path on SwiftShader (`auto`
/// would time it against the CPU backend and may pick either).
fn on_the_adapter(mut options: Value) -> Value {
    options["backend"] = json!("webgpu");
    options
}
