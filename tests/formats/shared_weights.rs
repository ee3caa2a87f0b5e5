//! A model's matrices stay in its file's bytes: a GGUF file is mapped (natively), its tensors
//! borrow from the mapping, and the CPU backend keeps those ranges instead of copying every
//! weight, so loading makes no allocation anywhere near the file's size.

#![cfg(not(target_arch = "wasm32"))]

use std::path::Path;

use crate::peak_alloc::with_peak;
use emberlm::backend::cpu::CpuForward;
use emberlm::loader::ModelFiles;
use emberlm::session::Session;

/// The largest tiny fixture (5.8 MB of f32 weights; the largest tensor is 1 MB).
const MODEL: &str = "tests/fixtures/tiny-llama-256-f32.gguf";

#[test]
fn gguf_matrices_are_kept_from_the_file_and_hf_ones_copied() {
    let files = ModelFiles::open(Path::new(MODEL)).unwrap();
    let weights = files.weights().unwrap();
    assert_eq!(weights.sources.len(), 1);
    assert!(
        weights.sources[0].is_mapped(),
        "{MODEL} is read, not mapped"
    );
    for (name, t) in &weights.tensors {
        assert!(weights.keep(&t.data).is_shared(), "{name} is copied");
    }
    let hf = ModelFiles::open(Path::new("tests/fixtures/tiny-llama")).unwrap();
    let weights = hf.weights().unwrap();
    let (name, t) = weights.tensors.iter().next().unwrap();
    assert!(!weights.keep(&t.data).is_shared(), "{name}");
}

#[test]
fn a_cpu_session_loads_without_copying_the_file() {
    // opening the file and building a session: nothing near the file's size (before, the file
    // was read into one buffer)
    let file_len = std::fs::metadata(MODEL).unwrap().len() as usize;
    let (session, largest) = with_peak(|| {
        let files = ModelFiles::open(Path::new(MODEL)).unwrap();
        Session::new_cpu(&files, Some(64)).unwrap()
    });
    drop(session);
    assert!(
        largest < file_len / 4,
        "the largest allocation while loading was {largest} bytes, the file {file_len}"
    );
    // the CPU backend alone: not even one tensor's size (before, every matrix was copied, the
    // largest copy that tensor's size). On a CPU with tiles (AVX-512 VNNI) the Q4_0, Q4_1 and
    // Q8_0 matrices are repacked 16 rows at a time into tiles of as many bytes, and the file's
    // pages under them handed back, so no allocation nears a tensor's size there either.
    let files = ModelFiles::open(Path::new(MODEL)).unwrap();
    let weights = files.weights().unwrap();
    let largest_tensor = weights
        .tensors
        .values()
        .map(|t| t.data.len())
        .max()
        .unwrap();
    let (backend, largest) = with_peak(|| CpuForward::backend(&weights, 64).unwrap());
    drop(backend);
    assert!(
        largest < largest_tensor,
        "the largest allocation of the CPU backend was {largest} bytes, the largest tensor \
         {largest_tensor}"
    );
}
