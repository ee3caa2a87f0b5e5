//! What every call of the JavaScript API shares: its prompt and options parsed when it is made,
//! the `onToken` callback checked and called, and events and results turned into JS objects.

use js_sys::Function;
use wasm_bindgen::prelude::*;

use super::types::GenerationResult;
use super::{js_error, to_js, to_json};
use crate::engine;
use crate::session::{GenerateOptions, Generation, Prompt, TokenEvent};
use crate::Error;

/// The prompt and options of a call, parsed when the call is made.
pub(crate) fn parse_call(
    prompt: &JsValue,
    options: &JsValue,
) -> Result<(Prompt, GenerateOptions), JsValue> {
    let prompt = Prompt::from_json(&to_json(prompt, "prompt")?).map_err(|e| js_error(&e))?;
    // A seed the session draws (`sampling::draw_seed`) is below 2^53 and is reported back in
    // `result.seed`.
    let options =
        GenerateOptions::from_json(&to_json(options, "options")?).map_err(|e| js_error(&e))?;
    Ok((prompt, options))
}

/// A token event as a JS `TokenEvent` object.
pub(crate) fn event_js(e: &TokenEvent) -> Result<JsValue, JsValue> {
    to_js(e)
}

/// The `onToken` argument: a function, or nothing.
pub(crate) fn on_token_function(on_token: JsValue) -> Result<Option<Function>, JsValue> {
    if !present(&on_token) {
        return Ok(None);
    }
    on_token
        .dyn_into()
        .map(Some)
        .map_err(|_| js_error(&Error::invalid("onToken", "must be a function")))
}

/// Calls `on_token` with every event; the first exception it throws is kept in `failure` and
/// aborts the call (later events are dropped).
pub(crate) fn emitter<'a>(
    on_token: Option<&'a Function>,
    inner: &'a engine::Engine,
    failure: &'a mut Option<JsValue>,
) -> impl FnMut(&TokenEvent) + 'a {
    move |e: &TokenEvent| {
        let Some(f) = on_token else { return };
        if failure.is_some() {
            return;
        }
        if let Err(err) = event_js(e).and_then(|v| f.call1(&JsValue::UNDEFINED, &v)) {
            *failure = Some(err);
            inner.abort();
        }
    }
}

/// A generation as a JS `GenerationResult`.
pub(crate) fn generation_js(g: &Generation) -> Result<JsValue, JsValue> {
    to_js(&GenerationResult::from(g))
}

pub(super) fn present(v: &JsValue) -> bool {
    !v.is_undefined() && !v.is_null()
}
