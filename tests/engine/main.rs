//! The CPU backend, the CPU reference forward, sampling, generation sessions, structured output,
//! chat templates and the engine's requests, natively.
//!
//! One test binary of several (each links wgpu, tokenizers and llguidance once): a module per
//! concern, so `cargo test --test engine MODULE::` runs one concern and `cargo test NAME` one test.

#![cfg(not(target_arch = "wasm32"))]

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/peak_alloc.rs"]
mod peak_alloc;

mod bert;
mod chat;
mod chat_nesting;
mod constrain;
mod cpu_batch;
mod cpu_golden;
mod cpu_kernels;
mod cpu_ranged;
mod embeddings;
mod engine;
mod generate;
mod native_browser_agreement;
mod reference_golden;
mod sampling;
mod sampling_candidates;
mod saved_state;
mod serving;
