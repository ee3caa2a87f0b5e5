//! The response-format flags of `emberlm generate` and `batch` on a tiny fixture and the CPU
//! backend: the text obeys the format; conflicting flags and bad grammars exit with code 2 and
//! a message naming the problem.

#![cfg(not(target_arch = "wasm32"))]

use crate::cli_run;

use cli_run::emberlm;
use serde_json::Value;

const MODEL: &str = "tests/fixtures/tiny-gpt2-f32.gguf";

fn scratch(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("emberlm-cli-formats-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let path = dir.join(name);
    std::fs::write(&path, text).expect("scratch file");
    path
}

fn generate(extra: &[&str]) -> Value {
    let mut args = vec![
        "generate", "--device", "cpu", "--model", MODEL, "--prompt", "x", "--json", "--seed", "3",
    ];
    args.extend_from_slice(extra);
    let (code, out, err) = emberlm(&args);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{out:?}: {e}"))
}

#[test]
fn generate_follows_each_format_flag() {
    let g = generate(&["--regex", "[0-9]{3}-[a-z]{2}"]);
    let text = g["sequences"][0]["text"].as_str().expect("text");
    assert!(text.len() == 6 && text.as_bytes()[3] == b'-', "{text:?}");

    let schema = scratch(
        "s.json",
        r#"{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"],"additionalProperties":false}"#,
    );
    let g = generate(&["--json-schema", schema.to_str().expect("path")]);
    let text = g["sequences"][0]["text"].as_str().expect("text");
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    assert!(v["ok"].is_boolean(), "{text}");

    // speculative decoding (prompt lookup) under the same schema, greedy: plain decoding's text
    let plain = generate(&[
        "--json-schema",
        schema.to_str().expect("path"),
        "--temperature",
        "0",
    ]);
    let spec = generate(&[
        "--json-schema",
        schema.to_str().expect("path"),
        "--temperature",
        "0",
        "--lookup",
    ]);
    assert_eq!(spec["sequences"][0]["text"], plain["sequences"][0]["text"]);
    assert!(spec["stats"]["speculative"].is_object(), "{spec}");

    let gbnf = scratch("g.gbnf", "root ::= (\"yes\" | \"no\") \"!\"\n");
    let g = generate(&["--gbnf", gbnf.to_str().expect("path")]);
    let text = g["sequences"][0]["text"].as_str().expect("text");
    assert!(text == "yes!" || text == "no!", "{text:?}");

    let lark = scratch("g.lark", "start: /[a-c]{2}/ \".\"\n");
    let g = generate(&["--lark", lark.to_str().expect("path")]);
    let text = g["sequences"][0]["text"].as_str().expect("text");
    assert!(text.len() == 3 && text.ends_with('.'), "{text:?}");

    // `{"ok": ...}` takes more than two tokens: the limit comes first, and says so
    let g = generate(&[
        "--json-schema",
        schema.to_str().expect("path"),
        "--max-new-tokens",
        "2",
    ]);
    assert_eq!(g["sequences"][0]["finish_reason"], "length");
    assert!(
        g["warnings"][0]
            .as_str()
            .is_some_and(|w| w.contains("json_schema")),
        "{g}"
    );
}

#[test]
fn batch_lines_may_carry_their_own_format() {
    let prompts = scratch(
        "p.jsonl",
        "{\"prompt\": \"a\", \"response_format\": {\"type\": \"regex\", \"regex\": \"[0-9]{4}\"}}\nplain line\n",
    );
    let (code, out, err) = emberlm(&[
        "batch",
        "--device",
        "cpu",
        "--model",
        MODEL,
        "--prompts",
        prompts.to_str().expect("path"),
        "--jsonl",
        "--regex",
        "[a-z]{3}",
        "--seed",
        "1",
    ]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let text = |i: usize| {
        lines[i]["sequences"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        text(0).len() == 4 && text(0).bytes().all(|b| b.is_ascii_digit()),
        "{:?}",
        text(0)
    );
    assert!(
        text(1).len() == 3 && text(1).bytes().all(|b| b.is_ascii_lowercase()),
        "{:?}",
        text(1)
    );
}

#[test]
fn conflicting_flags_and_bad_grammars_are_usage_errors() {
    let (code, _, err) = emberlm(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        MODEL,
        "--prompt",
        "x",
        "--json-object",
        "--regex",
        "a",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--regex") || err.contains("--json-object"),
        "{err}"
    );
    let bad = scratch("bad.gbnf", "root ::= \"a\" (\n");
    let (code, _, err) = emberlm(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        MODEL,
        "--prompt",
        "x",
        "--gbnf",
        bad.to_str().expect("path"),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("line 1, column 14"), "{err}");
    let (code, _, err) = emberlm(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        MODEL,
        "--prompt",
        "x",
        "--json-schema",
        "/nonexistent/s.json",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/nonexistent/s.json"), "{err}");
}
