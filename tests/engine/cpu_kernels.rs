//! The CPU backend's kernels against f64 references on fresh random inputs at awkward sizes
//! (the cases are in `tests/common/cpu_kernel_cases.rs`, shared with the browser).

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use common::cpu_kernel_cases as cases;

#[test]
fn matmul_matches_f64_for_every_weight_type() {
    let mut rng = common::rng("cpu matmul", &|m| eprintln!("{m}"));
    cases::check_matmul(&mut rng, false).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn attention_matches_f64() {
    let mut rng = common::rng("cpu attention", &|m| eprintln!("{m}"));
    cases::check_attention(&mut rng).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn norms_match_f64() {
    let mut rng = common::rng("cpu norms", &|m| eprintln!("{m}"));
    cases::check_norms(&mut rng).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn dot_product_follows_its_definition_bit_for_bit() {
    let mut rng = common::rng("cpu dot order", &|m| eprintln!("{m}"));
    cases::check_dot_order(&mut rng).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn tiles_match_the_row_path_bit_for_bit() {
    let mut rng = common::rng("cpu tiles", &|m| eprintln!("{m}"));
    let tiled = cases::check_tiles_match_rows(&mut rng).unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "tiles on {}: {}",
        emberlm::backend::cpu::dot::instruction_set(),
        if tiled {
            "compared"
        } else {
            "none on this CPU"
        }
    );
}
