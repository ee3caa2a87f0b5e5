//! Bytes on disk to what the engine needs: model configuration, named tensors, tokenizer data.
//! Nothing here touches the GPU.
//!
//! Every size, count and offset here comes from a file or a stream: the compiler refuses
//! unchecked arithmetic on them (`clippy::arithmetic_side_effects`), so an overflow is an error
//! that names the file, never a panic or a wrapped value.

#![deny(clippy::arithmetic_side_effects)]

pub mod gguf;
pub mod gguf_model;
pub mod gguf_ranged;
pub mod gguf_split;
pub mod gguf_stream;
pub mod hf_config;
pub mod safetensors;
