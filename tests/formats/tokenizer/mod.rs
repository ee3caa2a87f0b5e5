#![cfg(not(target_arch = "wasm32"))]
//! The tokenizer against the golden prompt tokens (from each tiny model's tokenizer.json, from
//! each tiny GGUF's metadata, and from SmolLM2's GGUF when it is present), round trips, the
//! stream decoder, the GGUF pre-tokenizer variants, and bad inputs.

mod decode;
mod goldens;
mod pre_tokenizers;
mod refused;
mod support;
