#![no_main]
//! Quantized blocks of every type on arbitrary bytes: the reference dequantization and the CPU
//! backend's integer unpacking agree value by value.

#[path = "common.rs"]
mod common;

libfuzzer_sys::fuzz_target!(|data: &[u8]| common::block_decode(data));
