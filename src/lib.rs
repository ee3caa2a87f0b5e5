//! emberlm: large-language-model text generation on WebGPU, in the browser (wasm32) and
//! natively (wgpu on Vulkan, Metal or DX12).
//!
//! The crate is layered so that dependencies point one way (`tests/formats/layers.rs` fails on an
//! import that runs sideways or up), bottom first:
//! - leaves: [`error`], [`math`], [`option_keys`] (how option keys are spelt), [`dtype`]
//!   (storage types, dequantization), [`config`] (the model
//!   description), [`candidates`] (the selection kernel's wire format), [`tune`];
//! - [`model`]: host tensors and weights, and the CPU reference forward pass;
//! - [`format`] (GGUF, safetensors), [`sampling`], [`store`] (downloads kept in the page's
//!   storage);
//! - [`tokenizer`], and [`backend`]: the [`backend::Backend`] trait a session runs a model
//!   through, and its two implementations, [`backend::gpu`] (device, buffers, kernels, the
//!   forward pass on them) and [`backend::cpu`] (SIMD kernels, the thread team, the forward pass
//!   on them);
//! - [`chat`], then [`loader`] (files → weights, tokenizer, template);
//! - the session, the engine, and `web` (wasm32 only), which converts between JavaScript and
//!   Rust and holds no logic of its own.

pub mod backend;
pub mod candidates;
pub mod chat;
pub mod config;
pub mod constrain;
pub mod dtype;
pub mod engine;
pub mod error;
pub mod format;
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

pub use backend::gpu::{AdapterReport, GpuContext, GpuOptions};
pub use error::{Error, Result};
