//! emberlm: large-language-model text generation on WebGPU, in the browser (wasm32) and
//! natively (wgpu on Vulkan, Metal or DX12).
//!
//! The crate is layered so that dependencies point one way (`tests/formats/layers.rs` fails on an
//! import that runs sideways or up), bottom first:
//! - leaves: [`error`], [`math`], [`option_keys`] (how option keys are spelt), [`dtype`]
//!   (storage types, dequantization), [`config`] (the model
//!   description), [`candidates`] (the selection kernel's wire format), [`tune`];
//! - [`model`]: host tensors and weights, and the CPU reference forward pass;
//! - [`gpu`] (device, buffers, kernels), [`cpu`] (the CPU backend's kernels), [`format`] (GGUF, safetensors), [`sampling`], [`store`] (downloads kept in
//!   the page's storage);
//! - [`tokenizer`], then [`chat`];
//! - [`loader`] (files → weights, tokenizer, template) and [`forward`] (the GPU graph);
//! - the session, the engine, and `web` (wasm32 only), which converts between JavaScript and
//!   Rust and holds no logic of its own.

pub mod candidates;
pub mod chat;
pub mod config;
pub mod constrain;
pub mod cpu;
pub mod dtype;
pub mod engine;
pub mod error;
pub mod format;
pub mod forward;
pub mod gpu;
pub mod loader;
pub mod math;
pub mod model;
pub mod openai;
pub mod option_keys;
pub mod sampling;
pub mod session;
pub mod store;
pub mod tokenizer;
pub mod tune;

#[cfg(target_arch = "wasm32")]
pub mod web;

pub use error::{Error, Result};
pub use gpu::{AdapterReport, GpuContext, GpuOptions};
