//! The `Engine` class itself: what a JavaScript `Engine` object holds. Its methods are in the
//! files of their concerns (`engine.rs`: loading and generating; `batch.rs`, `draft.rs`,
//! `stored.rs`, `openai.rs`, `stream.rs`).

use std::cell::RefCell;
use std::rc::Rc;

use wasm_bindgen::prelude::*;

use super::types::EngineInfo;
use crate::engine;

/// A model loaded on the GPU, ready to generate.
///
/// Calls that use the model (`generate`, `stream`, `reset`) run one at a time: a call made
/// while another runs waits its turn (first come, first served) and never interleaves with
/// it. `abort()` stops only the running call. After a Rust panic every call rejects with
/// "the engine must be reloaded". After GPU device loss the failing call rejects with an error
/// whose message starts with `DeviceLost`, and the next call re-creates the device, re-uploads
/// the model from the bytes the engine kept and replays the conversation into the new KV
/// cache, so the conversation goes on where it was before the failing call.
#[wasm_bindgen]
pub struct Engine {
    pub(super) inner: Rc<engine::Engine>,
    /// What `info()` returns; refreshed when the engine is rebuilt on a new device.
    pub(super) info: Rc<RefCell<EngineInfo>>,
}

impl Drop for Engine {
    fn drop(&mut self) {
        // `free()`: a running call stops at its next token, queued calls reject; the model
        // and its GPU buffers go when the last call finishes.
        self.inner.close();
    }
}
