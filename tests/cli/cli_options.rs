//! The load options on the command line: the global flags and a `--config` file in the page's
//! spellings are one set, read and checked once (`src/engine/load_options.rs`).

#![cfg(not(target_arch = "wasm32"))]

use crate::cli_run::emberlm;

/// The load options are one set on every surface: the flags, and a `--config` file in the
/// page's spellings (the requirements' names too) under them; an unknown key, a setting of the
/// automatic plan without `auto` and a context over a fixed kind's budget are usage errors
/// naming what was written.
#[test]
fn load_options_from_flags_and_a_config_file_are_checked_once() {
    let model = "tests/fixtures/tiny-llama-q4_1.gguf";
    let dir = std::env::temp_dir().join(format!("emberlm-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.to_string_lossy().into_owned()
    };
    let memory = |args: &[&str]| {
        let mut all = vec!["info", "--model", model, "--json"];
        all.extend_from_slice(args);
        let (code, out, err) = emberlm(&all);
        assert_eq!(code, 0, "{args:?}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["memory"].clone()
    };
    let config = write(
        "q8.json",
        r#"{ "cache_kind": "q8", "max_seq_len": 64, "decode_plan": "auto" }"#,
    );
    let m = memory(&["--config", &config]);
    assert_eq!(m["kv_kinds"], "q8_0", "{m}");
    assert_eq!(m["context"], 64, "{m}");
    // a flag wins over the file
    let m = memory(&["--config", &config, "--kv-cache", "fp16", "--ctx", "32"]);
    assert_eq!(m["kv_kinds"], "f16", "{m}");
    assert_eq!(m["context"], 32, "{m}");
    let refused = |args: &[&str], wanted: &[&str]| {
        let mut all = vec!["info", "--model", model];
        all.extend_from_slice(args);
        let (code, _, err) = emberlm(&all);
        assert_eq!(code, 2, "{args:?}: {err}");
        for w in wanted {
            assert!(err.contains(w), "{args:?}: {err}");
        }
    };
    let typo = write("typo.json", r#"{ "kvCahce": "q8_0" }"#);
    refused(
        &["--config", &typo],
        &["typo.json", "`kvCahce`", "`kvCache`"],
    );
    refused(
        &["--kv-cache", "q8", "--cache-quality-prompt-len", "8"],
        &["--cache-quality-prompt-len", "--kv-cache auto"],
    );
    refused(
        &["--kv-cache", "auto", "--k-cache", "f16"],
        &["--k-cache", "cannot be combined"],
    );
    let page_only = write("page.json", r#"{ "cache": "emberlm-models-v1" }"#);
    refused(&["--config", &page_only], &["`cache`", "page"]);
    refused(
        &["--config", "tests/fixtures/no-such-config.json"],
        &["no-such-config.json"],
    );
    // a fixed kind with a budget: the context must fit it (tiny-llama: 512 bytes per position
    // in f32, so 0.01 MiB holds 20)
    for (ctx, fits) in [("64", false), ("16", true)] {
        let (code, _, err) = emberlm(&[
            "--device",
            "cpu",
            "--cache-budget-mb",
            "0.01",
            "generate",
            "--model",
            model,
            "--ctx",
            ctx,
            "--prompt",
            "Hello",
            "--max-new-tokens",
            "2",
        ]);
        if fits {
            assert_eq!(code, 0, "--ctx {ctx}: {err}");
        } else {
            assert_eq!(code, 2, "--ctx {ctx}: {err}");
            assert!(
                err.contains("cacheBudgetMb") && err.contains("at most 20 positions"),
                "{err}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--device cpu bench` measures the CPU backend (it refused: "this needs a GPU device"):
/// load, prefill and decode figures, the instruction set and threads, JSON where `--out` says,
/// the saved-conversation and embeddings sections, and llama.cpp reported as not run with the
/// reason when it was not asked for.
#[test]
fn bench_runs_on_the_cpu_backend() {
    let out = std::env::temp_dir().join(format!("emberlm-cpu-bench-{}.json", std::process::id()));
    let out_arg = out.to_string_lossy().into_owned();
    let (code, stdout, err) = emberlm(&[
        "--device",
        "cpu",
        "bench",
        "--model",
        "tests/fixtures/tiny-llama-q4_1.gguf",
        "--prefill",
        "8,16",
        "--decode",
        "4",
        "--runs",
        "1",
        "--out",
        &out_arg,
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        stdout.contains("CPU backend") && stdout.contains("llama.cpp: NOT RUN"),
        "{stdout}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let _ = std::fs::remove_file(&out);
    assert_eq!(v["backend"], "cpu", "{v}");
    assert_eq!(v["precision"], "int8", "{v}");
    // the saved-conversation section, scaled to the tiny model's context of 128
    let saved = &v["saved_conversation"];
    assert_eq!(saved["conversation_tokens"], 104, "{v}");
    assert!(saved["speedup"].as_f64().unwrap() > 0.0, "{v}");
    assert!(
        err.contains("the saved conversation is 104 tokens, not 1000"),
        "{err}"
    );
    // the embeddings section: 64 texts by default, llama.cpp's side not asked for
    let embedded = &v["embeddings"];
    assert_eq!(embedded["texts"], 64, "{v}");
    assert!(embedded["tokens"].as_u64() > Some(64 * 20), "{v}");
    assert!(
        embedded["texts_per_s"]["median"]
            .as_f64()
            .is_some_and(|t| t > 0.0),
        "{v}"
    );
    assert_eq!(embedded["llama_cpp"]["available"], false, "{v}");
    assert!(stdout.contains("embed 64 texts"), "{stdout}");
    assert!(v["threads"].as_u64().is_some_and(|t| t >= 1), "{v}");
    assert!(v["instruction_set"].is_string(), "{v}");
    for p in v["prefill_tok_s"].as_array().unwrap() {
        assert!(
            p["tok_s"]["median"].as_f64().is_some_and(|t| t > 0.0),
            "{v}"
        );
    }
    assert!(
        v["decode_tok_s"]["median"]
            .as_f64()
            .is_some_and(|t| t > 0.0),
        "{v}"
    );
    assert_eq!(v["llama_cpp"]["available"], false, "{v}");
    // `--precision f32` measures the exact products (it was ignored: 8-bit activations ran)
    let (code, _, err) = emberlm(&[
        "--device",
        "cpu",
        "--precision",
        "f32",
        "bench",
        "--model",
        "tests/fixtures/tiny-llama-q4_1.gguf",
        "--prefill",
        "8",
        "--decode",
        "2",
        "--runs",
        "1",
        "--embed-texts",
        "1",
        "--out",
        &out_arg,
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("f32 products"), "{err}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let _ = std::fs::remove_file(&out);
    assert_eq!(v["precision"], "f32", "{v}");
    // the GPU-only section says why it does not run here
    let (code, _, err) = emberlm(&[
        "--device",
        "cpu",
        "bench",
        "--model",
        "tests/fixtures/tiny-llama-q4_1.gguf",
        "--kv-kinds-only",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--kv-kinds-only"), "{err}");
}
