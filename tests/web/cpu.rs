//! Browser tests of the CPU backend (wasm-bindgen-test in headless Chromium): its kernels
//! against f64 on fresh random inputs, every tiny GGUF fixture against the float64 goldens
//! through the CPU forward pass compiled to WebAssembly, and the JavaScript `Engine` loaded
//! with `backend: 'cpu'` reproducing the native CLI's CPU continuations. None of it needs
//! WebGPU.

#![cfg(target_arch = "wasm32")]

use crate::common;

use common::browser_log as log;
use common::cpu_kernel_cases as cases;
use common::golden::Golden;
use common::web_engine::{fixture, generate, message, rust, Events, AGREEMENT};
use emberlm::loader::ModelFiles;
use emberlm::web::Engine;
use js_sys::{Reflect, Uint8Array};
use serde_json::{json, Value};
use wasm_bindgen_test::wasm_bindgen_test;

#[wasm_bindgen_test]
fn kernels_match_f64_in_webassembly() {
    let mut rng = common::rng("cpu kernels (wasm)", &|m| log(m));
    cases::check_matmul(&mut rng, true).unwrap_or_else(|e| panic!("{e}"));
    cases::check_attention(&mut rng).unwrap_or_else(|e| panic!("{e}"));
    cases::check_norms(&mut rng).unwrap_or_else(|e| panic!("{e}"));
    cases::check_dot_order(&mut rng).unwrap_or_else(|e| panic!("{e}"));
}

/// The tiled product of a relaxed-SIMD build against the row path bit for bit (a plain
/// SIMD128 build keeps every matrix as stored: nothing to compare, said so).
#[wasm_bindgen_test]
fn tiles_match_the_row_path_in_webassembly() {
    let mut rng = common::rng("cpu tiles (wasm)", &|m| log(m));
    let tiled = cases::check_tiles_match_rows(&mut rng).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        tiled,
        cfg!(target_feature = "relaxed-simd"),
        "tiles are made exactly in the relaxed-SIMD build"
    );
    log(&format!(
        "tiles ({}): {}",
        emberlm::backend::cpu::dot::instruction_set(),
        if tiled {
            "bit for bit with the row path"
        } else {
            "none in this build"
        }
    ));
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
        // the test module is built without `+simd128` (the page's worker loads the SIMD build
        // where the browser has it: tests/e2e/page.test.mjs)
        let expected = if cfg!(target_feature = "relaxed-simd") {
            "simd128+relaxed"
        } else if cfg!(target_feature = "simd128") {
            "simd128"
        } else {
            "scalar"
        };
        assert_eq!(info["cpuInstructions"], expected, "{info}");
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

/// The page's engine on the CPU scores the texts of `cpu_perplexity` in the agreement file to
/// the native CLI's mean NLL, bit for bit (`tests/engine/native_browser_agreement.rs` holds the
/// native side to the same bits).
#[wasm_bindgen_test]
async fn cpu_perplexity_is_the_native_clis_bit_for_bit() {
    let agreement: Value = serde_json::from_str(AGREEMENT).unwrap();
    let cases = agreement["cpu_perplexity"].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let model = case["model"].as_str().unwrap();
        let engine = load_cpu(model, "cpu").await.unwrap();
        let text = case["text"].as_str().unwrap();
        let score = wasm_bindgen_futures::JsFuture::from(engine.perplexity(text.into()))
            .await
            .unwrap_or_else(|e| panic!("{model}: {}", message(&e)));
        // read as a JavaScript number, not through JSON text (whose parsing may round)
        let nll = Reflect::get(&score, &"nll".into())
            .unwrap()
            .as_f64()
            .unwrap();
        let want = common::agreement_nll(case);
        log(&format!("{model}: mean NLL {nll} (native CLI {want})"));
        assert!(
            nll.to_bits() == want.to_bits(),
            "{model}: mean NLL {nll:e} in WebAssembly, {want:e} natively ({:e} apart)",
            nll - want
        );
    }
}

/// An unknown backend is refused with a message that names the option.
#[wasm_bindgen_test]
async fn an_unknown_backend_is_named() {
    let e = load_cpu("tiny-llama-q4_1.gguf", "tpu").await.err().unwrap();
    assert!(e.contains("tpu") && e.contains("device"), "{e}");
}

/// A record as the schema below allows it: `{"name": "<1 to 8 letters>", "n": <0..=99>}`.
fn check_record(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let obj = v.as_object().unwrap_or_else(|| panic!("{text}"));
    assert_eq!(obj.len(), 2, "{text}");
    let name = obj["name"].as_str().unwrap_or_else(|| panic!("{text}"));
    assert!(
        name.len() <= 8 && name.bytes().all(|b| b.is_ascii_lowercase()),
        "{text}"
    );
    assert!(obj["n"].as_u64().is_some_and(|n| n <= 99), "{text}");
}

/// Structured output and the OpenAI-style API in the page: `chat.completions.create` with a
/// JSON schema (whole and streamed), and `generate` with a regular expression.
#[wasm_bindgen_test]
async fn structured_output_and_the_openai_api_in_the_page() {
    use wasm_bindgen_futures::JsFuture;
    let engine = load_cpu("tiny-gpt2-f32.gguf", "cpu").await.unwrap();
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[a-z]{1,8}$"},
            "n": {"type": "integer", "minimum": 0, "maximum": 99}
        },
        "required": ["name", "n"],
        "additionalProperties": false
    });
    let request = json!({
        "messages": [{"role": "user", "content": "A record"}],
        "n": 3,
        "seed": 4,
        "max_tokens": 60,
        "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
    });
    let completions = engine.chat().completions();
    let r = JsFuture::from(completions.create(common::web_engine::js(&request)))
        .await
        .map(|v| rust(&v))
        .unwrap_or_else(|e| panic!("{}", message(&e)));
    assert_eq!(r["object"], "chat.completion");
    for choice in r["choices"].as_array().unwrap() {
        assert_eq!(choice["finish_reason"], "stop", "{choice}");
        check_record(choice["message"]["content"].as_str().unwrap());
    }
    // streamed: chunks through the async iterator, the same text as a whole call
    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    streamed["n"] = json!(1);
    let iterator = JsFuture::from(completions.create(common::web_engine::js(&streamed)))
        .await
        .unwrap_or_else(|e| panic!("{}", message(&e)));
    let next: js_sys::Function = Reflect::get(&iterator, &"next".into()).unwrap().into();
    let mut text = String::new();
    let mut chunks = Vec::new();
    loop {
        let step = JsFuture::from(js_sys::Promise::from(next.call0(&iterator).unwrap()))
            .await
            .unwrap_or_else(|e| panic!("{}", message(&e)));
        if Reflect::get(&step, &"done".into()).unwrap().as_bool() == Some(true) {
            break;
        }
        let chunk = rust(&Reflect::get(&step, &"value".into()).unwrap());
        if let Some(t) = chunk["choices"][0]["delta"]["content"].as_str() {
            text.push_str(t);
        }
        chunks.push(chunk);
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
    check_record(&text);
    assert_eq!(
        text,
        r["choices"][0]["message"]["content"].as_str().unwrap()
    );
    // an unknown field is named
    let bad = json!({"messages": [{"role": "user", "content": "x"}], "temprature": 1});
    let e = JsFuture::from(completions.create(common::web_engine::js(&bad)))
        .await
        .err()
        .map(|e| message(&e))
        .unwrap();
    assert!(e.contains("temprature"), "{e}");
    // generate() with a regular expression
    let g = generate(
        &engine,
        &json!("code"),
        json!({"seed": 1, "maxNewTokens": 20, "responseFormat": {"type": "regex", "regex": "[0-9]{3}-[a-z]{2}"}}),
        &Events::new(),
    )
    .await
    .unwrap();
    let code = g["sequences"][0]["text"].as_str().unwrap();
    let b = code.as_bytes();
    assert!(
        b.len() == 6
            && b[..3].iter().all(u8::is_ascii_digit)
            && b[3] == b'-'
            && b[4..].iter().all(u8::is_ascii_lowercase),
        "{code:?}"
    );
    // one constrained draw per token; the grammar's end needs no extra step
    assert_eq!(
        g["stats"]["constrainedSteps"], g["stats"]["generatedTokens"],
        "{g}"
    );
}
