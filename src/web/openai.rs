//! `engine.chat.completions.create(request)` and `engine.completions.create(request)`: the
//! OpenAI-style API in the page (request and response shapes in [`crate::openai`]). With
//! `stream: true` the promise resolves to an async iterator of chunks, as the `openai` client's
//! streams are; leaving the loop early stops the generation.

use std::rc::Rc;

use js_sys::{Function, Promise};
use wasm_bindgen::prelude::*;

use super::{js_error, spawn_promise, to_js, to_json};
use crate::engine::{Cancel, Engine};
use crate::openai::{complete, CompletionKind, Request};

/// `engine.chat`: the chat namespace of the OpenAI-style API.
#[wasm_bindgen]
pub struct Chat {
    engine: Rc<Engine>,
}

/// `engine.chat.completions` or `engine.completions`: `create(request)`.
#[wasm_bindgen]
pub struct Completions {
    engine: Rc<Engine>,
    kind: CompletionKind,
}

impl Chat {
    pub(super) fn new(engine: Rc<Engine>) -> Self {
        Self { engine }
    }
}

impl Completions {
    pub(super) fn text(engine: Rc<Engine>) -> Self {
        Self {
            engine,
            kind: CompletionKind::Text,
        }
    }
}

#[wasm_bindgen]
impl Chat {
    /// `create(request)` for chat completions.
    #[wasm_bindgen(getter)]
    pub fn completions(&self) -> Completions {
        Completions {
            engine: Rc::clone(&self.engine),
            kind: CompletionKind::Chat,
        }
    }
}

#[wasm_bindgen]
impl Completions {
    /// Answers an OpenAI-style request (`messages` for chat, `prompt` for completions, and
    /// `temperature`, `top_p`, `max_tokens`, `stop`, `seed`, `n`, `response_format`,
    /// `frequency_penalty`, `presence_penalty`, `logit_bias`, `logprobs`, `stream`,
    /// `stream_options`). Resolves to the completion object, or with `stream: true` to an
    /// async iterator of chunk objects. Rejects, naming the field, on an unknown or invalid
    /// one. Queued like `generate`.
    #[wasm_bindgen(
        unchecked_return_type = "Promise<ChatCompletion | TextCompletion | AsyncIterableIterator<ChatCompletionChunk | TextCompletion>>"
    )]
    pub fn create(
        &self,
        #[wasm_bindgen(unchecked_param_type = "ChatCompletionRequest | CompletionRequest")]
        request: JsValue,
    ) -> Promise {
        let kind = self.kind;
        let parsed = to_json(&request, "request")
            .and_then(|text| Request::from_json(kind, &text).map_err(|e| js_error(&e)));
        let engine = Rc::clone(&self.engine);
        spawn_promise(async move {
            let request = parsed?;
            if !request.stream {
                let body = complete(&engine, &request, None, &mut |_| {})
                    .await
                    .map_err(|e| js_error(&e))?;
                return to_js(&body);
            }
            Ok(stream(engine, request))
        })
    }
}

/// The chunks of a streamed request as an async iterator (its return value is the whole
/// completion object).
fn stream(engine: Rc<Engine>, request: Request) -> JsValue {
    super::stream::iterate(engine, move |engine, cancel, on_chunk| {
        run(engine, cancel, request, on_chunk)
    })
}

fn run(engine: Rc<Engine>, cancel: Cancel, request: Request, on_chunk: Function) -> Promise {
    spawn_promise(async move {
        let mut failure = None;
        let body = complete(&engine, &request, Some(&cancel), &mut |chunk| {
            if failure.is_some() {
                return;
            }
            let sent = to_js(&chunk).and_then(|v| on_chunk.call1(&JsValue::UNDEFINED, &v));
            if let Err(err) = sent {
                failure = Some(err);
                cancel.cancel();
            }
        })
        .await
        .map_err(|e| js_error(&e))?;
        match failure {
            Some(err) => Err(err),
            None => to_js(&body),
        }
    })
}
