//! Greedy generation through the native `Session` against `fixtures/native_browser_agreement.json`,
//! the CLI's own output (`tools/native_browser_agreement.mjs` writes it). `tests/web/engine.rs`
//! checks the same file through the JavaScript `Engine` in the browser, so the CLI, the native
//! library and the browser agree. This is an agreement check, not a correctness one: the forward
//! pass is held to the float64 goldens by `tests/gpu/forward_golden.rs`.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use std::path::PathBuf;

use emberlm::loader::ModelFiles;
use emberlm::sampling::SamplingParams;
use emberlm::session::{GenerateOptions, Prompt, Session};
use emberlm::GpuOptions;
use serde_json::Value;

#[test]
fn greedy_generation_agrees_with_the_cli() {
    check("cases", &|files| {
        let ctx = common::native_gpu(GpuOptions::default())?;
        Some(pollster::block_on(Session::new(ctx, files, None)).unwrap())
    });
}

/// The CPU backend's greedy continuations (`cpu_cases`), which the browser's WebAssembly CPU
/// backend reproduces too (`tests/web/cpu.rs`).
#[test]
fn cpu_greedy_generation_agrees_with_the_cli() {
    check("cpu_cases", &|files| {
        Some(Session::new_cpu(files, None).unwrap())
    });
}

/// `tests/fixtures/native_browser_agreement.json`.
fn agreement(root: &std::path::Path) -> Value {
    let path = root.join("tests/fixtures/native_browser_agreement.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Every case of `key` through a session `load` makes (`None`: no GPU here, and none required).
fn check(key: &str, load: &dyn Fn(&ModelFiles) -> Option<Session>) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let agreement = agreement(&root);
    let max_new_tokens = agreement["max_new_tokens"].as_u64().unwrap() as usize;
    let cases = agreement[key].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let model = case["model"].as_str().unwrap();
        let files = ModelFiles::open(&root.join("tests/fixtures").join(model)).unwrap();
        let Some(mut session) = load(&files) else {
            return;
        };
        let prompt = Prompt::from_json(&case["prompt"].to_string()).unwrap();
        let options = GenerateOptions {
            sampling: SamplingParams {
                max_new_tokens,
                ..SamplingParams::greedy()
            },
            ..GenerateOptions::default()
        };
        let mut pieces = String::new();
        let g = pollster::block_on(
            session.generate(&prompt, &options, &mut |e| pieces.push_str(&e.text)),
        )
        .unwrap_or_else(|e| panic!("{model}: {e}"));
        let s = &g.sequences[0];
        eprintln!("{model} {}: {:?}", case["prompt"], s.text);
        assert_eq!(
            serde_json::to_value(&g.prompt_tokens).unwrap(),
            case["prompt_tokens"],
            "{model}"
        );
        assert_eq!(
            serde_json::to_value(&s.tokens).unwrap(),
            case["tokens"],
            "{model} {}",
            case["prompt"]
        );
        assert_eq!(s.text, case["text"].as_str().unwrap(), "{model}");
        assert_eq!(s.finish_reason.as_str(), case["finish_reason"], "{model}");
        assert_eq!(pieces, s.text, "{model}: the events add up to the text");
    }
}

/// The CPU backend's mean NLL of a text (`cpu_perplexity`), bit for bit: the browser's
/// WebAssembly build reproduces the same values (`tests/web/cpu.rs`), which holds only while
/// every function on the way (exp, tanh, sin/cos, pow, ln) has one implementation on both
/// targets (`emberlm::math`; the platform's C library rounds some results differently).
#[test]
fn cpu_perplexity_agrees_with_the_cli_bit_for_bit() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let agreement = agreement(&root);
    let cases = agreement["cpu_perplexity"].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let model = case["model"].as_str().unwrap();
        let files = ModelFiles::open(&root.join("tests/fixtures").join(model)).unwrap();
        let mut session = Session::new_cpu(&files, None).unwrap();
        let prompt = Prompt::Text(case["text"].as_str().unwrap().to_string());
        let tokens = session.tokenize_prompt(&prompt, false).unwrap();
        let score = pollster::block_on(session.score(&tokens)).unwrap();
        eprintln!("{model}: {} tokens, mean NLL {}", score.tokens, score.nll);
        assert_eq!(
            score.tokens as u64,
            case["tokens"].as_u64().unwrap(),
            "{model}"
        );
        let want = common::agreement_nll(case);
        assert!(
            score.nll.to_bits() == want.to_bits(),
            "{model}: mean NLL {:e}, the CLI's file says {want:e} ({:e} apart)",
            score.nll,
            score.nll - want
        );
    }
}
