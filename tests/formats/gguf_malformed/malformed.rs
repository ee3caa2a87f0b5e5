//! Malformed files are refused with a message that says what and where, quickly and without
//! reserving what they claim; every prefix of a valid file.

use std::time::{Duration, Instant};

use emberlm::format::gguf::{GgufHeader, MAX_ARRAY_LEN, MAX_METADATA_COUNT, MAX_TENSOR_COUNT};
use emberlm::Error;

use super::cases::{cases, Kind};
use super::writer::{valid, with_kv, Gguf, T_ARRAY, T_STRING, T_U8, V};
use crate::peak_alloc;

#[test]
fn malformed_inputs_are_rejected() {
    let cases = cases();
    let mut failures = Vec::new();
    let mut names = std::collections::HashSet::new();
    for c in &cases {
        assert!(names.insert(c.name), "duplicate case name {}", c.name);
        let start = Instant::now();
        let (result, peak) = peak_alloc::with_peak(|| GgufHeader::parse(&c.bytes, "bad.gguf"));
        let elapsed = start.elapsed();
        let err = match result {
            Ok(_) => {
                failures.push(format!("{}: parsed", c.name));
                continue;
            }
            Err(e) => e,
        };
        let msg = err.to_string();
        let kind_ok = match c.kind {
            Kind::Format => matches!(err, Error::Format { .. }),
            Kind::Unsupported => matches!(err, Error::Unsupported { .. }),
        };
        if !kind_ok {
            failures.push(format!("{}: expected {:?}, got {err:?}", c.name, c.kind));
        }
        if !msg.starts_with("bad.gguf: ") {
            failures.push(format!("{}: message does not name the file: {msg}", c.name));
        }
        for want in &c.expect {
            if !msg.contains(want.as_str()) {
                failures.push(format!("{}: `{want}` not in: {msg}", c.name));
            }
        }
        // Claims of 2^62 elements must be refused before anything that size is reserved.
        let limit = 64 * 1024 + 4 * c.bytes.len();
        if peak > limit {
            failures.push(format!("{}: allocated {peak} bytes at once", c.name));
        }
        if elapsed > Duration::from_secs(1) {
            failures.push(format!("{}: took {elapsed:?}", c.name));
        }
        // The streaming entry point agrees when given the whole file.
        match GgufHeader::parse_prefix(&c.bytes, c.bytes.len() as u64, "bad.gguf") {
            Err(e) if e.to_string() == msg => {}
            other => failures.push(format!("{}: parse_prefix gave {other:?}", c.name)),
        }
        eprintln!("{:<45} {msg}", c.name);
    }
    eprintln!("{} malformed cases", cases.len());
    assert!(cases.len() >= 30);
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn prefixes_of_malformed_files_never_give_a_header() {
    // Each prefix is either "need more bytes" or the full file's own error: the streaming path
    // must never accept a bad file, nor report a different fault than the whole file has.
    for c in cases() {
        let total = c.bytes.len() as u64;
        let full = GgufHeader::parse(&c.bytes, "bad.gguf")
            .unwrap_err()
            .to_string();
        for n in 0..c.bytes.len().min(4096) {
            match GgufHeader::parse_prefix(&c.bytes[..n], total, "bad.gguf") {
                Ok(None) => {}
                Err(e) => assert_eq!(e.to_string(), full, "{} at {n}", c.name),
                Ok(Some(_)) => panic!("{}: prefix of {n} bytes gave a header", c.name),
            }
        }
    }
}

#[test]
fn streaming_claims_do_not_reserve_memory() {
    // While streaming, a header may claim counts that the (huge) file could hold; what is
    // reserved must still be bounded by the bytes actually held.
    let total = 1u64 << 40;
    let claims = [
        Gguf {
            n_kv: Some(MAX_METADATA_COUNT),
            ..Gguf::new()
        }
        .bytes(),
        Gguf {
            n_tensors: Some(MAX_TENSOR_COUNT),
            ..Gguf::new()
        }
        .bytes(),
        with_kv(
            "tokenizer.ggml.tokens",
            V::Raw(
                T_ARRAY,
                [
                    T_STRING.to_le_bytes().as_slice(),
                    &MAX_ARRAY_LEN.to_le_bytes(),
                ]
                .concat(),
            ),
        ),
        with_kv(
            "test.arrays",
            V::Raw(
                T_ARRAY,
                [
                    T_ARRAY.to_le_bytes().as_slice(),
                    &MAX_ARRAY_LEN.to_le_bytes(),
                ]
                .concat(),
            ),
        ),
        with_kv(
            "test.bytes",
            V::Raw(
                T_ARRAY,
                [T_U8.to_le_bytes().as_slice(), &MAX_ARRAY_LEN.to_le_bytes()].concat(),
            ),
        ),
    ];
    for (i, bytes) in claims.iter().enumerate() {
        let (result, peak) =
            peak_alloc::with_peak(|| GgufHeader::parse_prefix(bytes, total, "stream.gguf"));
        assert!(matches!(result, Ok(None)), "claim {i}: {result:?}");
        assert!(
            peak < 64 * 1024,
            "claim {i}: allocated {peak} bytes at once"
        );
    }
}

#[test]
fn prefix_longer_than_the_file_is_an_argument_error() {
    let bytes = valid().bytes();
    let err = GgufHeader::parse_prefix(&bytes, bytes.len() as u64 - 1, "x.gguf").unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidArgument {
                name: "total_len",
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn every_prefix_of_a_valid_file() {
    let built = valid().build();
    let bytes = &built.bytes;
    let total = bytes.len() as u64;
    let full = GgufHeader::parse(bytes, "valid.gguf").unwrap();
    for n in 0..bytes.len() {
        let prefix = &bytes[..n];
        let err = GgufHeader::parse(prefix, "valid.gguf");
        assert!(err.is_err(), "parse accepted a {n}-byte prefix");
        match GgufHeader::parse_prefix(prefix, total, "valid.gguf") {
            Ok(None) => assert!(n < built.header_end, "Ok(None) at {n}"),
            Ok(Some(h)) => {
                assert!(n >= built.header_end, "header from {n} bytes");
                assert_eq!(h, full, "at {n}");
            }
            Err(e) => panic!("prefix of {n} bytes: {e}"),
        }
    }
}
