//! emberlm: large-language-model text generation on WebGPU, in the browser (wasm32) and
//! natively (wgpu on Vulkan, Metal or DX12).
//!
//! The crate is layered so that dependencies point one way: [`gpu`] (device, buffers, kernel
//! cache, typed kernels) and the CPU [`model::reference`] sit under everything else; `web`
//! (wasm32 only) converts between JavaScript and Rust and holds no logic of its own.

pub mod candidates;
pub mod chat;
pub mod error;
pub mod format;
pub mod gpu;
pub mod model;
pub mod sampling;
pub mod session;
pub mod tokenizer;
pub mod tune;

#[cfg(target_arch = "wasm32")]
pub mod web;

pub use error::{Error, Result};
pub use gpu::{AdapterReport, GpuContext, GpuOptions};
