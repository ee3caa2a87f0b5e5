//! Generation sessions on the GPU: greedy against the f64 goldens, KV reuse, context sliding,
//! several sequences, beam search, stop strings, abort, scoring.

#![cfg(not(target_arch = "wasm32"))]

mod batched;
mod candidates;
mod control;
mod goldens;
mod sequences;
mod speculative;
mod support;
