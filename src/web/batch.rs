//! `engine.generateBatch(prompts, options, onToken)`: several prompts decoded together, each
//! with its own options, results in input order.

use std::rc::Rc;

use js_sys::Promise;
use wasm_bindgen::prelude::*;

use super::calls::{emitter, generation_js, on_token_function};
use super::handle::Engine;
use super::{js_error, spawn_promise, to_json};
use crate::session::parse_batch;

#[wasm_bindgen]
impl Engine {
    /// Generates from every prompt, their sequences decoded together (one forward step
    /// advances all of them; a finished one makes room for the next waiting prompt).
    /// `prompts[i]` is a prompt, or `{ prompt, ...options }` whose options replace those of
    /// `options` for it; `options.maxBatch` caps the sequences per step (default: as many as
    /// the device and the KV memory allow). `onToken` sees every event, whose `prompt` names
    /// the prompt's index and `sequence` its sample. Resolves with the results in input
    /// order. Queued like `generate`; `abort()` ends every sequence.
    #[wasm_bindgen(
        js_name = generateBatch,
        unchecked_return_type = "Promise<GenerationResult[]>"
    )]
    pub fn generate_batch(
        &self,
        #[wasm_bindgen(unchecked_param_type = "(Prompt | BatchPrompt)[]")] prompts: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "BatchOptions")] options: JsValue,
        #[wasm_bindgen(
            js_name = onToken,
            unchecked_optional_param_type = "(event: TokenEvent) => void"
        )]
        on_token: JsValue,
    ) -> Promise {
        let parsed = to_json(&prompts, "prompts").and_then(|p| {
            let o = to_json(&options, "options")?;
            parse_batch(&p, &o).map_err(|e| js_error(&e))
        });
        let on_token = on_token_function(on_token);
        let inner = Rc::clone(&self.inner);
        spawn_promise(async move {
            let (items, max_batch) = parsed?;
            let on_token = on_token?;
            let mut failure: Option<JsValue> = None;
            let mut emit = emitter(on_token.as_ref(), &inner, &mut failure);
            let results = inner
                .generate_items(&items, max_batch, &mut emit)
                .await
                .map_err(|e| js_error(&e))?;
            drop(emit);
            if let Some(err) = failure {
                return Err(err);
            }
            let out = js_sys::Array::new();
            for g in &results {
                out.push(&generation_js(g)?);
            }
            Ok(out.into())
        })
    }
}
