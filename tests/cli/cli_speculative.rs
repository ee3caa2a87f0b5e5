//! Speculative decoding from the command line: `--draft-model` and `--lookup` give the tokens
//! of plain greedy decoding with `"speculative"` stats in `--json`, every tuning flag is
//! checked by name (usage errors, exit 2), `batch` takes the flags, and chat's `/spec` shows
//! and changes the settings.

#![cfg(not(target_arch = "wasm32"))]

use crate::cli_run;
use crate::common::require;

use std::io::Write;
use std::process::{Command, Stdio};

use cli_run::emberlm;

const MODEL: &str = "tests/fixtures/tiny-llama-f32.gguf";
const DRAFT: &str = "tests/fixtures/tiny-llama-q8_0.gguf";

fn run_json(flags: &[&str]) -> Option<serde_json::Value> {
    let mut args = vec![
        "generate",
        "--model",
        MODEL,
        "--prompt",
        "Once upon a time",
        "--temperature",
        "0",
        "--max-new-tokens",
        "24",
        "--json",
    ];
    args.extend_from_slice(flags);
    let (code, out, err) = emberlm(&args);
    if require::cli_found_no_gpu(&err) {
        return None;
    }
    assert_eq!(code, 0, "{flags:?}: {err}");
    Some(serde_json::from_str(&out).unwrap())
}

#[test]
fn draft_and_lookup_give_the_plain_tokens_and_report_acceptance() {
    let Some(plain) = run_json(&[]) else {
        return;
    };
    assert!(plain["stats"].get("speculative").is_none());
    for flags in [
        vec!["--draft-model", DRAFT],
        vec!["--draft_model", DRAFT, "--spec-k", "6", "--spec-adaptive"],
        vec!["--lookup", "--spec_k", "2", "--no-spec-extra-token"],
        vec!["--draft-model", DRAFT, "--spec-disable-below", "0.9"],
    ] {
        let got = run_json(&flags).unwrap();
        // the same tokens and text; log-probabilities differ in the last bits (a verification
        // step computes a row as a prefill does, not as a decode step)
        for key in ["tokens", "text", "finish_reason"] {
            assert_eq!(
                got["sequences"][0][key], plain["sequences"][0][key],
                "{flags:?}"
            );
        }
        let s = &got["stats"]["speculative"];
        for key in [
            "method",
            "drafted",
            "accepted",
            "acceptance_rate",
            "target_steps",
            "k_final",
        ] {
            assert!(s.get(key).is_some(), "{flags:?}: {key} missing in {s}");
        }
        let method = if flags.contains(&"--lookup") {
            "lookup"
        } else {
            "draft"
        };
        assert_eq!(s["method"], method);
    }
}

#[test]
fn bad_speculative_flags_are_usage_errors_naming_the_flag() {
    for (flags, name) in [
        (vec!["--lookup", "--spec-k", "0"], "--spec-k"),
        (vec!["--lookup", "--spec-k", "65"], "--spec-k"),
        (
            vec!["--lookup", "--spec-disable-below", "1.5"],
            "--spec-disable-below",
        ),
        (vec!["--spec-k", "3"], "--draft-model"),
        (vec!["--lookup", "--draft-model", DRAFT], "--lookup"),
    ] {
        let mut args = vec!["generate", "--model", MODEL, "--prompt", "x"];
        args.extend_from_slice(&flags);
        let (code, _, err) = emberlm(&args);
        assert_eq!(code, 2, "{flags:?}: {err}");
        assert!(err.contains(name), "{flags:?}: {err}");
    }
    // a draft of another vocabulary: named, not a crash
    let (code, _, err) = emberlm(&[
        "generate",
        "--model",
        MODEL,
        "--prompt",
        "x",
        "--draft-model",
        "tests/fixtures/tiny-llama-spm-f32.gguf",
    ]);
    if require::cli_found_no_gpu(&err) {
        return;
    }
    assert_ne!(code, 0);
    assert!(err.contains("vocabulary differs"), "{err}");
}

#[test]
fn batch_and_chat_speculate() {
    let dir = std::env::temp_dir().join(format!("emberlm-spec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let prompts = dir.join("prompts.txt");
    std::fs::write(
        &prompts,
        "Once upon a time\nThe cat sat on the mat, the cat sat\n",
    )
    .unwrap();
    let p = prompts.to_str().unwrap();
    let batch = |flags: &[&str]| {
        let mut args = vec![
            "batch",
            "--model",
            MODEL,
            "--prompts",
            p,
            "--jsonl",
            "--temperature",
            "0",
            "--max-new-tokens",
            "12",
        ];
        args.extend_from_slice(flags);
        emberlm(&args)
    };
    let (code, plain, err) = batch(&[]);
    if require::cli_found_no_gpu(&err) {
        return;
    }
    assert_eq!(code, 0, "{err}");
    let (code, spec, err) = batch(&["--lookup"]);
    assert_eq!(code, 0, "{err}");
    let texts = |out: &str| -> Vec<serde_json::Value> {
        out.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["tokens"].clone())
            .collect()
    };
    assert_eq!(texts(&plain), texts(&spec));
    std::fs::remove_dir_all(&dir).ok();

    let mut child = Command::new(env!("CARGO_BIN_EXE_emberlm"))
        // the adapter, even a software one: these tests check the GPU path (`auto` would
        // time lavapipe against the CPU backend and may pick either)
        .env("EMBERLM_DEVICE", "gpu")
        .args([
            "chat",
            "--model",
            MODEL,
            "--draft-model",
            DRAFT,
            "--temperature",
            "0",
            "--max-new-tokens",
            "6",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let input =
        "/spec\n/spec lookup\n/spec k 3\n/spec k 0\n/spec adaptive on\nhello\n/spec off\n/quit\n";
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("# speculative = draft (k 4"), "{stdout}");
    assert!(stdout.contains("# speculative = lookup (k 3"), "{stdout}");
    assert!(stdout.contains("adaptive on"), "{stdout}");
    assert!(stdout.contains("# speculative = off"), "{stdout}");
    assert!(stderr.contains("spec_k"), "k 0 refused: {stderr}");
    assert!(
        stderr.contains("lookup:"),
        "the reply's stats line: {stderr}"
    );
}
