//! `engine.stream()`: one generation's token events as a JavaScript async iterator. The
//! iterator is `tokenStream` of `www/token_stream.js`, the one `EngineClient.stream()` uses
//! too; this side starts the generation for it and cancels it when asked. [`iterate`] does the
//! same for any call that hands out items (the OpenAI-style stream of chunks).

use std::rc::Rc;

use js_sys::{Function, Object, Promise};
use wasm_bindgen::prelude::*;

use super::calls::{event_js, generation_js};
use super::{js_error, set, spawn_promise};
use crate::engine::{Cancel, Engine};
use crate::session::{GenerateOptions, Prompt, TokenEvent};

#[wasm_bindgen(module = "/www/token_stream.js")]
extern "C" {
    /// `tokenStream(begin)`: calls `begin(onToken)`, which returns `{ result, cancel }`, and
    /// returns the async iterator over the events `onToken` receives.
    #[wasm_bindgen(js_name = tokenStream)]
    fn token_stream(begin: &Function) -> JsValue;
}

/// Starts (queues) the generation and returns its iterator. A parse error surfaces as the
/// first `next()` rejecting.
pub(crate) fn start(
    engine: Rc<Engine>,
    parsed: Result<(Prompt, GenerateOptions), JsValue>,
) -> JsValue {
    iterate(engine, move |engine, cancel, on_token| {
        run(engine, cancel, parsed, on_token)
    })
}

/// An async iterator over the items `work` hands to its `on_item` function: `work(engine,
/// cancel, on_item)` starts a call stopped by `cancel` and returns its promise, whose value
/// is the iterator's return value. Leaving the loop early cancels the call.
pub(crate) fn iterate(
    engine: Rc<Engine>,
    work: impl FnOnce(Rc<Engine>, Cancel, Function) -> Promise + 'static,
) -> JsValue {
    let begin = Closure::once_into_js(move |on_item: Function| -> JsValue {
        let cancel = engine.cancel_handle();
        let handle = Object::new();
        set(
            &handle,
            "result",
            &work(engine, cancel.clone(), on_item).into(),
        );
        let stop = Closure::once_into_js(move || cancel.cancel());
        set(&handle, "cancel", &stop);
        handle.into()
    });
    token_stream(begin.unchecked_ref())
}

/// The generation's promise: `on_token` gets each event; it resolves to the result.
fn run(
    engine: Rc<Engine>,
    cancel: Cancel,
    parsed: Result<(Prompt, GenerateOptions), JsValue>,
    on_token: Function,
) -> Promise {
    spawn_promise(async move {
        let (prompt, options) = parsed?;
        let mut failure = None;
        let mut emit = |e: &TokenEvent| {
            if failure.is_some() {
                return;
            }
            if let Err(err) = event_js(e).and_then(|v| on_token.call1(&JsValue::UNDEFINED, &v)) {
                failure = Some(err);
                cancel.cancel();
            }
        };
        let g = engine
            .generate_cancellable(&cancel, &prompt, &options, &mut emit)
            .await
            .map_err(|e| js_error(&e))?;
        match failure {
            Some(err) => Err(err),
            None => generation_js(&g),
        }
    })
}
