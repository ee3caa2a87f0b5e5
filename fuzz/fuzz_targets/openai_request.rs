#![no_main]
//! OpenAI-style request bodies and generate options on arbitrary text: a bad field must be an
//! `Err` naming it, never a panic.

#[path = "common.rs"]
mod common;

libfuzzer_sys::fuzz_target!(|data: &[u8]| common::openai_request(data));
