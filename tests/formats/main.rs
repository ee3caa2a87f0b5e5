//! Model files and tokenizers without a GPU: the GGUF reader on real and hostile files, streaming
//! loads, Hugging Face folders, tokenizers, the saved fuzz inputs replayed, and the crate's layers.
//!
//! One test binary of several (each links wgpu, tokenizers and llguidance once): a module per
//! concern, so `cargo test --test formats MODULE::` runs one concern and `cargo test NAME` one test.

#![cfg(not(target_arch = "wasm32"))]

#[path = "../common/mod.rs"]
mod common;
#[path = "../../fuzz/fuzz_targets/common.rs"]
mod fuzz_common;
#[path = "../common/peak_alloc.rs"]
mod peak_alloc;

mod circles;
mod fuzz_replay;
mod gguf;
mod gguf_malformed;
mod gguf_split;
mod gguf_stream;
mod hf_load;
mod layers;
mod shared_weights;
mod tokenizer;
