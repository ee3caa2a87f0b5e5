#![no_main]
//! Saved conversations read from arbitrary bytes (`SavedState::from_bytes`): truncated,
//! edited or foreign files must be an `Err`, never a panic or an allocation the input does not
//! pay for; a state that reads is written back to the same bytes and reads again the same.

use emberlm::session::saved_state::SavedState;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(state) = SavedState::from_bytes(data, "fuzz.kv") {
        let bytes = state.to_bytes().expect("a state that read writes");
        let again = SavedState::from_bytes(&bytes, "fuzz.kv").expect("what was written reads");
        assert_eq!(again, state);
    }
});
