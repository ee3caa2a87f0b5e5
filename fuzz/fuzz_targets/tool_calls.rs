#![no_main]
//! Tool definitions and a model's calls on arbitrary text: definitions are read or refused
//! with a message, their grammar compiles or is refused naming the format, and answers read
//! back the same whole and streamed; never a panic.

#[path = "common.rs"]
mod common;

libfuzzer_sys::fuzz_target!(|data: &[u8]| common::tool_calls(data));
