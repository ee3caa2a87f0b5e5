#![no_main]
//! Load options (`Engine.load`'s object, a `--config` file) on arbitrary text: a bad key or
//! value must be an `Err` naming it, never a panic.

#[path = "common.rs"]
mod common;

libfuzzer_sys::fuzz_target!(|data: &[u8]| common::load_options(data));
