//! Test helpers shared by the native GPU tests and the browser tests.

#![allow(dead_code)]

pub mod forward_cases;
pub mod golden;
pub mod kernel_cases;
pub mod linear_cases;
pub mod ops_cases;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// A fresh random seed, or `EMBERLM_TEST_SEED` when set (to replay a failure). The browser
/// has no environment, so there the value seen when the tests were compiled is used.
pub fn seed() -> u64 {
    let fixed = std::env::var("EMBERLM_TEST_SEED")
        .ok()
        .or(option_env!("EMBERLM_TEST_SEED").map(String::from));
    if let Some(s) = fixed.and_then(|s| s.parse().ok()) {
        return s;
    }
    getrandom::u64().unwrap_or(0x5eed)
}

/// A seeded generator; the seed goes to `log` so any failure can be replayed.
pub fn rng(test: &str, log: &dyn Fn(&str)) -> ChaCha8Rng {
    let s = seed();
    log(&format!(
        "{test}: seed {s} (replay with EMBERLM_TEST_SEED={s})"
    ));
    ChaCha8Rng::seed_from_u64(s)
}
