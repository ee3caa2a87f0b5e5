#![no_main]
//! Generation options read from arbitrary text (`GenerateOptions::from_json`, then the range
//! checks): malformed, misspelt or out-of-range options must be an `Err`, never a panic.

use emberlm::session::GenerateOptions;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = GenerateOptions::from_json(text).and_then(|o| o.validate());
});
