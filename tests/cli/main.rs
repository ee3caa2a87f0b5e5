//! The `emberlm` binary driven as a user would: `generate`, `batch`, `chat`, the sampling,
//! format and speculative flags, and `serve-api` over HTTP on loopback (also under load).
//!
//! One test binary of several (each links wgpu, tokenizers and llguidance once): a module per
//! concern, so `cargo test --test cli MODULE::` runs one concern and `cargo test NAME` one test.

#![cfg(not(target_arch = "wasm32"))]

#[path = "../common/cli_run.rs"]
mod cli_run;
#[path = "../common/mod.rs"]
mod common;
#[path = "../common/serve_api.rs"]
mod serve;

mod cli;
mod cli_batch;
mod cli_chat;
mod cli_embed;
mod cli_formats;
mod cli_options;
mod cli_sampling;
mod cli_serve_access;
mod cli_serve_api;
mod cli_serve_balancer;
mod cli_serve_connections;
mod cli_serve_embed;
mod cli_serve_load;
mod cli_serve_parallel;
mod cli_speculative;
