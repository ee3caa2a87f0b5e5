//! Browser tests of how the JavaScript `Engine` loads (wasm-bindgen-test in headless Chromium on
//! WebGPU): a URL load stored in and then read from the Cache API (SmolLM2 from the model server
//! `./build.sh test` starts), the kernel plan reported, forced and profiled, and `backend:
//! 'auto'` on a software adapter timing both backends once and keeping the choice.

#![cfg(target_arch = "wasm32")]

use crate::common;

use common::browser_log as log;
use emberlm::web::Engine;
use js_sys::{Function, Promise, Reflect, Uint8Array};
use serde_json::json;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::wasm_bindgen_test;

use common::web_engine::*;

/// A model loaded from a URL with `cache` set is stored in that Cache API cache on the first
/// load and read from it on the second, with the same model. A tiny fixture from the test
/// server: what is checked is the Cache API path, which does not depend on the file's size
/// (the page test reloads SmolLM2 from the cache in the demo page).
#[wasm_bindgen_test]
async fn a_url_load_is_cached() {
    let name = "tiny-llama-q4_1.gguf";
    let Some(url) = common::fixture_url("a_url_load_is_cached", name) else {
        return;
    };
    let cache_name = "emberlm-test-cache";
    let caches: web_sys::CacheStorage = Reflect::get(&js_sys::global(), &"caches".into())
        .unwrap()
        .dyn_into()
        .unwrap();
    JsFuture::from(caches.delete(cache_name)).await.unwrap();
    let options = js(&json!({
        "cache": cache_name,
        "storage": "cacheApi",
        "contextLength": 64,
        "backend": "webgpu"
    }));
    let mut outputs = Vec::new();
    for (round, cached) in [(1, false), (2, true)] {
        let t = js_sys::Date::now();
        let engine = Engine::open(url.as_str().into(), options.clone())
            .await
            .unwrap_or_else(|e| panic!("{}", message(&e)));
        let info = rust(&engine.info().unwrap());
        log(&format!(
            "load {round} of {url}: {:.1} s, loadedFromCache {}, storedInCache {}",
            (js_sys::Date::now() - t) / 1000.0,
            info["loadedFromCache"],
            info["storedInCache"]
        ));
        assert_eq!(info["loadedFromCache"], cached);
        assert_eq!(info["storedInCache"], !cached);
        assert_eq!(info["model"]["name"], name, "{info}");
        assert_eq!(info["model"]["layers"], 2, "{info}");
        let result = generate_greedy(&engine).await;
        outputs.push(result["tokens"].clone());
    }
    assert_eq!(
        outputs[0], outputs[1],
        "the cached copy generates as the download"
    );
    let cache: web_sys::Cache = JsFuture::from(caches.open(cache_name))
        .await
        .unwrap()
        .dyn_into()
        .unwrap();
    let stored = JsFuture::from(cache.match_with_str(&url)).await.unwrap();
    assert!(!stored.is_undefined(), "{url} is not in the cache");
    JsFuture::from(caches.delete(cache_name)).await.unwrap();
}

#[wasm_bindgen_test]
async fn kernel_plan_is_reported_forced_and_profiled() {
    // the plan of the default load: every family decided (measured, or reused from the Cache API)
    let engine = load("tiny-llama-q4_1.gguf").await;
    let info = rust(&engine.info().unwrap());
    let plan = &info["kernelPlan"];
    for family in ["linear_decode", "linear_prefill", "attention"] {
        let choice = &plan["choices"][family];
        assert!(
            ["measured", "reused"].contains(&choice[1].as_str().unwrap_or("")),
            "{family}: {plan}"
        );
    }
    // both shapes forced compute the same greedy tokens
    let mut outputs = Vec::new();
    for variant in ["rows", "workgroup"] {
        let bytes = Uint8Array::from(fixture("tiny-llama-q4_1.gguf"));
        let options =
            js(&json!({ "name": "tiny-llama-q4_1.gguf", "kernels": variant, "backend": "webgpu" }));
        let engine = Engine::open(bytes.into(), options).await.unwrap();
        let info = rust(&engine.info().unwrap());
        assert_eq!(
            info["kernelPlan"]["choices"]["attention"],
            json!([variant, "forced"])
        );
        let result = generate_greedy(&engine).await;
        outputs.push(result["tokens"].clone());
        let profile = rust(
            &JsFuture::from(engine.profile(JsValue::UNDEFINED))
                .await
                .unwrap(),
        );
        let rows = profile["decode"]["rows"].as_array().unwrap();
        assert!(rows.iter().any(|r| r["kernel"] == "attention"), "{profile}");
        assert!(
            rows.iter().all(|r| r["seconds"].as_f64().unwrap() > 0.0),
            "{profile}"
        );
    }
    assert_eq!(outputs[0], outputs[1]);
    // an unknown variant is refused with the option's reason
    let bytes = Uint8Array::from(fixture("tiny-llama-q4_1.gguf"));
    let options = js(&json!({ "kernels": "attention=fast", "backend": "webgpu" }));
    let err = Engine::open(bytes.into(), options).await.err().unwrap();
    assert!(
        message(&err).contains("unknown kernel variant `fast`"),
        "{}",
        message(&err)
    );
}

/// `backend: 'auto'` on SwiftShader (a software adapter): the first load times a decode step on
/// the adapter and on the CPU backend and runs the model on the faster, saying so in `info()`;
/// the choice is kept in the Cache API, so the next load reads it instead of timing again.
#[wasm_bindgen_test]
async fn auto_on_a_software_adapter_times_both_backends_once() {
    // nothing recorded yet
    let caches = Reflect::get(&js_sys::global(), &"caches".into()).unwrap();
    let delete: Function = Reflect::get(&caches, &"delete".into()).unwrap().into();
    let deleted = delete.call1(&caches, &"emberlm-tune-v1".into()).unwrap();
    JsFuture::from(Promise::from(deleted)).await.unwrap();
    let name = "tiny-llama-q4_1.gguf";
    let open = || async move {
        let bytes = Uint8Array::from(fixture(name));
        Engine::open(
            bytes.into(),
            js(&json!({ "name": name, "backend": "auto" })),
        )
        .await
        .unwrap_or_else(|e| panic!("{}", message(&e)))
    };
    let first = open().await;
    let info = rust(&first.info().unwrap());
    let c = &info["backendChoice"];
    log(&format!("auto: {}", info["backendNotice"]));
    assert_eq!(c["measuredNow"], true, "{info}");
    let (gpu_ms, cpu_ms) = (c["gpuMs"].as_f64().unwrap(), c["cpuMs"].as_f64().unwrap());
    let faster = if cpu_ms <= gpu_ms { "cpu" } else { "gpu" };
    assert_eq!(c["backend"], faster, "{info}");
    assert_eq!(info["runsOn"], faster, "{info}");
    assert!(c["storedAt"].is_string(), "{info}");
    assert!(
        info["backendNotice"]
            .as_str()
            .is_some_and(|n| n.contains("software adapter")),
        "{info}"
    );
    let g = generate(
        &first,
        &json!("The software is provided"),
        json!({ "temperature": 0, "maxNewTokens": 4 }),
        &Events::new(),
    )
    .await
    .unwrap();
    assert_eq!(g["tokens"].as_array().map(Vec::len), Some(4), "{g}");
    drop(first);
    let second = open().await;
    let info = rust(&second.info().unwrap());
    let again = &info["backendChoice"];
    assert_eq!(again["measuredNow"], false, "{info}");
    assert_eq!(again["backend"], c["backend"], "{info}");
    for ms in ["gpuMs", "cpuMs"] {
        let (a, b) = (again[ms].as_f64().unwrap(), c[ms].as_f64().unwrap());
        assert!((a - b).abs() < 1e-9, "{ms}: {a} read back, {b} measured");
    }
    assert_eq!(info["runsOn"], faster, "{info}");
}

/// A split GGUF set (`tests/fixtures/split/`, three parts of `tiny-llama-q4_1.gguf` as gguf-py
/// writes them): from the first part's URL alone (the others fetched from beside it, stored,
/// and read back from the store by range), from a list of every part's bytes in another order,
/// and
/// as the whole file, the same greedy tokens; `Engine.listStored` lists the three parts with
/// their sizes and `Engine.deleteStored` of the first part's URL removes them all; a later
/// part's URL alone and an empty list are refused by name. On the CPU backend: what is checked is the loading, which the backends
/// share.
#[wasm_bindgen_test]
async fn a_split_set_loads_from_its_first_url_or_its_parts() {
    let first = "split/tiny-llama-q4_1-00001-of-00003.gguf";
    let Some(url) = common::fixture_url("a_split_set_loads_from_its_first_url_or_its_parts", first)
    else {
        return;
    };
    let cache_name = "emberlm-test-split";
    let caches: web_sys::CacheStorage = Reflect::get(&js_sys::global(), &"caches".into())
        .unwrap()
        .dyn_into()
        .unwrap();
    JsFuture::from(caches.delete(cache_name)).await.unwrap();
    let options = js(&json!({ "cache": cache_name, "contextLength": 64, "backend": "cpu" }));
    let whole = Engine::open(
        Uint8Array::from(fixture("tiny-llama-q4_1.gguf")).into(),
        js(&json!({ "contextLength": 64, "backend": "cpu" })),
    )
    .await
    .unwrap_or_else(|e| panic!("{}", message(&e)));
    let expected = generate_greedy(&whole).await["tokens"].clone();

    for (round, cached) in [(1, false), (2, true)] {
        let progress = js_sys::Array::new();
        let seen = progress.clone();
        let on_progress = Closure::<dyn Fn(JsValue)>::new(move |event: JsValue| {
            seen.push(&event);
        });
        let with_progress = options.clone();
        Reflect::set(
            &with_progress,
            &"onProgress".into(),
            on_progress.as_ref().unchecked_ref(),
        )
        .unwrap();
        let engine = Engine::open(url.as_str().into(), with_progress)
            .await
            .unwrap_or_else(|e| panic!("load {round} of {url}: {}", message(&e)));
        let info = rust(&engine.info().unwrap());
        assert_eq!(info["loadedFromCache"], cached, "{info}");
        assert_eq!(info["storedInCache"], !cached, "{info}");
        assert_eq!(info["model"]["name"], "tiny-llama-q4_1-00001-of-00003.gguf");
        assert_eq!(
            generate_greedy(&engine).await["tokens"],
            expected,
            "load {round}"
        );
        let events: Vec<serde_json::Value> = progress.iter().map(|e| rust(&e)).collect();
        let downloads: Vec<&serde_json::Value> =
            events.iter().filter(|e| e["phase"] == "download").collect();
        if cached {
            // read back from the store by range: nothing downloaded, the weights' `load`
            // progress ends at their bytes
            assert!(downloads.is_empty(), "{downloads:?}");
            assert_eq!(info["weightsReadByRange"], true, "{info}");
            let last = events
                .iter()
                .rfind(|e| e["phase"] == "load")
                .expect("load progress");
            let weights = info["model"]["weightBytes"].as_f64();
            assert_eq!(
                (last["loaded"].as_f64(), last["total"].as_f64()),
                (weights, weights)
            );
        } else {
            // the download's progress covers the three parts: it ends at their sum
            let last = downloads.last().expect("download progress");
            let sizes: f64 = [75_776.0, 26_688.0, 21_152.0].iter().sum();
            assert_eq!(
                (last["loaded"].as_f64(), last["total"].as_f64()),
                (Some(sizes), Some(sizes))
            );
        }
        log(&format!(
            "split set, load {round}: {} download events, loadedFromCache {cached}",
            downloads.len()
        ));
    }
    // Engine.listStored gives every part with its size; deleteStored of the first part's URL
    // deletes the three
    let listed = rust(
        &JsFuture::from(Engine::list_stored(cache_name.into()))
            .await
            .unwrap_or_else(|e| panic!("{}", message(&e))),
    );
    let mut listed: Vec<(String, f64)> = listed
        .as_array()
        .expect("a list")
        .iter()
        .map(|f| {
            (
                f["url"].as_str().unwrap().to_string(),
                f["bytes"].as_f64().unwrap(),
            )
        })
        .collect();
    listed.sort_by(|a, b| a.0.cmp(&b.0));
    let parts: Vec<(String, f64)> = [75_776.0, 26_688.0, 21_152.0]
        .iter()
        .enumerate()
        .map(|(i, &bytes)| {
            (
                url.replace("-00001-of-", &format!("-{:05}-of-", i + 1)),
                bytes,
            )
        })
        .collect();
    assert_eq!(listed, parts);
    let deleted = JsFuture::from(Engine::delete_stored(url.clone(), cache_name.into()))
        .await
        .unwrap_or_else(|e| panic!("{}", message(&e)));
    assert_eq!(deleted.as_f64(), Some(3.0));
    let listed = JsFuture::from(Engine::list_stored(cache_name.into()))
        .await
        .unwrap();
    assert_eq!(rust(&listed), json!([]), "the cache after deleteStored");
    JsFuture::from(caches.delete(cache_name)).await.unwrap();
    // a cache that does not exist lists nothing (and is not created)
    let missing = JsFuture::from(Engine::list_stored("emberlm-test-no-such-cache".into()))
        .await
        .unwrap();
    assert_eq!(rust(&missing), json!([]));
    let created = JsFuture::from(caches.has("emberlm-test-no-such-cache"))
        .await
        .unwrap();
    assert_eq!(created.as_bool(), Some(false));

    // every part's bytes, in another order
    let parts = js_sys::Array::new();
    for k in [3, 1, 2] {
        let part_url = url.replace("-00001-of-", &format!("-{k:05}-of-"));
        let bytes = common::fetch_bytes(&part_url).await.unwrap();
        parts.push(&Uint8Array::from(&bytes[..]));
    }
    let engine = Engine::open(
        parts.into(),
        js(&json!({ "contextLength": 64, "backend": "cpu" })),
    )
    .await
    .unwrap_or_else(|e| panic!("the parts as bytes: {}", message(&e)));
    assert_eq!(generate_greedy(&engine).await["tokens"], expected);

    // a later part alone, and an empty list
    let second = url.replace("-00001-of-", "-00002-of-");
    let e = Engine::open(second.as_str().into(), js(&json!({ "backend": "cpu" })))
        .await
        .err()
        .map(|e| message(&e))
        .expect("a later part alone is refused");
    assert!(e.contains("part 2 of a 3-part split GGUF set"), "{e}");
    let e = Engine::open(
        js_sys::Array::new().into(),
        js(&json!({ "backend": "cpu" })),
    )
    .await
    .err()
    .map(|e| message(&e))
    .expect("an empty list is refused");
    assert!(e.contains("an empty list of model files"), "{e}");
}
