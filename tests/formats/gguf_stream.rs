//! Streaming GGUF loading: tensors arrive complete, in file order, identical to the bytes of a
//! whole-file parse, while the reader holds at most the header plus one tensor (plus a chunk).

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use emberlm::format::gguf::GgufHeader;
use emberlm::format::gguf_stream::GgufStream;
use rand::Rng;

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

/// Streams `bytes` in chunks of the sizes `next_chunk` gives and checks every tensor.
fn stream(name: &str, bytes: &[u8], mut next_chunk: impl FnMut() -> usize) {
    let whole = GgufHeader::parse(bytes, name).unwrap();
    let largest = whole.tensors().iter().map(|t| t.n_bytes).max().unwrap_or(0) as usize;
    let mut s = GgufStream::new(name, bytes.len() as u64);
    let mut seen = Vec::new();
    let (mut pos, mut peak) = (0, 0);
    while pos < bytes.len() {
        let n = next_chunk().clamp(1, bytes.len() - pos);
        s.push(&bytes[pos..pos + n], |h, info, data| {
            assert_eq!(
                data,
                whole
                    .tensor_data(bytes, whole.tensor(&info.name).unwrap())
                    .unwrap()
            );
            assert_eq!(h.tensors().len(), whole.tensors().len());
            seen.push((info.offset, info.name.clone()));
            Ok(())
        })
        .unwrap();
        pos += n;
        peak = peak.max(s.buffered());
        if s.header().is_some() {
            assert!(
                s.buffered() <= largest + n,
                "{name}: holds {} bytes after the header (largest tensor {largest}, chunk {n})",
                s.buffered()
            );
        }
    }
    let header = s.finish().unwrap();
    assert_eq!(header, whole);
    assert_eq!(
        seen.len(),
        whole.tensors().len(),
        "{name}: every tensor once"
    );
    assert!(
        seen.windows(2).all(|w| w[0].0 < w[1].0),
        "{name}: in file order"
    );
    assert!(
        peak < bytes.len() || bytes.len() < 200_000,
        "{name}: never held the whole file"
    );
}

#[test]
fn fixtures_stream_in_any_chunking() {
    let mut rng = common::rng("gguf_stream", &|m| eprintln!("{m}"));
    for name in [
        "tiny-llama-q4_1.gguf",
        "tiny-gpt2-f16.gguf",
        "tiny-llama-256-q4_k_m.gguf",
        "tiny-llama-256-f32.gguf",
    ] {
        let bytes = fixture(name);
        for size in [4096, 65_536, 1 << 20] {
            stream(name, &bytes, || size);
        }
        stream(name, &bytes, || rng.random_range(1..100_000));
    }
    let small = fixture("tiny-llama-q4_0.gguf");
    stream("tiny-llama-q4_0.gguf", &small, || 1);
}

#[test]
fn short_and_long_streams_are_errors() {
    let bytes = fixture("tiny-llama-q8_0.gguf");
    let n = bytes.len();
    for cut in [10, 1000, n / 2, n - 1] {
        let mut s = GgufStream::new("t.gguf", n as u64);
        s.push(&bytes[..cut], |_, _, _| Ok(())).unwrap();
        let err = s.finish().unwrap_err().to_string();
        assert!(err.contains(&format!("after {cut} of {n} bytes")), "{err}");
    }
    let mut s = GgufStream::new("t.gguf", (n - 1) as u64);
    let err = s.push(&bytes, |_, _, _| Ok(())).unwrap_err().to_string();
    assert!(err.contains("more than the announced"), "{err}");
    // a file that claims to be shorter than its tensors need
    let mut s = GgufStream::new("t.gguf", 2000);
    let err = s
        .push(&bytes[..2000], |_, _, _| Ok(()))
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("t.gguf"), "{err}");
}

#[test]
fn a_failing_consumer_stops_the_stream() {
    let bytes = fixture("tiny-llama-q8_0.gguf");
    let mut s = GgufStream::new("t.gguf", bytes.len() as u64);
    let err = s
        .push(&bytes, |_, info, _| {
            Err(emberlm::Error::invalid(
                "upload",
                format!("no room for `{}`", info.name),
            ))
        })
        .unwrap_err();
    assert!(err.to_string().contains("no room for"), "{err}");
}
