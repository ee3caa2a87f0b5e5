#![no_main]
//! HTTP/1.1 request heads as `emberlm serve-api` parses them, on arbitrary bytes: a complete
//! head, a partial one or a status naming the problem, never a panic.

#[path = "common.rs"]
mod common;

libfuzzer_sys::fuzz_target!(|data: &[u8]| common::http_head(data));
