//! What the browser tests of the JavaScript `Engine` share: the fixtures compiled in, JSON
//! between Rust and JavaScript, loading, collecting token events and generating.

use std::cell::RefCell;
use std::rc::Rc;

use emberlm::web::Engine;
use js_sys::{Reflect, Uint8Array};
use serde_json::{json, Value};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

pub const AGREEMENT: &str = include_str!("../fixtures/native_browser_agreement.json");

pub fn fixture(name: &str) -> &'static [u8] {
    let fixtures = &super::web_fixtures::TINY_GGUFS;
    fixtures
        .iter()
        .chain(&super::web_fixtures::ENCODER_GGUFS)
        .find(|(file, _, _)| *file == name)
        .map(|(_, bytes, _)| *bytes)
        .unwrap_or_else(|| panic!("no fixture {name} compiled into the browser test"))
}

pub fn js(value: &Value) -> JsValue {
    js_sys::JSON::parse(&value.to_string()).unwrap()
}

pub fn rust(value: &JsValue) -> Value {
    let text = js_sys::JSON::stringify(value).unwrap().as_string().unwrap();
    serde_json::from_str(&text).unwrap()
}

pub fn message(error: &JsValue) -> String {
    error
        .dyn_ref::<js_sys::Error>()
        .map(|e| String::from(e.message()))
        .unwrap_or_else(|| format!("{error:?}"))
}

pub async fn load(name: &str) -> Rc<Engine> {
    let bytes = Uint8Array::from(fixture(name));
    let options = js_sys::Object::new();
    Reflect::set(&options, &"name".into(), &name.into()).unwrap();
    // the adapter (SwiftShader): these tests check the GPU path (`auto` would time it against
    // the CPU backend and may pick either)
    Reflect::set(&options, &"backend".into(), &"webgpu".into()).unwrap();
    let engine = Engine::open(bytes.into(), options.into())
        .await
        .unwrap_or_else(|e| panic!("loading {name}: {}", message(&e)));
    Rc::new(engine)
}

/// `name` loaded on the CPU backend (wasm), as a page without WebGPU gets it.
pub async fn load_cpu(name: &str) -> Engine {
    let bytes = Uint8Array::from(fixture(name));
    let options = js_sys::Object::new();
    Reflect::set(&options, &"name".into(), &name.into()).unwrap();
    Reflect::set(&options, &"backend".into(), &"cpu".into()).unwrap();
    Engine::open(bytes.into(), options.into()).await.unwrap()
}

/// Collects token events in a JS callback.
pub struct Events {
    pub seen: Rc<RefCell<Vec<Value>>>,
    callback: Closure<dyn FnMut(JsValue)>,
}

impl Events {
    pub fn new() -> Self {
        Self::with(|_| {})
    }

    /// Also runs `each(count so far)` after every event.
    pub fn with(mut each: impl FnMut(usize) + 'static) -> Self {
        let seen = Rc::new(RefCell::new(Vec::new()));
        let sink = Rc::clone(&seen);
        let callback = Closure::new(move |e: JsValue| {
            sink.borrow_mut().push(rust(&e));
            let n = sink.borrow().len();
            each(n);
        });
        Self { seen, callback }
    }

    pub fn function(&self) -> JsValue {
        self.callback.as_ref().clone()
    }

    pub fn text(&self) -> String {
        self.seen
            .borrow()
            .iter()
            .map(|e| e["text"].as_str().unwrap_or_default().to_string())
            .collect()
    }
}

pub async fn generate(
    engine: &Engine,
    prompt: &Value,
    options: Value,
    events: &Events,
) -> Result<Value, String> {
    let promise = engine.generate(js(prompt), js(&options), events.function());
    JsFuture::from(promise)
        .await
        .map(|v| rust(&v))
        .map_err(|e| message(&e))
}

pub fn agreement_options() -> Value {
    let agreement: Value = serde_json::from_str(AGREEMENT).unwrap();
    json!({ "temperature": 0, "maxNewTokens": agreement["max_new_tokens"] })
}

/// The engine's greedy generation result for the token prompt `[1, 5, 9]` under
/// [`agreement_options`]: the shared smoke generation of the load and memory tests.
pub async fn generate_greedy(engine: &Engine) -> Value {
    generate(
        engine,
        &json!([1, 5, 9]),
        agreement_options(),
        &Events::new(),
    )
    .await
    .unwrap()
}

/// A name no earlier run used: the stores, fault ids and served counts of one test run are its
/// own.
pub fn unique(what: &str) -> String {
    format!("{what}-{}", (js_sys::Math::random() * 1e12) as u64)
}

/// `Engine.load(source, options)` with its `info()`, or the error's message.
pub async fn open_info(source: JsValue, options: &Value) -> Result<(Engine, Value), String> {
    let engine = Engine::open(source, js(options))
        .await
        .map_err(|e| message(&e))?;
    let info = rust(&engine.info().map_err(|e| message(&e))?);
    Ok((engine, info))
}
