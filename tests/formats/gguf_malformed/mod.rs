//! The GGUF reader against hostile input: files built byte by byte here (a small writer), then
//! broken one way at a time, each of which must be refused with a message that says what and
//! where; every prefix of a valid file; and random byte flips, which must never panic.

#![cfg(not(target_arch = "wasm32"))]

mod cases;
mod corruption;
mod malformed;
mod valid;
mod writer;
