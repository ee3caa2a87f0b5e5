//! The CPU backend's threads in the browser: rayon's global pool on Web Workers that share the
//! module's memory (wasm-bindgen-rayon starts them, each instantiating this same module). Only
//! in the threaded build, which the page's worker loads where the page is cross-origin
//! isolated; until [`start_threads`] has finished, every kernel runs on the calling thread.

use std::sync::atomic::{AtomicUsize, Ordering};
use wasm_bindgen::prelude::*;

/// Threads of the started pool; 0 before it starts (and for good if it could not).
static STARTED: AtomicUsize = AtomicUsize::new(0);

/// Starts a pool of `threads` Web Workers (at least 2, at most 8; the page passes one per
/// core) for the CPU backend's kernels and resolves once they run. A second call changes
/// nothing. Rejects with the reason when the workers cannot start; the kernels then stay on
/// the calling thread and `engine.info().threadsNotice` says why.
#[wasm_bindgen(js_name = startThreads)]
pub async fn start_threads(threads: usize) -> Result<usize, JsValue> {
    let started = STARTED.load(Ordering::Acquire);
    if started > 0 {
        return Ok(started);
    }
    let threads = threads.clamp(2, 8);
    let started =
        wasm_bindgen_futures::JsFuture::from(wasm_bindgen_rayon::init_thread_pool(threads)).await;
    match started {
        Ok(_) => {
            STARTED.store(threads, Ordering::Release);
            Ok(threads)
        }
        Err(e) => {
            let reason = e
                .as_string()
                .or_else(|| {
                    js_sys::Reflect::get(&e, &"message".into())
                        .ok()
                        .and_then(|m| m.as_string())
                })
                .unwrap_or_else(|| "unknown error".into());
            super::note_one_thread(&format!("the worker pool did not start: {reason}"));
            Err(e)
        }
    }
}

/// Threads the kernels spread their work over: the pool's, or 1 before it starts.
pub fn threads() -> usize {
    STARTED.load(Ordering::Acquire).max(1)
}

/// `f` as the owner of a team of the pool's threads (the caller, the page's engine worker,
/// waits; it may block, being a worker) once the pool runs; on the calling thread before.
pub fn run<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    match STARTED.load(Ordering::Acquire) {
        0 => f(),
        threads => super::team::run_step(threads, f),
    }
}
