//! The GGUF reader on real files: every fixture under `tests/fixtures/`, and SmolLM2-135M when
//! `models/SmolLM2-135M-Instruct.Q4_1.gguf` is present.

#![cfg(not(target_arch = "wasm32"))]

use crate::common::require;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use emberlm::dtype::DType;
use emberlm::format::gguf::{GgufArray, GgufHeader, GgufValue};
use emberlm::Error;

fn manifest_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn load(rel: &str) -> (Vec<u8>, GgufHeader) {
    let path = manifest_path(rel);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let header = GgufHeader::parse(&bytes, rel).unwrap_or_else(|e| panic!("{e}"));
    (bytes, header)
}

fn fixtures() -> Vec<String> {
    let dir = manifest_path("tests/fixtures");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".gguf"))
        .collect();
    names.sort();
    names
}

/// Tensor count per storage type.
fn dtype_counts(h: &GgufHeader) -> BTreeMap<&'static str, usize> {
    let mut counts = BTreeMap::new();
    for t in h.tensors() {
        *counts.entry(t.dtype.name()).or_insert(0) += 1;
    }
    counts
}

/// What every well-formed file satisfies, whatever its model.
fn check_invariants(bytes: &[u8], h: &GgufHeader) {
    let file = h.file();
    assert!(h.version == 2 || h.version == 3, "{file}");
    assert!(h.alignment.is_power_of_two(), "{file}");
    assert_eq!(h.data_offset % h.alignment, 0, "{file}");
    assert!(h.data_offset <= bytes.len() as u64, "{file}");
    let mut ranges = Vec::new();
    for t in h.tensors() {
        assert_eq!(h.tensor(&t.name), Some(t), "{file}: lookup of {}", t.name);
        assert_eq!(t.offset % h.alignment, 0, "{file}: {}", t.name);
        assert_eq!(t.shape().len(), t.dims.len());
        assert_eq!(t.shape().first(), t.dims.last());
        let expected = t.dtype.bytes_for(t.n_elements(), &t.name).unwrap();
        assert_eq!(t.n_bytes, expected, "{file}: {}", t.name);
        let data = h.tensor_data(bytes, t).unwrap();
        assert_eq!(data.len() as u64, t.n_bytes, "{file}: {}", t.name);
        let r = h.tensor_range(t);
        assert_eq!(r.end - r.start, t.n_bytes);
        assert!(r.start >= h.data_offset && r.end <= bytes.len() as u64);
        ranges.push(r);
    }
    ranges.sort_by_key(|r| r.start);
    for w in ranges.windows(2) {
        assert!(w[0].end <= w[1].start, "{file}: tensors overlap: {w:?}");
    }
    let mut keys: Vec<_> = h.metadata().iter().map(|(k, _)| k.as_str()).collect();
    let n = keys.len();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), n, "{file}: metadata keys are unique");
    for (k, v) in h.metadata() {
        assert_eq!(h.get(k), Some(v));
    }
}

/// The fixtures written by tools/make_arch_fixtures.py and their architectures.
const ARCH_FIXTURES: &[(&str, &str)] = &[
    ("tiny-qwen2-f32.gguf", "qwen2"),
    ("tiny-qwen3-q8_0.gguf", "qwen3"),
    ("tiny-phi3-f32.gguf", "phi3"),
    ("tiny-gemma3-f32.gguf", "gemma3"),
    ("tiny-llama3-rope-f32.gguf", "llama"),
    ("tiny-bert-f32.gguf", "bert"),
    ("tiny-bert-q8_0.gguf", "bert"),
];

#[test]
fn every_fixture_parses() {
    let names = fixtures();
    assert!(names.len() >= 11, "fixtures: {names:?}");
    for name in names {
        let (bytes, h) = load(&format!("tests/fixtures/{name}"));
        check_invariants(&bytes, &h);
        assert_eq!(h.version, 3, "{name}");
        assert_eq!(h.alignment, 32, "{name}");

        let arch = h.architecture().unwrap();
        // the architecture fixtures of tools/make_arch_fixtures.py: their own shapes and
        // vocabularies, checked by their goldens
        if let Some((_, want)) = ARCH_FIXTURES.iter().find(|(f, _)| *f == name) {
            assert_eq!(arch, *want, "{name}");
            continue;
        }
        let expected_arch = if name.starts_with("tiny-gpt2") {
            "gpt2"
        } else {
            "llama"
        };
        assert_eq!(arch, expected_arch, "{name}");
        let n_tensors = if arch == "gpt2" { 28 } else { 21 };
        assert_eq!(h.tensors().len(), n_tensors, "{name}");
        assert_eq!(
            h.get_u64(&format!("{arch}.block_count")).unwrap(),
            Some(2),
            "{name}"
        );
        assert_eq!(
            h.get_u32(&format!("{arch}.block_count")).unwrap(),
            Some(2),
            "{name}"
        );

        let spm = name.starts_with("tiny-llama-spm");
        let tokens = h.get_str_array("tokenizer.ggml.tokens").unwrap().unwrap();
        assert_eq!(tokens.len(), if spm { 600 } else { 512 }, "{name}");
        let types = h
            .get_i32_array("tokenizer.ggml.token_type")
            .unwrap()
            .unwrap();
        assert_eq!(types.len(), tokens.len(), "{name}");
        let model = h.get_str("tokenizer.ggml.model").unwrap().unwrap();
        if spm {
            assert_eq!(model, "llama");
            let scores = h.get_f32_array("tokenizer.ggml.scores").unwrap().unwrap();
            assert_eq!(scores.len(), 600);
            assert!(scores.iter().all(|s| s.is_finite()));
            assert_eq!(h.get_str_array("tokenizer.ggml.merges").unwrap(), None);
            assert_eq!(tokens.get(1).map(String::as_str), Some("<s>"));
            assert_eq!(h.get_u32("tokenizer.ggml.bos_token_id").unwrap(), Some(1));
            assert_eq!(
                h.get_bool("tokenizer.ggml.add_bos_token").unwrap(),
                Some(true)
            );
        } else {
            assert_eq!(model, "gpt2");
            let merges = h.get_str_array("tokenizer.ggml.merges").unwrap().unwrap();
            assert!(!merges.is_empty(), "{name}");
            assert!(merges.iter().all(|m| m.split(' ').count() == 2), "{name}");
            assert_eq!(
                tokens.first().map(String::as_str),
                Some("<|endoftext|>"),
                "{name}"
            );
            assert_eq!(
                h.get_bool("tokenizer.ggml.add_bos_token").unwrap(),
                Some(false)
            );
        }
        let eps_key = if arch == "gpt2" {
            "gpt2.attention.layer_norm_epsilon"
        } else {
            "llama.attention.layer_norm_rms_epsilon"
        };
        let eps = h.get_f32(eps_key).unwrap().unwrap();
        assert!((eps - 1e-5).abs() < 1e-9, "{name}: {eps}");
    }
}

#[test]
fn fixture_tensor_types() {
    use DType::*;
    let expect: &[(&str, &[(DType, usize)])] = &[
        ("tiny-gpt2-f32", &[(F32, 28)]),
        ("tiny-gpt2-f16", &[(F32, 18), (F16, 10)]),
        ("tiny-llama-f32", &[(F32, 21)]),
        ("tiny-llama-spm-f32", &[(F32, 21)]),
        ("tiny-llama-256-f32", &[(F32, 21)]),
        // llama.cpp keeps output.weight at Q8_0 here: its usual Q6_K needs rows of 256.
        ("tiny-llama-q8_0", &[(F32, 5), (Q8_0, 16)]),
        ("tiny-llama-q4_0", &[(F32, 5), (Q4_0, 15), (Q8_0, 1)]),
        ("tiny-llama-q4_1", &[(F32, 5), (Q4_1, 15), (Q8_0, 1)]),
        ("tiny-llama-256-q4_k_m", &[(F32, 5), (Q4_K, 13), (Q6_K, 3)]),
        ("tiny-llama-256-q5_k_m", &[(F32, 5), (Q5_K, 13), (Q6_K, 3)]),
        ("tiny-llama-256-q6_k", &[(F32, 5), (Q6_K, 16)]),
    ];
    for (name, counts) in expect {
        let (_, h) = load(&format!("tests/fixtures/{name}.gguf"));
        let expected: BTreeMap<&str, usize> = counts.iter().map(|&(t, n)| (t.name(), n)).collect();
        assert_eq!(dtype_counts(&h), expected, "{name}");
    }

    let (bytes, h) = load("tests/fixtures/tiny-llama-q4_1.gguf");
    for t in h.tensors() {
        if t.dims.len() == 1 {
            assert_eq!(t.dtype, F32, "{}", t.name);
        } else if t.name == "output.weight" {
            assert_eq!(t.dtype, Q8_0);
        } else {
            assert_eq!(t.dtype, Q4_1, "{}", t.name);
        }
    }
    let q = h.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(q.dims, vec![64, 64]);
    assert_eq!(q.n_bytes, 64 * 64 / 32 * 20);
    let k = h.tensor("blk.0.attn_k.weight").unwrap();
    assert_eq!(k.shape(), vec![32, 64], "2 KV heads of 16 rows, 64 columns");
    assert_eq!(h.tensor_data(&bytes, k).unwrap().len(), 32 * 64 / 32 * 20);

    let (_, h) = load("tests/fixtures/tiny-llama-256-q4_k_m.gguf");
    assert_eq!(h.tensor("output.weight").unwrap().dtype, Q6_K);
    assert_eq!(h.tensor("token_embd.weight").unwrap().dtype, Q4_K);
    assert_eq!(
        h.tensor("token_embd.weight").unwrap().shape(),
        vec![512, 256]
    );

    let (_, h) = load("tests/fixtures/tiny-gpt2-f16.gguf");
    assert_eq!(h.tensor("output.weight"), None, "tied LM head");
    assert_eq!(
        h.tensor("position_embd.weight").unwrap().dims,
        vec![64, 128]
    );
}

#[test]
fn fixture_data_matches_file_layout() {
    // The last tensor ends exactly at the end of the file in every fixture (no trailing padding).
    for name in fixtures() {
        let (bytes, h) = load(&format!("tests/fixtures/{name}"));
        let end = h.tensors().iter().map(|t| h.tensor_range(t).end).max();
        assert_eq!(end, Some(bytes.len() as u64), "{name}");
        // A tensor's first f32 read through `tensor_data` is the value at its absolute offset.
        // a decoder's final norm, or an encoder's embedding norm (it has no final one)
        let t = (h.tensor("output_norm.weight"))
            .or_else(|| h.tensor("token_embd_norm.weight"))
            .unwrap();
        let data = h.tensor_data(&bytes, t).unwrap();
        let at = h.tensor_range(t).start as usize;
        assert_eq!(&data[..4], &bytes[at..at + 4]);
        assert!(h
            .tensor_data(&bytes[..bytes.len() - 1], h.tensors().last().unwrap())
            .is_err());
    }
}

#[test]
fn typed_getters_report_key_and_types() {
    let (_, h) = load("tests/fixtures/tiny-llama-q4_0.gguf");
    let err = h.get_str("llama.block_count").unwrap_err().to_string();
    assert!(
        err.contains("llama.block_count") && err.contains("u32") && err.contains("string"),
        "{err}"
    );
    let err = h.get_u32("general.name").unwrap_err().to_string();
    assert!(
        err.contains("general.name") && err.contains("string"),
        "{err}"
    );
    let err = h
        .get_f32_array("tokenizer.ggml.tokens")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("array<string>") && err.contains("array<f32>"),
        "{err}"
    );
    assert!(matches!(
        h.get_bool("llama.vocab_size"),
        Err(Error::Format { .. })
    ));
    assert_eq!(h.get_u32("no.such.key").unwrap(), None);
    assert_eq!(h.get_str_array("no.such.key").unwrap(), None);
    assert_eq!(h.get_u64("llama.vocab_size").unwrap(), Some(512));
    assert_eq!(h.get_f32("llama.rope.freq_base").unwrap(), Some(10000.0));
    let tokens = h.get_array("tokenizer.ggml.tokens").unwrap().unwrap();
    assert_eq!(tokens.len(), 512);
    assert_eq!(tokens.type_name(), "array<string>");
    assert!(matches!(tokens, GgufArray::String(_)));
    assert!(matches!(
        h.get("general.quantization_version"),
        Some(GgufValue::U32(2))
    ));
    // Metadata comes back in file order.
    assert_eq!(
        h.metadata().first().map(|(k, _)| k.as_str()),
        Some("general.architecture")
    );
}

#[test]
fn fixture_prefixes_stream() {
    let (bytes, full) = load("tests/fixtures/tiny-llama-256-q4_k_m.gguf");
    let total = bytes.len() as u64;
    let mut first_some = None;
    let mut lens: Vec<usize> = (0..full.data_offset as usize).step_by(101).collect();
    lens.extend((full.data_offset as usize - 64)..=(full.data_offset as usize));
    lens.push(bytes.len());
    lens.sort();
    for n in lens {
        match GgufHeader::parse_prefix(&bytes[..n], total, "prefix").unwrap() {
            None => assert!(first_some.is_none(), "Ok(None) at {n} after Ok(Some)"),
            Some(h) => {
                assert_eq!(h.tensors(), full.tensors(), "at {n}");
                assert_eq!(h.metadata(), full.metadata(), "at {n}");
                assert_eq!(h.data_offset, full.data_offset);
                first_some.get_or_insert(n);
            }
        }
    }
    let first = first_some.expect("the whole file gives a header");
    assert!(
        first as u64 <= full.data_offset && first as u64 > full.data_offset - 32,
        "{first}"
    );
}

#[test]
fn smollm2_parses() {
    if require::smollm2().is_none() {
        return;
    }
    let rel = require::SMOLLM2;
    let (bytes, h) = load(rel);
    check_invariants(&bytes, &h);
    assert_eq!(bytes.len(), 98_362_432);
    assert_eq!(h.architecture().unwrap(), "llama");
    assert_eq!(h.get_u32("llama.block_count").unwrap(), Some(30));
    assert_eq!(h.get_u32("llama.embedding_length").unwrap(), Some(576));
    assert_eq!(h.get_u32("llama.attention.head_count").unwrap(), Some(9));
    assert_eq!(h.get_u32("llama.attention.head_count_kv").unwrap(), Some(3));
    let template = h.get_str("tokenizer.chat_template").unwrap().unwrap();
    assert!(template.contains("<|im_start|>"), "{template}");
    let tokens = h.get_str_array("tokenizer.ggml.tokens").unwrap().unwrap();
    assert_eq!(tokens.len(), 49152);
    assert!(h.get_str_array("tokenizer.ggml.merges").unwrap().is_some());
    assert_eq!(h.tensors().len(), 272);
    let embd = h.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.dtype, DType::Q8_0);
    assert_eq!(embd.shape(), vec![49152, 576]);
    assert_eq!(h.tensor("output.weight"), None, "tied embedding");
    assert_eq!(
        h.tensor("blk.29.ffn_down.weight").unwrap().dtype,
        DType::Q4_1
    );
    assert_eq!(
        h.tensors()
            .iter()
            .filter(|t| t.dtype == DType::Q4_1)
            .count(),
        210
    );
    // Streaming: the first ~1.8 MB are enough for the header.
    let prefix = &bytes[..h.data_offset as usize];
    let streamed = GgufHeader::parse_prefix(prefix, bytes.len() as u64, rel)
        .unwrap()
        .unwrap();
    assert_eq!(streamed, h);
    assert!(
        GgufHeader::parse_prefix(&bytes[..1 << 20], bytes.len() as u64, rel)
            .unwrap()
            .is_none()
    );
}

/// `{arch}.pooling_type`: mean, CLS and last name a file's default pooling; a reranker's (4)
/// or an unknown value leaves a decoder loadable (its pooling the caller's) and refuses an
/// encoder, naming the value.
#[test]
fn pooling_type_names_the_default_pooling_and_a_reranker_is_no_encoder() {
    use crate::common::gguf_meta;
    use emberlm::format::gguf_model::config_from_gguf;
    use emberlm::session::Pooling;
    let config = |file: &str, key: &str, value: u32| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(file);
        let mut metadata = gguf_meta::read(&path);
        gguf_meta::set(&mut metadata, key, GgufValue::U32(value));
        let bytes = gguf_meta::write_with_tensors(&metadata, &gguf_meta::read_tensors(&path));
        let header = GgufHeader::parse(&bytes, file).unwrap();
        config_from_gguf(&header)
    };
    let llama = |v| config("tiny-llama-f32.gguf", "llama.pooling_type", v);
    let bert = |v| config("tiny-bert-f32.gguf", "bert.pooling_type", v);
    assert_eq!(llama(2).unwrap().pooling, Some(Pooling::Cls));
    assert_eq!(llama(4).unwrap().pooling, None);
    assert_eq!(llama(0).unwrap().pooling, None);
    assert_eq!(bert(3).unwrap().pooling, Some(Pooling::Last));
    assert_eq!(bert(1).unwrap().pooling, Some(Pooling::Mean));
    for bad in [4, 99] {
        let e = bert(bad).unwrap_err().to_string();
        assert!(e.contains(&format!("pooling_type {bad}")), "{e}");
    }
}
