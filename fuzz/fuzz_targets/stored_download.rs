#![no_main]
//! What a page keeps of a download (the stored record, `Content-Range`, the `sha256` and
//! `storage` options, the store's file names) on arbitrary bytes: an `Err` or `None`, never a
//! panic, and a resume only where the rules allow one.

#[path = "common.rs"]
mod common;

libfuzzer_sys::fuzz_target!(|data: &[u8]| common::stored_download(data));
