//! Structured output: every response format through the CPU backend on the tiny fixtures (both
//! tokenizer kinds), SmolLM2 on JSON schemas of increasing difficulty, the constrained
//! distribution against the renormalised one, speculative decoding under a format, and refused
//! formats. Schema outputs are checked with an independent validator (`jsonschema`).

#![cfg(not(target_arch = "wasm32"))]

mod distribution;
mod formats;
mod refused;
mod schemas;
mod speculative;
mod support;
mod tools;
mod tools_mistral;
