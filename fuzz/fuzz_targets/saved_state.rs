#![no_main]
//! Saved conversations read from arbitrary bytes (`SavedState::from_bytes`): truncated,
//! edited or foreign files must be an `Err`, never a panic or an allocation the input does not
//! pay for; a state that reads is written back and reads again the same. Each input is read
//! as it is and, so that mutations reach past the digest to the header's lengths and the rows,
//! once more with its last 32 bytes replaced by the digest of the rest.

use emberlm::session::saved_state::SavedState;
use sha2::{Digest, Sha256};

fn read(data: &[u8]) {
    if let Ok(state) = SavedState::from_bytes(data, "fuzz.kv") {
        let bytes = state.to_bytes().expect("a state that read writes");
        let again = SavedState::from_bytes(&bytes, "fuzz.kv").expect("what was written reads");
        assert_eq!(again, state);
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    read(data);
    if data.len() >= 32 {
        let (content, _) = data.split_at(data.len() - 32);
        let mut fixed = content.to_vec();
        fixed.extend_from_slice(&Sha256::digest(content));
        read(&fixed);
    }
});
