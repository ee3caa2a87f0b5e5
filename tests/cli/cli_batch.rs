//! `emberlm batch`: input order, agreement with `emberlm generate`, per-prompt options, errors.

#![cfg(not(target_arch = "wasm32"))]

use crate::common::require;

use std::path::PathBuf;
use std::process::Command;

const LLAMA: &str = "tests/fixtures/tiny-llama-q4_1.gguf";

fn emberlm(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_emberlm"))
        // the adapter, even a software one: these tests check the GPU path (`auto` would
        // time lavapipe against the CPU backend and may pick either)
        .env("EMBERLM_DEVICE", "gpu")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("the binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Writes `text` to a file of its own under the target directory.
fn input(name: &str, text: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cli_batch-{name}"));
    std::fs::write(&path, text).expect("the target directory is writable");
    path
}

fn json_lines(out: &str) -> Vec<serde_json::Value> {
    out.lines()
        .map(|l| serde_json::from_str(l).expect("every line is JSON"))
        .collect()
}

const PROMPTS: [&str; 3] = [
    "Permission is hereby granted, free of charge, to any person obtaining a copy",
    "MIT",
    "The above copyright notice",
];

#[test]
fn batch_matches_generate_in_input_order() {
    let file = input(
        "order.txt",
        &format!("{}\n\n{}\n   \n{}\n", PROMPTS[0], PROMPTS[1], PROMPTS[2]),
    );
    let flags = ["--temperature", "0", "--max-new-tokens", "8"];
    let mut args = vec!["batch", "--model", LLAMA, "--prompts"];
    args.push(file.to_str().expect("utf-8 path"));
    args.extend(flags);
    args.push("--jsonl");
    let (code, out, err) = emberlm(&args);
    if require::cli_found_no_gpu(&err) {
        return;
    }
    assert_eq!(code, 0, "{err}");
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 3, "blank lines are skipped: {out}");
    for (i, (line, prompt)) in lines.iter().zip(PROMPTS).enumerate() {
        assert_eq!(line["index"], i);
        assert_eq!(line["line"], [1, 3, 5][i]);
        assert_eq!(line["prompt"], prompt);
        assert_eq!(line["sequences"].as_array().map(Vec::len), Some(1));
        let mut alone = vec!["generate", "--model", LLAMA, "--prompt", prompt, "--json"];
        alone.extend(flags);
        let (code, single, err) = emberlm(&alone);
        assert_eq!(code, 0, "{err}");
        let single: serde_json::Value = serde_json::from_str(&single).expect("JSON");
        assert_eq!(line["prompt_tokens"], single["prompt_tokens"], "{prompt}");
        assert_eq!(
            line["sequences"][0]["tokens"],
            single["sequences"][0]["tokens"]
        );
        assert_eq!(line["sequences"][0]["text"], single["sequences"][0]["text"]);
        for key in [
            "generated_tokens",
            "time_to_first_token_ms",
            "decode_tok_per_s",
        ] {
            assert!(line["stats"][key].is_number(), "{key}: {line}");
        }
    }
    // Text output: a header per prompt and a marked sequence.
    args.pop();
    let (code, text, err) = emberlm(&args);
    assert_eq!(code, 0, "{err}");
    assert_eq!(text.matches("=== line ").count(), 3, "{text}");
    assert!(text.starts_with("=== line 1: \"Permission"), "{text}");
    assert!(text.contains("=== line 3: \"MIT\" ===\n--- sequence 1/1 ("));
}

#[test]
fn batch_several_sequences_per_prompt() {
    let file = input("several.txt", &PROMPTS.join("\n"));
    let path = file.to_str().expect("utf-8 path");
    let args = [
        "batch",
        "--model",
        LLAMA,
        "--prompts",
        path,
        "--num-return-sequences",
        "2",
        "--temperature",
        "0.8",
        "--seed",
        "1",
        "--max-new-tokens",
        "6",
    ];
    let mut json = args.to_vec();
    json.push("--jsonl");
    let (code, out, err) = emberlm(&json);
    if require::cli_found_no_gpu(&err) {
        return;
    }
    assert_eq!(code, 0, "{err}");
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 3);
    for line in &lines {
        assert_eq!(
            line["sequences"].as_array().map(Vec::len),
            Some(2),
            "{line}"
        );
        assert_eq!(line["seed"], 1);
    }
    // Seeded: the same again.
    let (_, again, _) = emberlm(&json);
    assert_eq!(json_lines(&again)[2]["sequences"], lines[2]["sequences"]);
    let (code, text, err) = emberlm(&args);
    assert_eq!(code, 0, "{err}");
    assert_eq!(text.matches("--- sequence 2/2 (").count(), 3, "{text}");
}

#[test]
fn batch_jsonl_input_with_per_prompt_options() {
    let file = input(
        "options.jsonl",
        "{\"prompt\": \"MIT\", \"max_new_tokens\": 3}\n\
         {\"prompt\": \"MIT\", \"maxNewTokens\": 5, \"temperature\": 0.9, \"seed\": 5}\n\
         MIT\n\
         {\"prompt\": \"{braces}\", \"temperature\": 0.9, \"seed\": 5, \"max_new_tokens\": 5}\n\
         {\"prompt\": \"MIT\", \"maxNewTokens\": 5, \"temperature\": 0.9, \"seed\": 5}\n",
    );
    let path = file.to_str().expect("utf-8 path");
    // Token 0 ends a sequence: forbidding it makes every sequence reach its length. The flag's
    // bias stays in force for lines that set other options.
    let (code, out, err) = emberlm(&[
        "batch",
        "--model",
        LLAMA,
        "--prompts",
        path,
        "--temperature",
        "0",
        "--max-new-tokens",
        "4",
        "--logit-bias",
        "0=-100",
        "--jsonl",
    ]);
    if require::cli_found_no_gpu(&err) {
        return;
    }
    assert_eq!(code, 0, "{err}");
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 5);
    let lengths: Vec<usize> = lines
        .iter()
        .map(|l| l["sequences"][0]["tokens"].as_array().map_or(0, Vec::len))
        .collect();
    assert_eq!(lengths, [3, 5, 4, 5, 5], "{out}");
    assert_eq!(
        lines[0]["seed"],
        serde_json::Value::Null,
        "greedy from the flags"
    );
    assert_eq!(lines[1]["seed"], 5);
    assert_eq!(lines[3]["prompt"], "{braces}");
    // The same prompt and seed give the same sequence, wherever it is in the batch (the
    // log-probability may differ in the last bits: line 2 reuses line 1's cached prompt).
    for key in ["tokens", "text", "finish_reason"] {
        assert_eq!(lines[1]["sequences"][0][key], lines[4]["sequences"][0][key]);
    }
    let logprob = |i: usize| lines[i]["sequences"][0]["logprob"].as_f64().unwrap_or(0.0);
    assert!((logprob(1) - logprob(4)).abs() < 1e-4);
    assert_ne!(
        lines[0]["sequences"][0]["tokens"],
        lines[1]["sequences"][0]["tokens"]
    );
}

#[test]
fn batch_rejects_bad_lines_before_generating() {
    let cases = [
        ("{\"prompt\": \"a\", \"top_p\": 7}", "top_p"),
        ("{\"prompt\": \"a\", \"tempreature\": 1}", "tempreature"),
        ("{\"prompt\": \"a\", \"topK\": -1}", "top_k"),
        (
            "{\"prompt\": \"a\", \"logit_bias\": {\"99999\": 1}}",
            "logit_bias",
        ),
        ("{\"prompt\": 3}", "prompt"),
        ("{\"temperature\": 0}", "prompt"),
        ("{\"prompt\": \"a\"", "JSON"),
    ];
    for (i, (bad, option)) in cases.iter().enumerate() {
        let file = input(
            &format!("bad-{i}.txt"),
            &format!("MIT\n\nhello\n{bad}\nworld\n"),
        );
        let path = file.to_str().expect("utf-8 path");
        let (code, out, err) = emberlm(&[
            "batch",
            "--model",
            LLAMA,
            "--prompts",
            path,
            "--max-new-tokens",
            "2",
        ]);
        assert_eq!(code, 2, "{bad}: {err}");
        assert!(err.contains("line 4"), "{bad}: {err}");
        assert!(err.contains(option), "{bad}: {err}");
        assert!(out.is_empty(), "nothing is generated: {out}");
    }
}

#[test]
fn batch_output_file() {
    let file = input("out-in.txt", "MIT\nhello\n");
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli_batch-out.jsonl");
    let _ = std::fs::remove_file(&target);
    let (code, out, err) = emberlm(&[
        "batch",
        "--model",
        LLAMA,
        "--prompts",
        file.to_str().expect("utf-8 path"),
        "--output",
        target.to_str().expect("utf-8 path"),
        "--max-new-tokens",
        "3",
        "--jsonl",
    ]);
    if require::cli_found_no_gpu(&err) {
        return;
    }
    assert_eq!(code, 0, "{err}");
    assert!(out.is_empty(), "results go to the file: {out}");
    let written = std::fs::read_to_string(&target).expect("the output file exists");
    let lines = json_lines(&written);
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1]["prompt"], "hello");
    assert!(err.contains("2 prompts"), "{err}");
}

#[test]
fn batch_usage_errors() {
    let file = input("usage.txt", "MIT\n");
    let path = file.to_str().expect("utf-8 path");
    let (code, _, err) = emberlm(&["batch", "--model", LLAMA, "--prompts", path, "--bogus"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--bogus"), "{err}");
    for cmd in ["batch", "generate"] {
        let mut args = vec![cmd, "--model", LLAMA, "--top-p", "2"];
        if cmd == "batch" {
            args.extend(["--prompts", path]);
        } else {
            args.extend(["--prompt", "x"]);
        }
        let (code, _, err) = emberlm(&args);
        assert_eq!(code, 2, "{cmd}: {err}");
        assert!(err.contains("top_p"), "{cmd}: {err}");
    }
    // A missing input file is a usage error, like an unreadable --prompt-file.
    let (code, _, err) = emberlm(&[
        "batch",
        "--model",
        LLAMA,
        "--prompts",
        "tests/fixtures/no-such-prompts.txt",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("tests/fixtures/no-such-prompts.txt"), "{err}");
    let empty = input("empty.txt", "\n  \n\n");
    let (code, _, err) = emberlm(&[
        "batch",
        "--model",
        LLAMA,
        "--prompts",
        empty.to_str().expect("utf-8 path"),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no prompts"), "{err}");
    let (code, _, err) = emberlm(&["batch", "--model", LLAMA]);
    assert_eq!(code, 2, "--prompts is required: {err}");
    let (code, _, err) = emberlm(&[
        "batch",
        "--model",
        LLAMA,
        "--prompts",
        path,
        "--system",
        "x",
    ]);
    assert_eq!(code, 2, "--system needs --chat: {err}");
}

/// `--max-batch` changes how many sequences share a step, never what they generate; `info
/// --batch` sizes the KV cache for that many.
#[test]
fn batch_size_changes_speed_not_results() {
    let file = input(
        "sizes.txt",
        &format!(
            "{}\n{}\n{}\n{{\"prompt\": \"MIT\", \"max_new_tokens\": 2}}\n",
            PROMPTS[0], PROMPTS[1], PROMPTS[2]
        ),
    );
    let run = |max_batch: &str| {
        let path = file.to_str().expect("utf-8 path");
        let args = [
            "batch",
            "--model",
            LLAMA,
            "--prompts",
            path,
            "--temperature",
            "0",
            "--max-new-tokens",
            "6",
            "--jsonl",
            "--max-batch",
            max_batch,
        ];
        emberlm(&args)
    };
    let (code, one, err) = run("1");
    if require::cli_found_no_gpu(&err) {
        return;
    }
    assert_eq!(code, 0, "{err}");
    let one = json_lines(&one);
    for size in ["2", "4"] {
        let (code, out, err) = run(size);
        assert_eq!(code, 0, "{err}");
        let got = json_lines(&out);
        assert_eq!(got.len(), 4);
        for (a, b) in got.iter().zip(&one) {
            let (a, b) = (&a["sequences"][0], &b["sequences"][0]);
            // the log-probabilities differ in rounding (other kernels add in another order)
            for key in ["tokens", "text", "finish_reason"] {
                assert_eq!(a[key], b[key], "--max-batch {size}: {key}");
            }
        }
    }
    assert_eq!(
        one[3]["sequences"][0]["tokens"].as_array().map(Vec::len),
        Some(2)
    );
    let (code, _, err) = run("0");
    assert_eq!(code, 2, "{err}");
    let (code, out, err) = emberlm(&["info", "--model", LLAMA, "--ctx", "32", "--batch", "4"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("for 4 sequences decoded together"), "{out}");
    assert!(out.contains("batching:"), "{out}");
}
