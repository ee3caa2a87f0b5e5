#![cfg(not(target_arch = "wasm32"))]
//! The tokenizer against the golden prompt tokens (from each tiny model's tokenizer.json, from
//! each tiny GGUF's metadata, and from SmolLM2's GGUF when it is present), round trips, the
//! stream decoder, the GGUF pre-tokenizer variants, and bad inputs.

#[path = "../common/gguf_meta.rs"]
mod gguf_meta;
#[path = "../common/require.rs"]
mod require;

mod decode;
mod goldens;
mod pre_tokenizers;
mod refused;
mod support;
