//! The `emberlm` binary, driven as a user would: output shape, exit codes, messages.

#![cfg(not(target_arch = "wasm32"))]

use crate::cli_run;
use crate::common::require;

use cli_run::emberlm;

#[test]
fn info_json_describes_gguf_and_hf_alike() {
    for model in [
        "tests/fixtures/tiny-llama-q4_1.gguf",
        "tests/fixtures/tiny-llama",
    ] {
        let (code, out, err) = emberlm(&["info", "--model", model, "--context", "100", "--json"]);
        assert_eq!(code, 0, "{model}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["config"]["arch"], "llama");
        assert_eq!(v["config"]["n_layers"], 2);
        assert_eq!(v["config"]["n_kv_heads"], 2);
        assert_eq!(v["memory"]["context"], 100);
        // K and V, 2 layers, 100 positions, kv_dim 32, f32
        assert_eq!(v["memory"]["kv_cache"], 2 * 2 * 100 * 32 * 4);
        let total = v["memory"]["total"].as_u64().unwrap();
        let parts: u64 = ["weights", "kv_cache", "activations"]
            .iter()
            .map(|k| v["memory"][k].as_u64().unwrap())
            .sum();
        assert_eq!(total, parts);
    }
    let (_, out, _) = emberlm(&[
        "info",
        "--model",
        "tests/fixtures/tiny-llama-q4_1.gguf",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["types"]["Q4_1"]["tensors"], 15);
    assert_eq!(v["types"]["Q8_0"]["tensors"], 1);
    assert_eq!(
        v["memory"]["context"], 128,
        "defaults to the model's context"
    );
}

/// An absurd context gives saturated figures, not an arithmetic overflow (a panic in a debug
/// build, a wrapped number in release) in the memory estimate.
#[test]
fn info_with_an_absurd_context_does_not_overflow() {
    let (code, out, err) = emberlm(&[
        "info",
        "--model",
        "tests/fixtures/tiny-llama-f32.gguf",
        "--context",
        &usize::MAX.to_string(),
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["memory"]["total"].as_u64(), Some(u64::MAX), "{out}");
}

#[test]
fn info_text_names_the_model() {
    let (code, out, _) = emberlm(&["info", "--model", "tests/fixtures/tiny-gpt2-f16.gguf"]);
    assert_eq!(code, 0);
    assert!(out.contains("architecture: gpt2"), "{out}");
    assert!(out.contains("F16"), "{out}");
}

/// `--device cpu info` describes the CPU backend's memory, not the GPU's bindings, selection
/// buffers or decode plan; without it the GPU's are described as before.
#[test]
fn info_describes_the_backend_the_device_names() {
    let model = "tests/fixtures/tiny-llama-q4_1.gguf";
    let (code, out, err) = emberlm(&["--device", "cpu", "info", "--model", model, "--batch", "2"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("CPU memory at context"), "{out}");
    for gpu_only in [
        "GPU memory",
        "bindings:",
        "decode plan:",
        "batch selections",
        "binding",
    ] {
        assert!(!out.contains(gpu_only), "`{gpu_only}` in {out}");
    }
    let (code, out, err) = emberlm(&["--device", "cpu", "info", "--model", model, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["backend"], "cpu", "{out}");
    assert!(
        v["bindings"].is_null() && v["decode_plan"].is_null(),
        "{out}"
    );
    assert_eq!(v["memory"]["batch_select"], 0, "{out}");
    let (code, out, err) = emberlm(&["info", "--model", model]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("GPU memory at context") && out.contains("decode plan:"),
        "{out}"
    );
}

/// The decode plan: `info` reports it at the context asked for, and inconsistent flags are
/// usage errors naming the flag.
#[test]
fn decode_plan_flags_are_reported_and_checked() {
    let model = "tests/fixtures/tiny-llama-q4_1.gguf";
    let (code, out, err) = emberlm(&["info", "--model", model, "--ctx", "100", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["decode_plan"]["settings"]["mode"], "auto");
    assert_eq!(v["decode_plan"]["settings"]["bucket_short"], 512);
    let (code, out, err) = emberlm(&[
        "info",
        "--model",
        model,
        "--ctx",
        "100",
        "--decode-plan",
        "fixed",
        "--decode-q-chunk",
        "16",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("decode plan:  fixed (whole up to 31 keys, 16-key blocks from 32 keys)"),
        "{out}"
    );
    for (args, names) in [
        (&["--decode-plan", "fixed"][..], "decode-q-chunk"),
        (&["--decode-plan", "sometimes"][..], "--decode-plan"),
        (&["--decode-q-chunk", "64"][..], "decode-q-chunk"),
        (
            &["--decode-plan", "none", "--decode-local-window", "8"][..],
            "decode-local-window",
        ),
        (&["--decode-bucket-short", "4096"][..], "decode-bucket"),
    ] {
        let mut all = vec!["info", "--model", model];
        all.extend_from_slice(args);
        let (code, _, err) = emberlm(&all);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(names), "{args:?}: {err}");
    }
}

/// `logits --precision f16` runs the input in f16 and in f32 and reports how they agree; a bad
/// precision is a usage error naming the flag. (Lavapipe has shader-f16; without it f16 is an
/// error naming the feature.)
#[test]
fn logits_in_f16_report_agreement_with_f32() {
    let (code, out, err) = emberlm(&[
        "--precision",
        "f16",
        "logits",
        "--model",
        "tests/fixtures/tiny-llama-q8_0.gguf",
        "--tokens",
        "1,5,9,13,2,7",
        "--top",
        "1",
    ]);
    if code == 1 && err.contains("shader-f16") {
        assert!(
            !require::gpu_required() || !err.contains("llvmpipe"),
            "{err}"
        );
        return;
    }
    if code == 1 && !require::gpu_required() {
        eprintln!("SKIPPED: no usable GPU: {err}");
        return;
    }
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["precision"], "f16");
    let a = &v["vs_f32"];
    assert_eq!(a["positions"], 6, "{a}");
    let diff = a["max_abs_diff"].as_f64().unwrap();
    assert!(diff > 0.0 && diff < 0.15, "{a}");
    assert!(a["top1_agreement"].as_f64().unwrap() >= 0.8, "{a}");
    let (code, _, err) = emberlm(&[
        "--precision",
        "f8",
        "info",
        "--model",
        "tests/fixtures/tiny-llama-q8_0.gguf",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--precision"), "{err}");
}

/// `--device`: `gpu` runs on the adapter, a software one included (lavapipe here), `cpu` runs
/// generation on the CPU backend (`--backend` is the same flag) and says why a GPU command
/// cannot; a bad name is a usage error. (`auto`: `tests/gpu/backend_choice.rs`.)
#[test]
fn device_choice_is_checked() {
    let (code, out, err) = emberlm(&["--device", "gpu", "adapter", "--json"]);
    if !require::cli_found_no_gpu(&err) {
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert!(v["name"].as_str().is_some_and(|n| !n.is_empty()), "{out}");
    }
    let (code, _, err) = emberlm(&["--device", "cpu", "adapter"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("CPU backend") && err.contains("GPU device"),
        "{err}"
    );
    let mut texts = Vec::new();
    for flag in ["--device", "--backend"] {
        let (code, out, err) = emberlm(&[
            flag,
            "cpu",
            "generate",
            "--model",
            "tests/fixtures/tiny-llama-spm-f32.gguf",
            "--prompt",
            "The software is provided",
            "--temperature",
            "0",
            "--max-new-tokens",
            "6",
            "--json",
        ]);
        assert_eq!(code, 0, "{flag} cpu: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        texts.push(v["sequences"][0]["tokens"].clone());
    }
    assert_eq!(texts[0], texts[1]);
    assert_eq!(texts[0].as_array().map(Vec::len), Some(6), "{:?}", texts[0]);
    let (code, _, err) = emberlm(&["--device", "quantum", "adapter"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--device"), "{err}");
}

#[test]
fn errors_have_exit_codes_and_messages() {
    let (code, _, err) = emberlm(&["info", "--model", "tests/fixtures/does-not-exist.gguf"]);
    assert_eq!(code, 1);
    assert!(err.contains("does-not-exist.gguf"), "{err}");
    let (code, _, err) = emberlm(&["info", "--model", "tests/fixtures/README.md"]);
    assert_eq!(code, 1);
    assert!(err.contains("README.md"), "{err}");
    let (code, _, err) = emberlm(&["info", "--no-such-flag"]);
    assert_eq!(code, 2, "usage errors exit 2");
    assert!(err.contains("--no-such-flag"), "{err}");
    let (code, _, _) = emberlm(&["info", "--help"]);
    assert_eq!(code, 0);
}

#[test]
fn tokenize_reproduces_golden_prompt_tokens() {
    let golden: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/golden/tiny-llama-spm-f32.golden.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let result = &golden["results"][0];
    let prompt = result["prompt"].as_str().unwrap();
    for model in [
        "tests/fixtures/tiny-llama-spm-f32.gguf",
        "tests/fixtures/tiny-llama-spm",
    ] {
        let (code, out, err) = emberlm(&["tokenize", "--model", model, "--prompt", prompt]);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["tokens"], result["prompt_tokens"], "{model}");
        assert_eq!(
            v["tokens"].as_array().unwrap().len(),
            v["pieces"].as_array().unwrap().len()
        );
    }
    let (code, out, _) = emberlm(&[
        "info",
        "--model",
        "tests/fixtures/tiny-llama-spm-f32.gguf",
        "--json",
    ]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["tokenizer"]["vocab_size"], 600);
    assert_eq!(v["tokenizer"]["bos_id"], 1);
    assert_eq!(v["chat_template"], false);
}

#[test]
fn logits_match_the_golden_top5_in_prefill_and_decode() {
    let golden: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/golden/tiny-llama-q8_0.golden.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let r = &golden["results"][0];
    let prompt = r["prompt"].as_str().unwrap();
    let n = r["prompt_tokens"].as_array().unwrap().len();
    let want = &r["f64_greedy_path_top5"][0];
    // the adapter, then the CPU backend through the same engine, in prefill and decode, and
    // the CPU's exact f32 products (`--precision f32`), which answer as the GPU does
    for (backend, decode) in [
        ("gpu", false),
        ("gpu", true),
        ("cpu", false),
        ("cpu", true),
        ("cpu-f32", false),
        ("cpu-f32", true),
    ] {
        let (device, exact) = (&backend[..3], backend.ends_with("f32"));
        let mut args = vec!["--device", device];
        if exact {
            args.extend(["--precision", "f32"]);
        }
        args.extend([
            "logits",
            "--model",
            "tests/fixtures/tiny-llama-q8_0.gguf",
            "--prompt",
            prompt,
        ]);
        if decode {
            args.push("--decode");
        }
        let (code, out, err) = emberlm(&args);
        if code != 0 && device == "gpu" && require::cli_found_no_gpu(&err) {
            continue;
        }
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["tokens"], r["prompt_tokens"]);
        assert_eq!(v["backend"], device, "{v}");
        let gpu_like = device == "gpu" || exact;
        let precision = if gpu_like { "f32" } else { "int8" };
        assert_eq!(v["precision"], precision, "{v}");
        let positions = v["positions"].as_array().unwrap();
        assert_eq!(positions.len(), n);
        let last = positions[n - 1].as_array().unwrap();
        assert_eq!(last.len(), 5);
        assert_eq!(
            last[0][0], want[0][0],
            "{backend} decode={decode}: {last:?}"
        );
        // the GPU and the CPU's f32 products: the same five in order, within 2e-3 of f64; the
        // CPU's 8-bit activations: the same five (the 2nd and 3rd, 0.017 apart in f64, may
        // swap), within 0.1 (0.065 measured on this 64-wide random model)
        let tolerance = if gpu_like { 2e-3 } else { 0.1 };
        for (k, w) in want.as_array().unwrap().iter().enumerate() {
            let got = match gpu_like {
                true => Some(&last[k]),
                false => last.iter().find(|g| g[0] == w[0]),
            };
            let got =
                got.unwrap_or_else(|| panic!("{backend} decode={decode}: {w} not in {last:?}"));
            assert_eq!(got[0], w[0], "{backend} decode={decode}: {last:?}");
            let d = (got[1].as_f64().unwrap() - w[1].as_f64().unwrap()).abs();
            assert!(d <= tolerance, "{backend} decode={decode}: {got} vs {w}");
        }
    }
    let (code, _, err) = emberlm(&["logits", "--model", "tests/fixtures/tiny-llama-q8_0.gguf"]);
    assert_eq!(code, 2, "--prompt or --tokens is required: {err}");
    let (code, _, err) = emberlm(&[
        "logits",
        "--model",
        "tests/fixtures/tiny-llama-q8_0.gguf",
        "--tokens",
        "1,99999",
    ]);
    assert_eq!(
        code, 2,
        "a token id outside the vocabulary is a usage error"
    );
    assert!(err.contains("outside the vocabulary"), "{err}");
}

#[test]
fn subcommands_share_flags_and_help() {
    for sub in [
        "generate",
        "chat",
        "batch",
        "perplexity",
        "adapter",
        "tokenize",
        "logits",
        "info",
    ] {
        let (code, out, err) = emberlm(&[sub, "--help"]);
        assert_eq!(code, 0, "{sub}: {err}");
        assert!(out.contains("Usage: emberlm"), "{sub}: {out}");
        if sub != "adapter" {
            assert!(out.contains("--model"), "{sub}: {out}");
        }
        if !matches!(sub, "adapter" | "tokenize") {
            assert!(out.contains("--ctx"), "{sub}: {out}");
        }
    }
    // `info --ctx`, and `--context` as its alias.
    let model = "tests/fixtures/tiny-llama-q4_1.gguf";
    for flag in ["--ctx", "--context"] {
        let (code, out, err) = emberlm(&["info", "--model", model, flag, "64", "--json"]);
        assert_eq!(code, 0, "{flag}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["memory"]["context"], 64, "{flag}");
    }
    let (code, _, err) = emberlm(&["info", "--model", model, "--ctx", "0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--ctx"), "{err}");
    // `--json` is accepted where JSON is the only output.
    let (code, out, err) = emberlm(&["tokenize", "--model", model, "--prompt", "MIT", "--json"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        serde_json::from_str::<serde_json::Value>(&out).is_ok(),
        "{out}"
    );
}

/// A split GGUF set (`tests/fixtures/split/`) runs from its first part's path as the whole file
/// does, `info` counts its files, and a later part alone exits 1 naming the first.
#[test]
fn a_split_set_runs_from_its_first_part() {
    let first = "tests/fixtures/split/tiny-llama-q4_1-00001-of-00003.gguf";
    let tokens = |model: &str| {
        let (code, out, err) = emberlm(&[
            "generate",
            "--device",
            "cpu",
            "--model",
            model,
            "--prompt",
            "The software",
            "--temperature",
            "0",
            "--max-new-tokens",
            "8",
            "--json",
        ]);
        assert_eq!(code, 0, "{model}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["sequences"][0]["tokens"].clone()
    };
    assert_eq!(tokens(first), tokens("tests/fixtures/tiny-llama-q4_1.gguf"));
    let (code, out, err) = emberlm(&["info", "--model", first, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["files"], 3, "{v}");
    assert_eq!(v["tensors"], 21, "{v}");
    let (code, _, err) = emberlm(&[
        "info",
        "--model",
        "tests/fixtures/split/tiny-llama-q4_1-00002-of-00003.gguf",
    ]);
    assert_eq!(code, 1);
    assert!(
        err.contains("part 2 of a 3-part split GGUF set")
            && err.contains("tiny-llama-q4_1-00001-of-00003.gguf"),
        "{err}"
    );
}

#[test]
fn generate_json_has_the_documented_shape() {
    let (code, out, err) = emberlm(&[
        "generate",
        "--model",
        "tests/fixtures/tiny-llama-q4_1.gguf",
        "--prompt",
        "The software",
        "--temperature",
        "0",
        "--max-new-tokens",
        "6",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(!v["prompt_tokens"].as_array().unwrap().is_empty());
    let seq = &v["sequences"][0];
    assert!(seq["tokens"].as_array().unwrap().len() <= 6);
    assert!(seq["text"].is_string());
    assert!(["stop", "length"].contains(&seq["finish_reason"].as_str().unwrap()));
    for key in [
        "prompt_tokens",
        "generated_tokens",
        "prefill_ms",
        "decode_ms",
        "time_to_first_token_ms",
        "decode_tok_per_s",
    ] {
        assert!(v["stats"][key].is_number(), "stats.{key} in {out}");
    }
    // Plain output is the same text.
    let (code, plain, _) = emberlm(&[
        "generate",
        "--model",
        "tests/fixtures/tiny-llama-q4_1.gguf",
        "--prompt",
        "The software",
        "--temperature",
        "0",
        "--max-new-tokens",
        "6",
    ]);
    assert_eq!(code, 0);
    assert_eq!(plain.trim_end_matches('\n'), seq["text"].as_str().unwrap());
}

#[test]
fn generate_rejects_bad_parameters_naming_them() {
    for (flag, value, name) in [
        ("--top-p", "1.5", "top_p"),
        ("--temperature", "-1", "temperature"),
        ("--min-p", "2", "min_p"),
        ("--num-beams", "0", "num_beams"),
        ("--presence-penalty", "3", "presence_penalty"),
    ] {
        let (code, _, err) = emberlm(&[
            "generate",
            "--model",
            "tests/fixtures/tiny-llama-q4_1.gguf",
            "--prompt",
            "x",
            flag,
            value,
        ]);
        assert_eq!(code, 2, "{flag} {value}: {err}");
        assert!(err.contains(name), "{flag} {value}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
}

#[test]
fn perplexity_reports_tokens_nll_and_ppl() {
    let dir = std::env::temp_dir().join(format!("emberlm-ppl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("text.txt");
    std::fs::write(
        &file,
        "Permission is hereby granted, free of charge, to any person",
    )
    .unwrap();
    let (code, out, err) = emberlm(&[
        "perplexity",
        "--model",
        "tests/fixtures/tiny-gpt2-f32.gguf",
        "--file",
        file.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let (nll, ppl) = (v["nll"].as_f64().unwrap(), v["ppl"].as_f64().unwrap());
    assert!(v["tokens"].as_u64().unwrap() > 5);
    assert!(nll > 0.0 && (ppl - nll.exp()).abs() < 1e-6 * ppl);
    let (code, _, err) = emberlm(&[
        "perplexity",
        "--model",
        "tests/fixtures/tiny-gpt2-f32.gguf",
        "--file",
        "/nonexistent/text.txt",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent/text.txt"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
