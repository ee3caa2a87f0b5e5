//! `engine.saveConversation(note)` and `engine.restoreConversation(bytes)`: the conversation
//! as bytes (its tokens and KV rows, see [`crate::session::saved_state`]) to keep where the
//! page likes (the private file system, IndexedDB, a download), and back, so that it goes on
//! after a reload without the model reading it again.

use std::rc::Rc;

use js_sys::{Promise, Uint8Array};
use wasm_bindgen::prelude::*;

use super::calls::present;
use super::handle::Engine;
use super::{js_error, spawn_promise, to_js, to_json};

#[wasm_bindgen]
impl Engine {
    /// The conversation as bytes, in its turn: the tokens the KV cache holds, its rows, and
    /// `note` (any JSON value the page keeps with it, such as its messages), with the model's
    /// fingerprint and the engine's version. Restore it with `restoreConversation` into an
    /// engine with the same model and KV-cache kind.
    #[wasm_bindgen(js_name = saveConversation, unchecked_return_type = "Promise<Uint8Array>")]
    pub fn save_conversation(&self, note: JsValue) -> Promise {
        let inner = Rc::clone(&self.inner);
        spawn_promise(async move {
            let note = match present(&note) {
                true => Some(
                    serde_json::from_str(&to_json(&note, "note")?)
                        .map_err(|e| js_error(&crate::Error::invalid("note", e.to_string())))?,
                ),
                false => None,
            };
            let bytes = inner.save_state(note).await.map_err(|e| js_error(&e))?;
            Ok(Uint8Array::from(bytes.as_slice()).into())
        })
    }

    /// Restores bytes `saveConversation` gave (in its turn): the KV rows are written back and
    /// the next call continues the conversation, with no forward pass over what it held.
    /// Resolves to `{ positions, note }`. Rejects, leaving the conversation as it was, when the
    /// bytes are cut, changed, or from another model, engine version or KV-cache kind (the
    /// message says which).
    #[wasm_bindgen(
        js_name = restoreConversation,
        unchecked_return_type = "Promise<{ positions: number, note: any }>"
    )]
    pub fn restore_conversation(&self, bytes: Uint8Array) -> Promise {
        let inner = Rc::clone(&self.inner);
        let bytes = bytes.to_vec();
        spawn_promise(async move {
            let restored = inner
                .restore_state(&bytes, "the saved conversation")
                .await
                .map_err(|e| js_error(&e))?;
            to_js(&serde_json::json!({
                "positions": restored.positions,
                "note": restored.note,
            }))
        })
    }
}
