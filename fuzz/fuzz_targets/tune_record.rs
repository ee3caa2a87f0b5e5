#![no_main]
//! Stored tuning records (kernel plans, KV-cache decisions) on arbitrary text: trusted or
//! refused with a reason, never a panic.

#[path = "common.rs"]
mod common;

libfuzzer_sys::fuzz_target!(|data: &[u8]| common::tune_record(data));
