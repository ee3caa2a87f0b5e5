//! Random byte flips and cuts never panic, and anything accepted is consistent.

use emberlm::format::gguf::{GgufHeader, MAX_DIMS};
use rand::Rng;

use super::writer::valid;
use crate::common;

/// `a == b` for two parses of the same bytes. Metadata is compared through its `Debug` form,
/// because a corrupted float may be NaN, which `==` never equals (the derived `PartialEq` of
/// the whole header fails on it though both parses agree).
fn assert_same_header(a: &GgufHeader, b: &GgufHeader) {
    assert_eq!(
        (a.version, a.alignment, a.data_offset, a.file()),
        (b.version, b.alignment, b.data_offset, b.file())
    );
    assert_eq!(a.tensors(), b.tensors());
    assert_eq!(format!("{:?}", a.metadata()), format!("{:?}", b.metadata()));
}

/// Flips bytes, mostly in the header, and sometimes cuts the file; checks that nothing panics,
/// that anything accepted is internally consistent, and that streaming agrees with `parse`.
fn corrupt_and_parse(name: &str, original: &[u8], header_end: usize, iterations: usize) {
    let mut rng = common::rng(name, &|m| eprintln!("{m}"));
    let mut accepted = 0;
    for _ in 0..iterations {
        let mut bytes = original.to_vec();
        for _ in 0..rng.random_range(1..=4) {
            let at = if rng.random_bool(0.9) {
                rng.random_range(0..header_end)
            } else {
                rng.random_range(0..bytes.len())
            };
            bytes[at] ^= rng.random_range(1..=255u8);
        }
        if rng.random_bool(0.1) {
            let n = rng.random_range(0..bytes.len());
            bytes.truncate(n);
        }
        let total = bytes.len() as u64;
        let full = GgufHeader::parse(&bytes, "fuzz.gguf");
        if let Ok(h) = &full {
            accepted += 1;
            for t in h.tensors() {
                let data = h.tensor_data(&bytes, t).unwrap();
                assert_eq!(data.len() as u64, t.n_bytes);
                assert!(t.dims.len() <= MAX_DIMS as usize && t.dims.iter().all(|&d| d > 0));
            }
        }
        let n = rng.random_range(0..=bytes.len());
        match (
            GgufHeader::parse_prefix(&bytes[..n], total, "fuzz.gguf"),
            &full,
        ) {
            (Ok(None), _) => {}
            (Ok(Some(p)), Ok(h)) => assert_same_header(&p, h),
            (Err(e), Err(f)) => assert_eq!(e.to_string(), f.to_string()),
            (p, f) => panic!("prefix {n}: {p:?} but whole file: {f:?}"),
        }
    }
    eprintln!("{name}: {accepted} of {iterations} corrupted files still parsed");
}

#[test]
fn random_corruption_of_a_built_file() {
    let built = valid().build();
    corrupt_and_parse("built", &built.bytes, built.header_end, 5000);
}

#[test]
fn random_corruption_of_a_fixture() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/tiny-llama-q4_0.gguf"
    );
    let bytes = std::fs::read(path).unwrap();
    let h = GgufHeader::parse(&bytes, path).unwrap();
    corrupt_and_parse("fixture", &bytes, h.data_offset as usize, 300);
}
