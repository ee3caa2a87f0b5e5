//! The sampling flags as users coming from Hugging Face write them: snake_case spellings of
//! every multi-word flag, `--do_sample`, and the named presets; each gives the same tokens as
//! the flags it stands for, and bad values are usage errors naming the flag.

#![cfg(not(target_arch = "wasm32"))]

use crate::cli_run;
use crate::common::require;

use cli_run::emberlm;

const MODEL: &str = "tests/fixtures/tiny-llama-q4_1.gguf";

/// The tokens `generate` returns with `flags`, or `None` when there is no GPU (and it is not
/// required).
fn tokens(flags: &[&str]) -> Option<Vec<u64>> {
    let mut args = vec![
        "generate",
        "--model",
        MODEL,
        "--prompt",
        "The software",
        "--json",
    ];
    args.extend_from_slice(flags);
    let (code, out, err) = emberlm(&args);
    if require::cli_found_no_gpu(&err) {
        return None;
    }
    assert_eq!(code, 0, "{flags:?}: {err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    Some(
        v["sequences"][0]["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t.as_u64())
            .collect(),
    )
}

#[test]
fn snake_case_spellings_are_the_same_flags() {
    let Some(dashed) = tokens(&[
        "--max-new-tokens",
        "7",
        "--top-k",
        "5",
        "--top-p",
        "0.9",
        "--repetition-penalty",
        "1.2",
        "--seed",
        "11",
        "--num-return-sequences",
        "1",
        "--penalty-last-n",
        "8",
    ]) else {
        return;
    };
    let snake = tokens(&[
        "--max_new_tokens",
        "7",
        "--top_k",
        "5",
        "--top_p",
        "0.9",
        "--repetition_penalty",
        "1.2",
        "--seed",
        "11",
        "--num_return_sequences",
        "1",
        "--penalty_last_n",
        "8",
    ])
    .unwrap();
    assert_eq!(dashed, snake);
    assert!(!dashed.is_empty() && dashed.len() <= 7);
}

#[test]
fn do_sample_false_is_greedy_and_true_needs_a_temperature() {
    let Some(greedy) = tokens(&["--temperature", "0", "--max-new-tokens", "6"]) else {
        return;
    };
    // Hugging Face's spelling: greedy, whatever temperature is beside it
    let off = tokens(&[
        "--do_sample",
        "false",
        "--temperature",
        "1.5",
        "--seed",
        "3",
        "--max_new_tokens",
        "6",
    ])
    .unwrap();
    assert_eq!(greedy, off);
    let (code, _, err) = emberlm(&[
        "generate",
        "--model",
        MODEL,
        "--prompt",
        "x",
        "--do-sample",
        "true",
        "--temperature",
        "0",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("do_sample"), "{err}");
    let (code, _, err) = emberlm(&[
        "generate",
        "--model",
        MODEL,
        "--prompt",
        "x",
        "--do_sample",
        "maybe",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("do_sample") || err.contains("do-sample"),
        "{err}"
    );
}

#[test]
fn presets_stand_for_their_settings_under_explicit_flags() {
    let Some(creative) = tokens(&[
        "--preset",
        "creative",
        "--seed",
        "5",
        "--max-new-tokens",
        "8",
    ]) else {
        return;
    };
    let spelled = tokens(&[
        "--temperature",
        "1.3",
        "--top-k",
        "100",
        "--top-p",
        "0.95",
        "--seed",
        "5",
        "--max-new-tokens",
        "8",
    ])
    .unwrap();
    assert_eq!(creative, spelled);
    // a flag beside the preset wins: conservative with temperature 0 is greedy
    let greedy = tokens(&["--temperature", "0", "--max-new-tokens", "8"]).unwrap();
    let overridden = tokens(&[
        "--preset",
        "conservative",
        "--temperature",
        "0",
        "--max-new-tokens",
        "8",
    ])
    .unwrap();
    assert_eq!(greedy, overridden);
    let (code, _, err) = emberlm(&[
        "generate", "--model", MODEL, "--prompt", "x", "--preset", "wild",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("preset"), "{err}");
}

/// `--eos-token-id` replaces the model's end token (generation stops at it), and `--ignore-eos`
/// generates past it to the length limit, with the same tokens as without the end token.
#[test]
fn caller_eos_and_ignore_eos() {
    let greedy = ["--temperature", "0", "--max-new-tokens", "8"];
    let Some(plain) = tokens(&greedy) else {
        return;
    };
    assert_eq!(
        plain.len(),
        8,
        "the tiny model runs to the limit: {plain:?}"
    );
    let end = plain[2].to_string();
    let mut with_eos = greedy.to_vec();
    with_eos.extend(["--eos_token_id", &end]);
    let stopped = tokens(&with_eos).unwrap();
    let first = plain.iter().position(|&t| t == plain[2]).unwrap();
    assert!(
        stopped.len() <= first + 1 && plain.starts_with(&stopped[..first.min(stopped.len())]),
        "stopped at the caller's end token {end}: {stopped:?} vs {plain:?}"
    );
    with_eos.push("--ignore-eos");
    assert_eq!(tokens(&with_eos).unwrap(), plain);
    let (code, _, err) = emberlm(&[
        "generate",
        "--model",
        MODEL,
        "--prompt",
        "x",
        "--eos-token-id",
        "999999",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("eos_token_id"), "{err}");
}

/// `--no-kv-cache` recomputes the whole sequence at every token and gives the cached run's
/// tokens (greedy, and seeded sampling over two sequences), on a Llama and a GPT-2; beam
/// search without the cache is refused by name.
#[test]
fn no_kv_cache_gives_the_cached_tokens() {
    for model in [MODEL, "tests/fixtures/tiny-gpt2-f16.gguf"] {
        let run = |extra: &[&str]| {
            let mut args = vec![
                "generate",
                "--model",
                model,
                "--prompt",
                "The software",
                "--json",
                "--max-new-tokens",
                "10",
            ];
            args.extend_from_slice(extra);
            let (code, out, err) = emberlm(&args);
            if require::cli_found_no_gpu(&err) {
                return None;
            }
            assert_eq!(code, 0, "{model} {extra:?}: {err}");
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            Some(v["sequences"].clone())
        };
        for flags in [
            &["--temperature", "0"][..],
            &[
                "--temperature",
                "0.9",
                "--seed",
                "4",
                "--num-return-sequences",
                "2",
            ][..],
        ] {
            let Some(cached) = run(flags) else {
                return;
            };
            let mut without = flags.to_vec();
            without.push("--no-kv-cache");
            let recomputed = run(&without).unwrap();
            let ids = |v: &serde_json::Value| -> Vec<serde_json::Value> {
                v.as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s["tokens"].clone())
                    .collect()
            };
            assert_eq!(ids(&cached), ids(&recomputed), "{model} {flags:?}");
        }
    }
    let (code, _, err) = emberlm(&[
        "generate",
        "--model",
        MODEL,
        "--prompt",
        "x",
        "--no-kv-cache",
        "--num-beams",
        "2",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("use_cache"), "{err}");
}

/// `--echo`: the text and the stream start with the prompt; the tokens stay the generated
/// ones.
#[test]
fn echo_puts_the_prompt_first() {
    let run = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            MODEL,
            "--prompt",
            "The software",
            "--temperature",
            "0",
            "--max-new-tokens",
            "5",
        ];
        args.extend_from_slice(extra);
        emberlm(&args)
    };
    let (code, out, err) = run(&["--json"]);
    if require::cli_found_no_gpu(&err) {
        return;
    }
    assert_eq!(code, 0, "{err}");
    let plain: serde_json::Value = serde_json::from_str(&out).unwrap();
    let (code, out, err) = run(&["--json", "--echo"]);
    assert_eq!(code, 0, "{err}");
    let echoed: serde_json::Value = serde_json::from_str(&out).unwrap();
    let (p, e) = (&plain["sequences"][0], &echoed["sequences"][0]);
    assert_eq!(p["tokens"], e["tokens"]);
    assert_eq!(
        e["text"].as_str().unwrap(),
        format!("The software{}", p["text"].as_str().unwrap())
    );
    let (code, out, err) = run(&["--stream", "--echo"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("The software"), "{out}");
    let (code, _, err) = emberlm(&["chat", "--model", MODEL, "--echo"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--echo"), "{err}");
}

/// With no sampling flags, `generate` samples with the `balanced` preset (temperature 0.8,
/// top-k 50, top-p 0.9) for up to 100 tokens: the same tokens as those flags spelled out, and
/// not those of the whole distribution at temperature 1.
#[test]
fn the_defaults_are_the_balanced_preset_and_100_tokens() {
    let Some(defaults) = tokens(&["--seed", "3", "--ignore-eos"]) else {
        return;
    };
    assert_eq!(defaults.len(), 100);
    let balanced = ["--preset", "balanced", "--max-new-tokens", "100"];
    let spelled = [
        "--temperature",
        "0.8",
        "--top-k",
        "50",
        "--top-p",
        "0.9",
        "--max-new-tokens",
        "100",
    ];
    for flags in [&balanced[..], &spelled[..]] {
        let mut args = vec!["--seed", "3", "--ignore-eos"];
        args.extend_from_slice(flags);
        assert_eq!(tokens(&args).unwrap(), defaults, "{flags:?}");
    }
    let whole = tokens(&[
        "--seed",
        "3",
        "--ignore-eos",
        "--temperature",
        "1",
        "--top-k",
        "0",
        "--top-p",
        "1",
    ])
    .unwrap();
    assert_ne!(whole, defaults);
}
