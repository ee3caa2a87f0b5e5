//! The JavaScript surface (wasm32 only): converts between JS and Rust values and hands the
//! engine's futures to JavaScript as promises. The engine itself (queue, cancellation,
//! device-loss recovery) is [`crate::engine`], shared with the command-line tool.
//!
//! **Panics.** On wasm32 a panic aborts the module (a trap), so the future it happened in never
//! completes and its promise would stay pending forever. The panic hook installed here (by
//! `start` and again by `Engine.load`, whichever runs first) therefore rejects every promise
//! this module handed out and has not yet settled, and marks the module as poisoned: from then
//! on every call rejects (or throws) with a message saying the engine must be reloaded. A
//! `std::panic::set_hook` hook was chosen over a JavaScript-side wrapper because it runs at the
//! moment of the panic, whichever JavaScript task the trap then unwinds through.

mod batch;
mod before_download;
mod blob_source;
mod calls;
mod download;
mod draft;
mod embed;
mod engine;
mod handle;
mod http_source;
mod load;
mod openai;
mod opfs;
mod pump;
mod saved;
mod source;
mod stored;
mod stream;
mod types;
mod typescript;
mod typescript_options;

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::rc::Rc;

use js_sys::{Function, Promise, Reflect};
use wasm_bindgen::prelude::*;

use crate::backend::gpu::{GpuContext, GpuOptions};
use crate::Error;

pub use handle::Engine;

/// Settles a tracked operation with an error (used when a panic stops the module).
type Rejecter = Rc<dyn Fn(&JsValue)>;

thread_local! {
    /// The message of the panic that poisoned the module, if one did.
    static PANICKED: RefCell<Option<String>> = const { RefCell::new(None) };
    /// Operations started and not yet settled, by id.
    static PENDING: RefCell<Vec<(u64, Rejecter)>> = const { RefCell::new(Vec::new()) };
    static NEXT_ID: Cell<u64> = const { Cell::new(0) };
}

/// Installs the panic hook so a Rust panic shows its message in the console and rejects
/// every pending promise.
#[wasm_bindgen(start)]
pub fn start() {
    install_panic_hook();
}

fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Whatever hook was there (a test harness's) still runs.
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            console_error_panic_hook::hook(info);
            previous(info);
            on_panic(info);
        }));
    });
}

fn on_panic(info: &std::panic::PanicHookInfo<'_>) {
    let message = info.to_string();
    PANICKED.with(|p| {
        if let Ok(mut p) = p.try_borrow_mut() {
            p.get_or_insert(message);
        }
    });
    let pending = PENDING.with(|p| {
        p.try_borrow_mut()
            .map(|mut p| std::mem::take(&mut *p))
            .unwrap_or_default()
    });
    if let Err(error) = check_alive() {
        for (_, reject) in pending {
            reject(&error);
        }
    }
}

/// `Err` (the error every call now gets) once a panic has poisoned the module.
fn check_alive() -> Result<(), JsValue> {
    let panicked = PANICKED.with(|p| p.try_borrow().map(|p| p.clone()).unwrap_or(None));
    match panicked {
        None => Ok(()),
        Some(message) => Err(js_message(
            "Panic",
            &format!("the engine must be reloaded: it stopped on an internal error ({message})"),
        )),
    }
}

/// Registers an operation that a panic must settle; returns its id for [`untrack`].
fn track(reject: Rejecter) -> u64 {
    let id = NEXT_ID.with(|n| {
        let id = n.get();
        n.set(id + 1);
        id
    });
    PENDING.with(|p| p.borrow_mut().push((id, reject)));
    id
}

/// Forgets a settled operation; `false` when a panic has already settled it.
fn untrack(id: u64) -> bool {
    PENDING.with(|p| {
        let mut p = p.borrow_mut();
        let before = p.len();
        p.retain(|(i, _)| *i != id);
        p.len() != before
    })
}

/// Runs `future` on the browser's task queue, calling `settle` with its outcome, or `on_panic`
/// if a panic stops the module first.
fn spawn_tracked<F>(
    future: F,
    settle: impl FnOnce(Result<JsValue, JsValue>) + 'static,
    on_panic: Rejecter,
) where
    F: Future<Output = Result<JsValue, JsValue>> + 'static,
{
    let id = track(on_panic);
    wasm_bindgen_futures::spawn_local(async move {
        let outcome = future.await;
        if untrack(id) {
            settle(outcome);
        }
    });
}

/// A promise for `future`'s outcome, rejected at once when the module is poisoned and rejected
/// by the panic hook when a panic stops it.
fn spawn_promise<F>(future: F) -> Promise
where
    F: Future<Output = Result<JsValue, JsValue>> + 'static,
{
    if let Err(e) = check_alive() {
        return Promise::reject(&e);
    }
    let mut settle: Option<(Function, Function)> = None;
    let promise = Promise::new(&mut |resolve, reject| settle = Some((resolve, reject)));
    // The executor runs synchronously, so both functions are there.
    let Some((resolve, reject)) = settle else {
        return promise;
    };
    let on_panic: Rejecter = {
        let reject = reject.clone();
        Rc::new(move |e: &JsValue| {
            let _ = reject.call1(&JsValue::UNDEFINED, e);
        })
    };
    spawn_tracked(
        future,
        move |outcome| {
            let _ = match outcome {
                Ok(v) => resolve.call1(&JsValue::UNDEFINED, &v),
                Err(e) => reject.call1(&JsValue::UNDEFINED, &e),
            };
        },
        on_panic,
    );
    promise
}

/// A JS `Error` whose message is `"{kind}: {message}"`, with `kind` also set as a property.
fn js_message(kind: &str, message: &str) -> JsValue {
    let error = js_sys::Error::new(&format!("{kind}: {message}"));
    set(&error, "kind", &JsValue::from_str(kind));
    error.into()
}

/// A JS `Error` for an engine error: the message starts with the error's kind (`DeviceLost: `,
/// `Limit: `, `InvalidArgument: `, ...); `kind` is a property too, and so are the fields a page
/// shows in its own words (`option` for a bad argument; `what`, `limit`, `needed`, `allowed`
/// for a device limit; `what` and `allocated` for a GPU out of memory).
fn js_error(e: &Error) -> JsValue {
    let error = js_message(e.kind(), &e.to_string());
    match e {
        Error::InvalidArgument { name, .. } => set(&error, "option", &JsValue::from_str(name)),
        Error::Limit {
            what,
            limit,
            needed,
            allowed,
        } => {
            set(&error, "what", &JsValue::from_str(what));
            set(&error, "limit", &JsValue::from_str(limit));
            set(&error, "needed", &JsValue::from_f64(*needed as f64));
            set(&error, "allowed", &JsValue::from_f64(*allowed as f64));
        }
        Error::OutOfMemory {
            what, allocated, ..
        } => {
            set(&error, "what", &JsValue::from_str(what));
            set(&error, "allocated", &JsValue::from_f64(*allocated as f64));
        }
        _ => {}
    }
    error
}

fn set(target: &JsValue, key: &str, value: &JsValue) {
    // Setting a property on a fresh object cannot fail.
    let _ = Reflect::set(target, &JsValue::from_str(key), value);
}

/// A Rust value as a plain JS object, as `JSON.parse` of its JSON would give it (`None` as
/// `null`, maps as objects), built directly without JSON text.
fn to_js<T: serde::Serialize>(value: &T) -> Result<JsValue, JsValue> {
    value
        .serialize(&serde_wasm_bindgen::Serializer::json_compatible())
        .map_err(|e| js_message("Internal", &format!("could not convert a value: {e}")))
}

/// A JS value as JSON text (`undefined` becomes `null`); functions and `undefined` members are
/// dropped, as `JSON.stringify` does.
fn to_json(value: &JsValue, what: &'static str) -> Result<String, JsValue> {
    if value.is_undefined() {
        return Ok("null".to_string());
    }
    js_sys::JSON::stringify(value)
        .ok()
        .and_then(|s| s.as_string())
        .ok_or_else(|| {
            js_error(&Error::invalid(
                what,
                "cannot be converted to JSON (a BigInt or a cycle?)",
            ))
        })
}

/// Creates a GPU context and describes the adapter (field names as in `AdapterReport`,
/// snake_case).
#[wasm_bindgen(js_name = gpuInfo, unchecked_return_type = "AdapterReport")]
pub async fn gpu_info() -> Result<JsValue, JsValue> {
    let ctx = GpuContext::new(GpuOptions::default())
        .await
        .map_err(|e| js_error(&e))?;
    to_js(ctx.report())
}

/// The crate version.
#[wasm_bindgen]
pub fn version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}

/// Records why the CPU backend runs on one thread: the page's worker calls it when it loads a
/// build without threads (the page is not cross-origin isolated, or the browser lacks shared
/// memory). `engine.info().threadsNotice` repeats it while the backend has one thread.
#[wasm_bindgen(js_name = noteOneThread)]
pub fn note_one_thread(reason: &str) {
    crate::backend::cpu::note_one_thread(reason);
}
