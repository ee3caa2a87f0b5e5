//! Browser tests (wasm-bindgen-test in headless Chromium; WebGPU on SwiftShader in CI): the
//! kernel cases of the native tests, the forward pass against the float64 goldens on the tiny
//! fixtures (the tiny Gemma 3 again with its embedding split across bindings) and SmolLM2, the
//! CPU backend in WebAssembly, and the JavaScript `Engine`
//! (loading, memory settings, batches, speculative decoding, endurance).
//!
//! One wasm test binary, started once in Chromium: a module per concern (`kernels`, `linear`,
//! `ops`, `forward`, `engine`, ...). Tests run one at a time in one page, so each test that
//! depends on what the Cache API holds clears it first.

#![cfg(target_arch = "wasm32")]

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/peak_alloc.rs"]
mod peak_alloc;

wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

mod batch;
mod conversation;
mod cpu;
mod embed;
mod endurance;
mod engine;
mod forward;
mod from_server;
mod gemma3;
mod kernels;
mod linear;
mod loading;
mod memory;
mod ops;
mod ranged;
mod speculative;
mod storage;
