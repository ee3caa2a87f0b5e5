#![no_main]
//! JSON schemas, regexes, Lark and GBNF grammars compiled for a real vocabulary, and the first
//! steps of the constraint they make.

#[path = "common.rs"]
mod common;

libfuzzer_sys::fuzz_target!(|data: &[u8]| common::grammar_compile(data));
