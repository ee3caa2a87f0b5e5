//! Replays every saved fuzz input (`fuzz/corpus/<target>_seed_corpus.zip` and
//! `fuzz/regressions/<target>/`)
//! through the same code the fuzz targets run (`fuzz/fuzz_targets/common.rs`), on stable and
//! without libFuzzer: a parser change that makes any of them panic fails here. See
//! `fuzz/README.md` for running the fuzzers themselves.

#![cfg(not(target_arch = "wasm32"))]

use crate::fuzz_common;

use std::io::Read;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Inputs slower than this are named in the output (the whole replay should stay well under
/// half a minute in a debug build).
const SLOW: Duration = Duration::from_secs(1);

/// The inputs saved for `target`, each `(name, bytes)`: its corpus archive
/// (`fuzz/corpus/<target>_seed_corpus.zip`, entries in name order), then its regressions
/// (`fuzz/regressions/<target>/`, files in name order).
fn inputs(target: &str) -> Vec<(String, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut out = Vec::new();
    let archive = root
        .join("corpus")
        .join(format!("{target}_seed_corpus.zip"));
    if let Ok(file) = std::fs::File::open(&archive) {
        let mut zip =
            zip::ZipArchive::new(file).unwrap_or_else(|e| panic!("{}: {e}", archive.display()));
        let mut names: Vec<String> = zip.file_names().map(String::from).collect();
        names.sort();
        for name in names {
            let mut entry = zip
                .by_name(&name)
                .unwrap_or_else(|e| panic!("{}: {name}: {e}", archive.display()));
            let mut data = Vec::new();
            entry
                .read_to_end(&mut data)
                .unwrap_or_else(|e| panic!("{}: {name}: {e}", archive.display()));
            out.push((format!("{}:{name}", archive.display()), data));
        }
    }
    if let Ok(entries) = std::fs::read_dir(root.join("regressions").join(target)) {
        let mut found: Vec<PathBuf> = entries
            .map(|e| e.expect("reading a regressions folder").path())
            .filter(|p| p.is_file())
            .collect();
        found.sort();
        for path in found {
            let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            out.push((path.display().to_string(), data));
        }
    }
    out
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
    for (name, data) in &files {
        let t0 = Instant::now();
        if panic::catch_unwind(AssertUnwindSafe(|| body(data))).is_err() {
            failed.push(name.clone());
        }
        if t0.elapsed() > SLOW {
            eprintln!("{target}: {name} took {:.1?}", t0.elapsed());
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
            let options = emberlm::session::GenerateOptions::from_json(text);
            let _ = options.and_then(|o| o.validate());
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
fn tool_calls() {
    replay("tool_calls", fuzz_common::tool_calls);
}

#[test]
fn http_head() {
    replay("http_head", fuzz_common::http_head);
}

#[test]
fn saved_state() {
    use emberlm::session::saved_state::SavedState;
    fn read(data: &[u8]) {
        if let Ok(state) = SavedState::from_bytes(data, "fuzz.kv") {
            let bytes = state.to_bytes().expect("a state that read writes");
            let again = SavedState::from_bytes(&bytes, "fuzz.kv").expect("written reads");
            assert_eq!(again, state);
        }
    }
    // as the target: each input as it is, and with its digest made right
    replay("saved_state", |data| {
        read(data);
        if data.len() >= 32 {
            use sha2::Digest;
            let (content, _) = data.split_at(data.len() - 32);
            let mut fixed = content.to_vec();
            fixed.extend_from_slice(&sha2::Sha256::digest(content));
            read(&fixed);
        }
    });
    // the seeds reach past the checks: each is a whole saved conversation
    let seeds: Vec<_> = inputs("saved_state")
        .into_iter()
        .filter(|(n, _)| n.contains("saved-"))
        .collect();
    assert_eq!(seeds.len(), 4);
    for (name, data) in seeds {
        SavedState::from_bytes(&data, &name).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn tune_record() {
    replay("tune_record", fuzz_common::tune_record);
    // the seeds reach past the checks: a whole plan and a decision are trusted
    let saved = inputs("tune_record");
    let seed = |name: &str| {
        let (_, data) = saved
            .iter()
            .find(|(n, _)| n.ends_with(&format!(":{name}")))
            .unwrap_or_else(|| panic!("the seed record `{name}` is in the tune_record archive"));
        String::from_utf8(data.clone()).expect("a seed record is text")
    };
    let key = emberlm::tune::TuneKey::new(
        "kernel-plan",
        "fuzz adapter".into(),
        "fuzz driver".into(),
        "fuzz shape".into(),
    );
    let overrides = emberlm::backend::gpu::KernelOverrides::default();
    assert!(
        emberlm::backend::gpu::KernelPlan::from_record(&seed("plan.json"), &key, &overrides)
            .is_some()
    );
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
