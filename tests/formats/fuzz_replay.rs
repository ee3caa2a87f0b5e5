//! Replays every saved fuzz input (`fuzz/corpus/<target>/` and `fuzz/regressions/<target>/`)
//! through the same code the fuzz targets run (`fuzz/fuzz_targets/common.rs`), on stable and
//! without libFuzzer: a parser change that makes any of them panic fails here. See
//! `fuzz/README.md` for running the fuzzers themselves.

#![cfg(not(target_arch = "wasm32"))]

use crate::fuzz_common;

use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Inputs slower than this are named in the output (the whole replay should stay well under
/// half a minute in a debug build).
const SLOW: Duration = Duration::from_secs(1);

/// The files saved for `target`, in name order.
fn inputs(target: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut files = Vec::new();
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        let mut found: Vec<PathBuf> = entries
            .map(|e| e.expect("reading a corpus folder").path())
            .filter(|p| p.is_file())
            .collect();
        found.sort();
        files.extend(found);
    }
    files
}

/// Runs `body` on every saved input of `target`; fails naming each input that panicked.
fn replay(target: &str, body: fn(&[u8])) {
    let files = inputs(target);
    assert!(
        !files.is_empty(),
        "no saved inputs for fuzz target `{target}`"
    );
    let start = Instant::now();
    let mut failed = Vec::new();
    for path in &files {
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let t0 = Instant::now();
        if panic::catch_unwind(AssertUnwindSafe(|| body(&data))).is_err() {
            failed.push(path.display().to_string());
        }
        if t0.elapsed() > SLOW {
            eprintln!("{target}: {} took {:.1?}", path.display(), t0.elapsed());
        }
    }
    eprintln!(
        "{target}: {} inputs in {:.1?}",
        files.len(),
        start.elapsed()
    );
    assert!(
        failed.is_empty(),
        "{target}: {} of {} saved inputs panic:\n  {}",
        failed.len(),
        files.len(),
        failed.join("\n  ")
    );
}

#[test]
fn gguf_header() {
    replay("gguf_header", fuzz_common::gguf_header);
}

#[test]
fn gguf_model() {
    replay("gguf_model", fuzz_common::gguf_model);
}

#[test]
fn gguf_split() {
    replay("gguf_split", fuzz_common::gguf_split);
}

#[test]
fn safetensors_hf() {
    replay("safetensors_hf", fuzz_common::safetensors_hf);
}

#[test]
fn tokenizer_json() {
    replay("tokenizer_json", fuzz_common::tokenizer_json);
}

#[test]
fn tokenizer_gguf() {
    replay("tokenizer_gguf", fuzz_common::tokenizer_gguf);
}

#[test]
fn chat_template() {
    replay("chat_template", fuzz_common::chat_template);
}

#[test]
fn sampling_params() {
    replay("sampling_params", |data| {
        if let Ok(text) = std::str::from_utf8(data) {
            let _ = emberlm::sampling::SamplingParams::from_json(text);
        }
    });
}

#[test]
fn response_format() {
    replay("response_format", fuzz_common::response_format);
}

#[test]
fn load_options() {
    replay("load_options", fuzz_common::load_options);
}

#[test]
fn stored_download() {
    replay("stored_download", fuzz_common::stored_download);
}

#[test]
fn openai_request() {
    replay("openai_request", fuzz_common::openai_request);
}

#[test]
fn http_head() {
    replay("http_head", fuzz_common::http_head);
}

#[test]
fn tune_record() {
    replay("tune_record", fuzz_common::tune_record);
    // the seeds reach past the checks: a whole plan and a decision are trusted
    let seed = |name: &str| {
        std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("fuzz/corpus/tune_record")
                .join(name),
        )
        .expect("a seed record")
    };
    let key = emberlm::tune::TuneKey::new(
        "kernel-plan",
        "fuzz adapter".into(),
        "fuzz driver".into(),
        "fuzz shape".into(),
    );
    let overrides = emberlm::gpu::KernelOverrides::default();
    assert!(emberlm::gpu::KernelPlan::from_record(&seed("plan.json"), &key, &overrides).is_some());
    let decision = emberlm::tune::parse_record::<emberlm::session::CacheDecision>(
        &seed("decision.json"),
        &key,
    );
    assert!(
        matches!(decision, emberlm::tune::Lookup::Found(_)),
        "{decision:?}"
    );
}

#[test]
fn block_decode() {
    replay("block_decode", fuzz_common::block_decode);
}

#[test]
fn grammar_compile() {
    replay("grammar_compile", fuzz_common::grammar_compile);
}

/// A tokenizer.json whose `Replace` normalizers match the empty string (each inserting its
/// content between every two characters, one after the other) took 24 s to encode a few words
/// under the fuzzer; it is refused as it loads, naming the problem.
#[test]
fn a_replace_that_matches_the_empty_string_is_refused() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/regressions/tokenizer_json/replace-empty-pattern-chain");
    let data = std::fs::read(&path).expect("the saved input");
    let (json, config) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], Some(&data[at + 1..])),
        None => (&data[..], None),
    };
    let err = emberlm::tokenizer::Tokenizer::from_json(json, config, "tokenizer.json")
        .expect_err("refused");
    assert!(
        err.to_string().contains("matches the empty string"),
        "{err}"
    );
}
