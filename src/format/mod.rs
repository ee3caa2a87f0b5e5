//! Bytes on disk to what the engine needs: model configuration, named tensors, tokenizer data.
//! Nothing here touches the GPU.

pub mod gguf;
