//! Browser tests of the CPU backend (wasm-bindgen-test in headless Chromium): its kernels
//! against f64 on fresh random inputs, every tiny GGUF fixture against the float64 goldens
//! through the CPU forward pass compiled to WebAssembly, and the JavaScript `Engine` loaded
//! with `backend: 'cpu'` reproducing the native CLI's CPU continuations. None of it needs
//! WebGPU.

#![cfg(target_arch = "wasm32")]

mod common;

use common::browser_log as log;
use common::cpu_kernel_cases as cases;
use common::golden::Golden;
use common::web_engine::{fixture, generate, message, rust, Events, AGREEMENT};
use emberlm::loader::ModelFiles;
use emberlm::web::Engine;
use js_sys::{Reflect, Uint8Array};
use serde_json::{json, Value};
use wasm_bindgen_test::{wasm_bindgen_test, wasm_bindgen_test_configure};

wasm_bindgen_test_configure!(run_in_browser);

#[wasm_bindgen_test]
fn kernels_match_f64_in_webassembly() {
    let mut rng = common::rng("cpu kernels (wasm)", &|m| log(m));
    cases::check_matmul(&mut rng, true).unwrap_or_else(|e| panic!("{e}"));
    cases::check_attention(&mut rng).unwrap_or_else(|e| panic!("{e}"));
    cases::check_norms(&mut rng).unwrap_or_else(|e| panic!("{e}"));
    cases::check_dot_order(&mut rng).unwrap_or_else(|e| panic!("{e}"));
}

#[wasm_bindgen_test]
fn tiny_models_match_f64_goldens_on_the_cpu_in_webassembly() {
    for (name, bytes, golden) in common::web_fixtures::TINY_GGUFS {
        let files = ModelFiles::from_bytes(bytes.to_vec(), name).unwrap();
        let weights = files.weights().unwrap();
        let tol = common::cpu_cases::tolerance(name);
        let d = common::cpu_cases::check_model(
            name,
            &weights,
            &Golden::parse(golden),
            tol.max,
            tol.max / 2.0,
            true,
            tol.greedy,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        log(&format!(
            "{name}: |Δ logit| vs f64 max {:.2e}, mean {:.2e}",
            d.max, d.mean
        ));
        if let Some(mean) = tol.mean {
            assert!(
                d.mean <= mean,
                "{name}: mean {} above llama.cpp's {mean}",
                d.mean
            );
        }
    }
}

async fn load_cpu(name: &str, backend: &str) -> Result<Engine, String> {
    let bytes = Uint8Array::from(fixture(name));
    let options = js_sys::Object::new();
    Reflect::set(&options, &"name".into(), &name.into()).unwrap();
    Reflect::set(&options, &"backend".into(), &backend.into()).unwrap();
    Engine::open(bytes.into(), options.into())
        .await
        .map_err(|e| message(&e))
}

/// The page's engine on the CPU: what `info()` says, and greedy continuations equal to the
/// native CLI's on its CPU backend (`cpu_cases` of the agreement file).
#[wasm_bindgen_test]
async fn engine_on_the_cpu_agrees_with_the_native_cli() {
    let agreement: Value = serde_json::from_str(AGREEMENT).unwrap();
    let max_new = agreement["max_new_tokens"].clone();
    for case in agreement["cpu_cases"].as_array().unwrap() {
        let model = case["model"].as_str().unwrap();
        let engine = load_cpu(model, "cpu").await.unwrap();
        let info = rust(&engine.info().unwrap());
        assert_eq!(info["runsOn"], "cpu", "{info}");
        assert_eq!(
            info["threads"], 1,
            "no threads without cross-origin isolation"
        );
        assert!(info["kernelPlan"].is_null(), "{info}");
        let events = Events::new();
        let g = generate(
            &engine,
            &case["prompt"],
            json!({ "temperature": 0, "maxNewTokens": max_new }),
            &events,
        )
        .await
        .unwrap_or_else(|e| panic!("{model}: {e}"));
        log(&format!("{model} {}: {}", case["prompt"], g["text"]));
        assert_eq!(g["promptTokenIds"], case["prompt_tokens"], "{model}");
        assert_eq!(g["tokens"], case["tokens"], "{model} {}", case["prompt"]);
        assert_eq!(g["text"], case["text"], "{model}");
        assert_eq!(g["finishReason"], case["finish_reason"], "{model}");
        assert_eq!(
            Value::String(events.text()),
            g["text"],
            "events add up to the text"
        );
    }
}

/// An unknown backend is refused with a message that names the option.
#[wasm_bindgen_test]
async fn an_unknown_backend_is_named() {
    let e = load_cpu("tiny-llama-q4_1.gguf", "tpu").await.err().unwrap();
    assert!(e.contains("tpu") && e.contains("device"), "{e}");
}
