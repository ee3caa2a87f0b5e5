//! Bytes on disk to what the engine needs: model configuration, named tensors, tokenizer data.
//! Nothing here touches the GPU.

pub mod gguf;
pub mod gguf_model;
pub mod gguf_stream;
pub mod hf_config;
pub mod safetensors;
