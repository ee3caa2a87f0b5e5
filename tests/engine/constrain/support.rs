//! Sessions on the CPU backend and constrained generation helpers.

use std::path::{Path, PathBuf};

use emberlm::constrain::ResponseFormat;
use emberlm::loader::ModelFiles;
use emberlm::sampling::SamplingParams;
use emberlm::session::{FinishReason, GenerateOptions, Generation, Prompt, Session};
use serde_json::Value;

/// The tiny fixtures with a byte-level BPE, a SentencePiece and a GGUF-llama tokenizer.
pub const TOKENIZER_KINDS: &[&str] = &[
    "tiny-gpt2-f32.gguf",
    "tiny-llama-spm-f32.gguf",
    "tiny-llama-f32.gguf",
];

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

pub fn cpu_session(path: &Path) -> Session {
    let files = ModelFiles::open(path).unwrap();
    Session::new_cpu(&files, None).unwrap()
}

pub fn sampled(seed: u64, max_new_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        seed: Some(seed),
        max_new_tokens,
        ..SamplingParams::unfiltered()
    }
}

/// The `balanced` preset (temperature 0.8, top-k 50, top-p 0.9), seeded.
pub fn balanced(seed: u64, max_new_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.8,
        top_k: 50,
        top_p: 0.9,
        seed: Some(seed),
        max_new_tokens,
        ..SamplingParams::unfiltered()
    }
}

pub fn greedy(max_new_tokens: usize) -> SamplingParams {
    SamplingParams {
        max_new_tokens,
        ..SamplingParams::greedy()
    }
}

pub fn options(format: &ResponseFormat, sampling: SamplingParams) -> GenerateOptions {
    GenerateOptions {
        sampling,
        response_format: format.clone(),
        ..GenerateOptions::default()
    }
}

pub fn generate(
    s: &mut Session,
    prompt: &str,
    format: &ResponseFormat,
    sampling: SamplingParams,
) -> Generation {
    pollster::block_on(s.generate(
        &Prompt::Text(prompt.into()),
        &options(format, sampling),
        &mut |_| {},
    ))
    .unwrap_or_else(|e| panic!("{format:?}: {e}"))
}

pub fn schema_format(schema: &Value) -> ResponseFormat {
    ResponseFormat::JsonSchema {
        schema: schema.clone(),
        strict: true,
    }
}

/// Every sequence of `g` ended by its grammar (not by the limit), without warnings.
pub fn assert_complete(g: &Generation, what: &str) {
    for s in &g.sequences {
        assert_eq!(
            s.finish_reason,
            FinishReason::Stop,
            "{what}: {:?} ended by {:?}; warnings {:?}",
            s.text,
            s.finish_reason,
            g.warnings
        );
    }
    assert!(g.warnings.is_empty(), "{what}: {:?}", g.warnings);
}

/// `text` parses as JSON and `schema` accepts it.
pub fn assert_valid(schema: &Value, text: &str, what: &str) {
    let value: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: {text:?} is not JSON: {e}"));
    let validator = jsonschema::validator_for(schema).unwrap();
    if let Err(e) = validator.validate(&value) {
        panic!("{what}: {text} does not satisfy the schema: {e}");
    }
}
