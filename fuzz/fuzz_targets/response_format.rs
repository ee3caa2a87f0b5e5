#![no_main]
//! GBNF translation and `response_format` parsing on arbitrary text: a bad grammar or format
//! must be an `Err` naming the problem, never a panic or a runaway recursion.

#[path = "common.rs"]
mod common;

libfuzzer_sys::fuzz_target!(|data: &[u8]| common::response_format(data));
