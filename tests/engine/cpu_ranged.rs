//! The CPU load of a model read a group of tensors at a time ([`RangedGguf`], what the page
//! uses for a `File`, a stored download or a server answering ranges): the same logits, bit for
//! bit, as the load of the whole file for every fixture GGUF (every weight type, fused QKV,
//! biases, QK-norm, local layers); the matrices the backend's own and in tiles where this CPU
//! multiplies in tiles (a file read whole into memory keeps them as stored); and a source that
//! fails part-way refused by name.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use std::path::Path;

use common::golden::TINY_MODELS;
use common::memory_files::open_ranged;
use emberlm::backend::cpu::{CpuForward, CpuPrecision};
use emberlm::backend::DEFAULT_CHUNK;
use emberlm::dtype::kv::KvKinds;
use emberlm::format::gguf_model::must_read_whole;
use emberlm::loader::ModelFiles;
use emberlm::session::Session;

fn fixture(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every position's logits of a prompt and a decode step, from `session`.
fn logits(session: &mut Session) -> Vec<f32> {
    let tokens: Vec<u32> = [1, 5, 9, 2, 7, 3, 11, 4].to_vec();
    pollster::block_on(session.all_logits(&tokens, true)).unwrap()
}

#[test]
fn every_fixture_read_by_range_gives_the_cpu_the_bits_of_the_whole_file() {
    let mut checked = 0;
    for (name, _) in TINY_MODELS.iter().filter(|(n, _)| n.ends_with(".gguf")) {
        let bytes = fixture(name);
        let whole = ModelFiles::from_bytes(bytes.clone(), name).unwrap();
        let (source, ranged) = open_ranged(&[(name, bytes)]);
        let ranged = match ranged {
            Ok(r) => r,
            // a file whose matrices are split on load is read whole, on every backend
            Err(e) if must_read_whole(&e) => continue,
            Err(e) => panic!("{name}: {e}"),
        };
        let fingerprint = whole.weights().unwrap().fingerprint();
        let ranged = ModelFiles::Ranged(Box::new(ranged));
        for precision in [CpuPrecision::Int8, CpuPrecision::F32] {
            let kinds = KvKinds::default();
            let mut a = Session::new_cpu_in(&whole, Some(64), precision, kinds).unwrap();
            let mut read = Vec::new();
            let mut b = pollster::block_on(Session::new_cpu_read(
                &ranged,
                Some(64),
                precision,
                kinds,
                &mut |done, total| read.push((done, total)),
            ))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
            let (want, got) = (logits(&mut a), logits(&mut b));
            assert_eq!(want.len(), got.len(), "{name}");
            let first = want
                .iter()
                .zip(&got)
                .position(|(x, y)| x.to_bits() != y.to_bits());
            assert_eq!(
                first, None,
                "{name} ({precision:?}): logits part at {first:?}"
            );
            let weights = ranged.weight_bytes().unwrap();
            assert_eq!(read.first(), Some(&(0, weights)), "{name}");
            assert_eq!(read.last(), Some(&(weights, weights)), "{name}");
            assert!(
                read.windows(2).all(|w| w[0].0 <= w[1].0),
                "{name}: {read:?}"
            );
        }
        let ModelFiles::Ranged(r) = &ranged else {
            unreachable!()
        };
        assert_eq!(r.fingerprint().unwrap(), fingerprint, "{name}");
        assert!(source.reads.get() > 0, "{name}");
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} fixtures were read by range");
}

#[test]
fn matrices_read_by_range_are_the_backends_own_and_tiled_where_the_cpu_tiles() {
    for name in ["tiny-llama-q4_0.gguf", "tiny-llama-q8_0.gguf"] {
        let bytes = fixture(name);
        let whole = ModelFiles::from_bytes(bytes.clone(), name).unwrap();
        let weights = whole.weights().unwrap();
        let held = CpuForward::with_kinds(
            &weights,
            64,
            DEFAULT_CHUNK,
            CpuPrecision::Int8,
            KvKinds::default(),
        )
        .unwrap();
        let (_, ranged) = open_ranged(&[(name, bytes)]);
        let ranged = ranged.unwrap();
        let read = pollster::block_on(CpuForward::load_read(
            ranged.layout(),
            &ranged,
            64,
            DEFAULT_CHUNK,
            CpuPrecision::Int8,
            KvKinds::default(),
            &mut |_, _| {},
        ))
        .unwrap();
        let (tiled, all) = read.matrices_in_tiles();
        assert_eq!(all, held.matrices_in_tiles().1, "{name}");
        // bytes read into memory whole are shared by the matrices, never copied into tiles
        assert_eq!(held.matrices_in_tiles().0, 0, "{name}");
        if cfg!(target_arch = "x86_64") {
            assert!(tiled > 0, "{name}: none of the {all} matrices in tiles");
        } else {
            assert_eq!(tiled, 0, "{name}: tiles on a CPU without them");
        }
    }
}

#[test]
fn a_source_that_fails_part_way_is_refused_by_name() {
    let name = "tiny-llama-q4_1.gguf";
    let bytes = fixture(name);
    let (_, ranged) = open_ranged(&[(name, bytes.clone())]);
    let ranged = ranged.unwrap();
    // the same header over a file cut inside its tensors: the reads past its end fail
    let (_, short) = open_ranged(&[(name, bytes[..bytes.len() - 100].to_vec())]);
    let err = match short {
        Err(e) => e.to_string(),
        Ok(short) => pollster::block_on(CpuForward::load_read(
            ranged.layout(),
            &short,
            64,
            DEFAULT_CHUNK,
            CpuPrecision::Int8,
            KvKinds::default(),
            &mut |_, _| {},
        ))
        .map(|_| ())
        .unwrap_err()
        .to_string(),
    };
    assert!(err.contains("file 0") || err.contains(name), "{err}");
}
