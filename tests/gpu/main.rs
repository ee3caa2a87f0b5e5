//! Kernels and the forward pass on the GPU (Vulkan natively; Mesa lavapipe in CI): every kernel
//! family against its CPU reference, the forward pass against the float64 goldens, KV-cache kinds
//! and plans, the kernel plan, engine counters, device loss and every model form on the GPU.
//!
//! One test binary of several (each links wgpu, tokenizers and llguidance once): a module per
//! concern, so `cargo test --test gpu MODULE::` runs one concern and `cargo test NAME` one test.

#![cfg(not(target_arch = "wasm32"))]

#[path = "../common/mod.rs"]
mod common;

mod backend_choice;
mod counters;
mod device_loss;
mod forward_batch;
mod forward_golden;
mod forward_kv;
mod gemma3;
mod gemma3_golden;
mod gpu_kernels;
mod gpu_linear;
mod gpu_ops;
mod gpu_select;
mod kernel_plan;
mod kv_cache_plan;
mod kv_kinds;
mod kv_ring;
mod kv_writers;
mod model_equivalence;
mod out_of_memory;
mod phi3;
mod precision;
mod qwen2;
mod qwen3;
mod ranged_load;
mod rope_scaling;
