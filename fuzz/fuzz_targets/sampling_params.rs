#![no_main]
//! `SamplingParams::from_json` on arbitrary text: malformed or out-of-range parameters must be
//! an `Err`, never a panic.

use emberlm::sampling::SamplingParams;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = SamplingParams::from_json(text);
});
