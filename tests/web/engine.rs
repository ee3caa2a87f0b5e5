//! Browser tests of the JavaScript `Engine` (wasm-bindgen-test in headless Chromium on
//! WebGPU): greedy generation agreeing with what the native CLI wrote
//! (`fixtures/native_browser_agreement.json`, also checked natively by
//! `tests/engine/native_browser_agreement.rs`),
//! option validation, abort, streaming (leaving a stream early cancels it), the call queue,
//! device loss, perplexity, echo and beam streaming. How the engine loads (a URL through the
//! Cache API, the kernel plan, `auto`'s backend choice) is in `tests/web/loading.rs`.

#![cfg(target_arch = "wasm32")]

use crate::common;

use std::cell::RefCell;
use std::rc::Rc;

use common::browser_log as log;
use emberlm::web::Engine;
use js_sys::{Function, Promise, Reflect, Uint8Array};
use serde_json::{json, Value};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::wasm_bindgen_test;

use common::web_engine::*;

#[wasm_bindgen_test]
async fn greedy_generation_agrees_with_the_native_cli() {
    let agreement: Value = serde_json::from_str(AGREEMENT).unwrap();
    let cases = agreement["cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    // one engine per model: a case on a model already loaded reuses its engine (each load
    // compiles the model's pipelines again, the most of a load's time on SwiftShader)
    let mut engines: Vec<(&str, Rc<Engine>)> = Vec::new();
    for case in cases {
        let model = case["model"].as_str().unwrap();
        let engine = match engines.iter().find(|(m, _)| *m == model) {
            Some((_, e)) => Rc::clone(e),
            None => {
                let e = load(model).await;
                engines.push((model, Rc::clone(&e)));
                e
            }
        };
        let events = Events::new();
        let result = generate(&engine, &case["prompt"], agreement_options(), &events)
            .await
            .unwrap_or_else(|e| panic!("{model}: {e}"));
        log(&format!(
            "{model} {}: {:?} ({})",
            case["prompt"], result["text"], result["finishReason"]
        ));
        assert_eq!(
            result["tokens"], case["tokens"],
            "{model} {}",
            case["prompt"]
        );
        assert_eq!(result["text"], case["text"], "{model}");
        assert_eq!(result["finishReason"], case["finish_reason"], "{model}");
        assert_eq!(result["promptTokenIds"], case["prompt_tokens"], "{model}");
        assert_eq!(
            Value::String(events.text()),
            result["text"],
            "events add up to the text"
        );
        let stats = &result["stats"];
        assert_eq!(
            stats["generatedTokens"],
            json!(case["tokens"].as_array().unwrap().len())
        );
        assert!(
            stats["timeToFirstTokenMs"].as_f64().unwrap() > 0.0,
            "{stats}"
        );
    }
}

#[wasm_bindgen_test]
async fn load_reports_progress_and_info() {
    let phases = Rc::new(RefCell::new(Vec::<Value>::new()));
    let sink = Rc::clone(&phases);
    let on_progress =
        Closure::<dyn FnMut(JsValue)>::new(move |p: JsValue| sink.borrow_mut().push(rust(&p)));
    let options = js_sys::Object::new();
    Reflect::set(&options, &"onProgress".into(), on_progress.as_ref()).unwrap();
    Reflect::set(&options, &"contextLength".into(), &64.into()).unwrap();
    Reflect::set(&options, &"backend".into(), &"webgpu".into()).unwrap();
    let bytes = Uint8Array::from(fixture("tiny-llama-q4_1.gguf"));
    let engine = Engine::open(bytes.into(), options.into())
        .await
        .unwrap_or_else(|e| panic!("{}", message(&e)));
    let phases = phases.borrow();
    for phase in ["download", "parse", "upload"] {
        let last = phases
            .iter()
            .rev()
            .find(|p| p["phase"] == phase)
            .unwrap_or_else(|| panic!("no {phase} progress in {phases:?}"));
        assert_eq!(last["loaded"], last["total"], "{phase} ends complete");
    }
    let info = rust(&engine.info().unwrap());
    log(&format!("info: {info}"));
    assert_eq!(info["backend"], "webgpu");
    assert_eq!(info["contextLength"], 64);
    assert_eq!(info["contextReason"], "asked for", "{info}");
    // the presets a page's menu fills in, from the engine's table (numbers as written)
    assert_eq!(
        info["presets"],
        json!([
            { "name": "conservative", "temperature": 0.3, "topK": 20, "topP": 1 },
            { "name": "balanced", "temperature": 0.8, "topK": 50, "topP": 0.9 },
            { "name": "creative", "temperature": 1.3, "topK": 100, "topP": 0.95 },
        ]),
        "{info}"
    );
    assert_eq!(info["model"]["arch"], "llama");
    assert_eq!(info["model"]["layers"], 2);
    assert_eq!(info["model"]["vocab"], 512);
    assert_eq!(info["model"]["kvHeads"], 2);
    assert_eq!(info["model"]["contextLength"], 128);
    assert_eq!(info["hasChatTemplate"], false);
}

#[wasm_bindgen_test]
async fn bad_files_and_bad_options_are_rejected_with_their_names() {
    let bad = Uint8Array::from(&b"GGUF\x03\0\0\0 not really a model"[..]);
    let err = Engine::open(bad.into(), JsValue::UNDEFINED)
        .await
        .err()
        .expect("a malformed file is rejected");
    assert!(message(&err).starts_with("Format: "), "{}", message(&err));
    let err = Engine::open(JsValue::from_f64(3.0), JsValue::UNDEFINED)
        .await
        .err()
        .expect("a number is no source");
    assert!(message(&err).contains("source"), "{}", message(&err));

    let engine = load("tiny-llama-q4_1.gguf").await;
    let info = rust(&engine.info().unwrap());
    assert_eq!(
        (&info["contextLength"], &info["contextReason"]),
        (&json!(128), &json!("the model's trained context")),
        "no contextLength: the model's 128"
    );
    let prompt = json!("The software is provided");
    for (options, names) in [
        (json!({ "topP": 1.5 }), ["topP", "top_p"]),
        (json!({ "top_p": 0 }), ["topP", "top_p"]),
        (json!({ "temperature": -1 }), ["temperature", "temperature"]),
        (
            json!({ "maxNewTokens": "many" }),
            ["maxNewTokens", "max_new_tokens"],
        ),
        (json!({ "special": "yes" }), ["special", "special"]),
        (
            json!({ "logitBias": { "9999": 1 } }),
            ["logitBias", "logit_bias"],
        ),
        (json!({ "bogus": 1 }), ["bogus", "bogus"]),
    ] {
        let err = generate(&engine, &prompt, options.clone(), &Events::new())
            .await
            .err()
            .unwrap_or_else(|| panic!("{options} was accepted"));
        log(&format!("{options}: {err}"));
        assert!(names.iter().any(|n| err.contains(n)), "{options}: {err}");
    }
    let err = generate(
        &engine,
        &json!({ "not": "a prompt" }),
        json!({}),
        &Events::new(),
    )
    .await
    .err()
    .unwrap();
    assert!(err.contains("prompt"), "{err}");
    // The engine is still fine.
    generate(
        &engine,
        &prompt,
        json!({ "temperature": 0, "maxNewTokens": 2 }),
        &Events::new(),
    )
    .await
    .unwrap();
}

#[wasm_bindgen_test]
async fn abort_from_on_token_stops_after_the_current_token() {
    let engine = load("tiny-llama-q4_1.gguf").await;
    let handle = Rc::clone(&engine);
    let events = Events::with(move |n| {
        if n == 3 {
            handle.abort();
        }
    });
    let options = json!({ "temperature": 0, "maxNewTokens": 64 });
    let result = generate(
        &engine,
        &json!("The software is provided"),
        options,
        &events,
    )
    .await
    .unwrap();
    log(&format!("aborted: {:?}", result["tokens"]));
    assert_eq!(result["finishReason"], "abort");
    assert!(result["tokens"].as_array().unwrap().len() <= 4, "{result}");
    // The next call is not aborted.
    let next = generate(
        &engine,
        &json!("The software is provided"),
        json!({ "temperature": 0, "maxNewTokens": 5 }),
        &Events::new(),
    )
    .await
    .unwrap();
    assert_eq!(next["finishReason"], "length");
}

/// Pulls every event out of a `TokenStream` iterator; returns them and the final result.
async fn drain(stream: &JsValue) -> (Vec<Value>, Value) {
    let next: Function = Reflect::get(stream, &"next".into())
        .unwrap()
        .dyn_into()
        .unwrap();
    let iter_fn: Function = Reflect::get(stream, &js_sys::Symbol::async_iterator())
        .unwrap()
        .dyn_into()
        .unwrap();
    assert!(
        iter_fn.call0(stream).unwrap() == *stream,
        "[Symbol.asyncIterator]() returns the stream"
    );
    let mut events = Vec::new();
    loop {
        let step: Promise = next.call0(stream).unwrap().dyn_into().unwrap();
        let step = JsFuture::from(step)
            .await
            .unwrap_or_else(|e| panic!("{}", message(&e)));
        let value = Reflect::get(&step, &"value".into()).unwrap();
        if Reflect::get(&step, &"done".into())
            .unwrap()
            .as_bool()
            .unwrap()
        {
            return (events, rust(&value));
        }
        events.push(rust(&value));
    }
}

#[wasm_bindgen_test]
async fn streaming_events_and_the_iterator_agree_with_the_result() {
    let engine = load("tiny-llama-q4_1.gguf").await;
    let prompt = json!([{ "role": "user", "content": "Permission is hereby granted" }]);
    let options = json!({ "temperature": 0, "maxNewTokens": 12, "stop": ["zzzz"] });
    let events = Events::new();
    let result = generate(&engine, &prompt, options.clone(), &events)
        .await
        .unwrap();
    assert_eq!(Value::String(events.text()), result["text"]);
    let ids: Vec<Value> = events
        .seen
        .borrow()
        .iter()
        .map(|e| e["id"].clone())
        .filter(|id| !id.is_null())
        .collect();
    assert_eq!(Value::Array(ids), result["tokens"]);

    JsFuture::from(engine.reset()).await.unwrap();
    let stream = engine.stream(js(&prompt), js(&options));
    let (streamed, returned) = drain(&stream).await;
    assert_eq!(
        streamed,
        *events.seen.borrow(),
        "the iterator yields the same events"
    );
    assert_eq!(returned["tokens"], result["tokens"]);
    assert_eq!(returned["text"], result["text"]);

    // A bad option rejects the first next().
    let stream = engine.stream(js(&prompt), js(&json!({ "topK": -1 })));
    let next: Function = Reflect::get(&stream, &"next".into())
        .unwrap()
        .dyn_into()
        .unwrap();
    let step: Promise = next.call0(&stream).unwrap().dyn_into().unwrap();
    let err = JsFuture::from(step).await.expect_err("topK -1 is rejected");
    assert!(message(&err).contains("top_k"), "{}", message(&err));
}

/// Calls the method `name` of `target` without arguments and awaits the promise it returns.
async fn call_async(target: &JsValue, name: &str) -> Result<JsValue, JsValue> {
    let method: Function = Reflect::get(target, &name.into())
        .unwrap()
        .dyn_into()
        .unwrap();
    let promise: Promise = method.call0(target).unwrap().dyn_into().unwrap();
    JsFuture::from(promise).await
}

fn is_done(step: &JsValue) -> bool {
    Reflect::get(step, &"done".into())
        .unwrap()
        .as_bool()
        .unwrap()
}

#[wasm_bindgen_test]
async fn leaving_a_stream_early_cancels_its_generation() {
    let engine = load("tiny-llama-q4_1.gguf").await;
    let info = rust(&engine.info().unwrap());
    // End-of-sequence tokens are ruled out, so only the cancel can end the generation early.
    let mut bias = serde_json::Map::new();
    for id in info["model"]["eosIds"].as_array().unwrap() {
        bias.insert(id.to_string(), json!(-100));
    }
    let max_new_tokens = 100;
    let options = json!({ "temperature": 0, "maxNewTokens": max_new_tokens, "logitBias": bias });
    let counters = || async { rust(&JsFuture::from(engine.counters()).await.unwrap()) };
    let before = counters().await;
    let stream = engine.stream("The software is provided".into(), js(&options));
    let first = call_async(&stream, "next").await.unwrap();
    assert!(!is_done(&first), "a first token event");
    assert!(rust(&Reflect::get(&first, &"value".into()).unwrap())["text"].is_string());
    // What `break` in a `for await` loop does.
    let returned = call_async(&stream, "return").await.unwrap();
    assert!(is_done(&returned));
    let after_return = call_async(&stream, "next").await.unwrap();
    assert!(is_done(&after_return), "nothing after return()");
    assert!(Reflect::get(&after_return, &"value".into())
        .unwrap()
        .is_undefined());
    // `counters()` waits for the cancelled generation to end: it ran only a few of its tokens.
    let after = counters().await;
    let ran = after["forwardTokens"].as_u64().unwrap() - before["forwardTokens"].as_u64().unwrap();
    log(&format!(
        "forward tokens run by the cancelled stream: {ran}"
    ));
    assert!(ran < max_new_tokens / 2, "{ran} tokens ran after return()");
    // The engine goes on with the next call.
    let events = Events::new();
    let next = generate(
        &engine,
        &json!("again"),
        json!({ "maxNewTokens": 3 }),
        &events,
    )
    .await
    .unwrap();
    assert_eq!(next["finishReason"], "length");
}

#[wasm_bindgen_test]
async fn concurrent_calls_wait_their_turn() {
    let engine = load("tiny-llama-q4_1.gguf").await;
    let order = Rc::new(RefCell::new(Vec::<char>::new()));
    let (a, b) = (Rc::clone(&order), Rc::clone(&order));
    let first = Closure::<dyn FnMut(JsValue)>::new(move |_| a.borrow_mut().push('a'));
    let second = Closure::<dyn FnMut(JsValue)>::new(move |_| b.borrow_mut().push('b'));
    let options = js(&json!({ "temperature": 0, "maxNewTokens": 6 }));
    let p1 = engine.generate(
        "The software is provided".into(),
        options.clone(),
        first.as_ref().clone(),
    );
    let p2 = engine.generate(
        "you may not use this file except".into(),
        options,
        second.as_ref().clone(),
    );
    let (r1, r2) = (
        JsFuture::from(p1).await.unwrap(),
        JsFuture::from(p2).await.unwrap(),
    );
    let order: String = order.borrow().iter().collect();
    log(&format!("event order: {order}"));
    assert!(
        order.starts_with('a') && order.trim_start_matches('a').chars().all(|c| c == 'b'),
        "{order}"
    );
    assert_eq!(rust(&r1)["finishReason"], "length");
    assert_eq!(rust(&r2)["finishReason"], "length");
}

#[wasm_bindgen_test]
async fn device_loss_rejects_one_call_then_the_engine_recovers() {
    let engine = load("tiny-llama-q4_1.gguf").await;
    let agreement: Value = serde_json::from_str(AGREEMENT).unwrap();
    let case = agreement["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["model"] == "tiny-llama-q4_1.gguf")
        .unwrap()
        .clone();
    // A first call leaves its prompt in the KV cache: the conversation the rebuild replays.
    let before = generate(
        &engine,
        &case["prompt"],
        agreement_options(),
        &Events::new(),
    )
    .await
    .unwrap();
    JsFuture::from(engine.destroy_device_for_test())
        .await
        .unwrap();
    let err = generate(
        &engine,
        &case["prompt"],
        agreement_options(),
        &Events::new(),
    )
    .await
    .expect_err("the call after device loss fails");
    log(&format!("after destroy: {err}"));
    assert!(err.starts_with("DeviceLost"), "{err}");
    let result = generate(
        &engine,
        &case["prompt"],
        agreement_options(),
        &Events::new(),
    )
    .await
    .unwrap_or_else(|e| panic!("the engine did not recover: {e}"));
    assert_eq!(result["tokens"], case["tokens"]);
    // The replayed conversation was reused: the prompt's KV rows were not run again.
    assert_eq!(
        result["stats"]["cachedTokens"],
        before["stats"]["promptTokens"].as_u64().unwrap() - 1,
        "{result}"
    );
}

/// `engine.perplexity(text)`: the tokens predicted, the mean NLL and its exponential; a text of
/// one token is refused naming it.
#[wasm_bindgen_test]
async fn perplexity_scores_a_text() {
    let engine = load("tiny-llama-q4_1.gguf").await;
    let text = "The software runs in the page, on the GPU of the visitor.";
    let n = rust(
        &JsFuture::from(engine.tokenize(text.into(), JsValue::UNDEFINED))
            .await
            .unwrap(),
    )
    .as_array()
    .map_or(0, Vec::len);
    let score = rust(
        &JsFuture::from(engine.perplexity(text.into()))
            .await
            .unwrap(),
    );
    assert_eq!(score["tokens"].as_u64(), Some(n as u64 - 1), "{score}");
    let (nll, ppl) = (
        score["nll"].as_f64().unwrap(),
        score["ppl"].as_f64().unwrap(),
    );
    assert!(
        nll > 0.0 && (ppl - nll.exp()).abs() <= 1e-9 * ppl,
        "{score}"
    );
    let err = JsFuture::from(engine.perplexity("".into()))
        .await
        .unwrap_err();
    assert!(message(&err).contains("text"), "{}", message(&err));
}

/// `echo: true`: the first event carries the prompt (`id: null`) and the result's text starts
/// with it; the tokens are the generated ones, as without echo.
#[wasm_bindgen_test]
async fn echo_streams_the_prompt_first() {
    let engine = load("tiny-llama-q4_1.gguf").await;
    let prompt = json!("The software");
    let options = json!({ "temperature": 0, "maxNewTokens": 5 });
    let plain = generate(&engine, &prompt, options.clone(), &Events::new())
        .await
        .unwrap();
    let mut with_echo = options;
    with_echo["echo"] = json!(true);
    let events = Events::new();
    let echoed = generate(&engine, &prompt, with_echo, &events)
        .await
        .unwrap();
    let first = events.seen.borrow()[0].clone();
    assert!(first["id"].is_null(), "{first}");
    assert_eq!(first["text"], "The software", "{first}");
    assert!(events.text().starts_with("The software"));
    assert_eq!(echoed["tokens"], plain["tokens"], "{echoed}");
    assert_eq!(
        echoed["text"].as_str().unwrap(),
        format!("The software{}", plain["text"].as_str().unwrap())
    );
}

/// Beam search streams its progress: one event per step naming the leading beam's text (no
/// token, no text of its own), steps in order, then the final sequences as before.
#[wasm_bindgen_test]
async fn beam_search_streams_the_leader() {
    let engine = load("tiny-llama-q4_1.gguf").await;
    let events = Events::new();
    let result = generate(
        &engine,
        &json!([1, 5, 9]),
        json!({ "numBeams": 3, "maxNewTokens": 6, "numReturnSequences": 2 }),
        &events,
    )
    .await
    .unwrap();
    let seen = events.seen.borrow().clone();
    let progress: Vec<&Value> = seen.iter().filter(|e| e["beam"].is_object()).collect();
    assert!(!progress.is_empty(), "{seen:?}");
    for (i, e) in progress.iter().enumerate() {
        assert_eq!(e["beam"]["step"], i, "{e}");
        assert!(e["id"].is_null() && e["text"] == "", "{e}");
        assert!(
            e["beam"]["text"].is_string() && e["beam"]["switched"].is_boolean(),
            "{e}"
        );
    }
    // the sequences follow the progress, with the texts the result holds
    let finals: Vec<&Value> = seen.iter().filter(|e| !e["beam"].is_object()).collect();
    assert_eq!(finals.len(), 2, "{seen:?}");
    for (f, s) in finals.iter().zip(result["sequences"].as_array().unwrap()) {
        assert_eq!(f["text"], s["text"]);
    }
}
