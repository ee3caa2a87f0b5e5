//! `emberlm --device cpu bench`: the CPU backend's load time, prefill and decode speed and time
//! to first token on a model file, beside llama.cpp (llama-cpp-python) on the same file, the
//! same token ids and the same number of threads, in alternating runs (ours, theirs, ours, ...).
//! Prints a table and writes JSON. An encoder (BERT), which does not generate, is measured by its
//! embeddings section alone. The GPU bench's other sections (counters, copy bandwidth,
//! KV on/off, kinds, precision, speculative) measure the GPU and are not run; `--batch-only
//! --device cpu` measures batched decoding on the CPU.

use std::path::Path;
use std::time::Instant;

use emberlm::loader::ModelFiles;
use emberlm::session::{Prompt, Session, Stats};
use serde_json::{json, Value};

use crate::bench_common::BenchArgs;
use crate::bench_common::{fail, greedy_forever, llama_cpp_once, prompt_tokens, sanitize, Spread};
use crate::CliResult;

/// One greedy generation of `max_new` tokens from a fresh KV cache.
fn run_once(session: &mut Session, prompt: &[u32], max_new: usize) -> CliResult<Stats> {
    session.reset();
    let opts = greedy_forever(session, max_new);
    let prompt = Prompt::Tokens(prompt.to_vec());
    Ok(pollster::block_on(session.generate(&prompt, &opts, &mut |_| {}))?.stats)
}

/// The CPU bench: see the module documentation.
pub fn bench(args: &BenchArgs, model: &Path) -> CliResult<()> {
    let longest = args.prefill.iter().copied().max().unwrap_or(1);
    // the saved-conversation section's conversation, and its turn, within the model's context
    let config = ModelFiles::open(model)?.weights()?.config;
    let (trained, encoder) = (config.context_length, config.bidirectional);
    let asked = match args.quick {
        true => args.saved_tokens.min(32),
        false => args.saved_tokens,
    };
    let saved_tokens = match encoder {
        true => 0,
        false => asked.min(trained.saturating_sub(24)),
    };
    if saved_tokens < asked && !encoder {
        eprintln!(
            "bench: the saved conversation is {saved_tokens} tokens, not {asked}: the model's context is {trained}"
        );
    }
    let context = match encoder {
        // an encoder reads each text whole, up to its trained positions
        true => trained,
        false => {
            longest
                .max(args.prefill[0] + args.decode)
                .max(saved_tokens + 16)
                + 8
        }
    };
    if encoder {
        eprintln!(
            "bench: {} is an encoder (no LM head): only its embeddings are measured",
            model.display()
        );
    }
    let threads = emberlm::backend::cpu::threads();
    let isa = emberlm::backend::cpu::dot::instruction_set();
    let cpu = cpu_name();
    let precision = crate::cli::cpu_precision();
    eprintln!(
        "bench: {} on the CPU backend ({cpu}, {isa}, {threads} threads, {} products)",
        model.display(),
        precision.as_str()
    );

    let mut load_s = Vec::new();
    let mut session = None;
    for _ in 0..args.runs {
        drop(session.take());
        let start = Instant::now();
        let files = ModelFiles::open(model)?;
        let s = Session::new_cpu_with(&files, Some(context), precision)?;
        load_s.push(start.elapsed().as_secs_f64());
        session = Some(s);
    }
    let mut session = session.ok_or_else(|| fail("no session"))?;
    let prefill_lengths: &[usize] = match encoder {
        true => &[],
        false => &args.prefill,
    };
    let prompts: Vec<Vec<u32>> = prefill_lengths
        .iter()
        .map(|&n| prompt_tokens(&session, n))
        .collect::<CliResult<_>>()?;
    let decode_prompt = prompts.first().cloned().unwrap_or_default();

    let python = args.llama_cpp_python.clone().filter(|p| p.exists());
    let mut llama_error = match (&args.llama_cpp_python, &python) {
        _ if encoder => Some("an encoder does not generate (see the embeddings section)".into()),
        (None, _) => Some("not asked for (--llama-cpp-python)".to_string()),
        (Some(p), None) => Some(format!("{} does not exist", p.display())),
        _ => None,
    };
    let mut llama_runs: Vec<Value> = Vec::new();
    let mut prefill_tps: Vec<Vec<f64>> = vec![Vec::new(); prompts.len()];
    let (mut decode_tps, mut ttft_ms) = (Vec::new(), Vec::new());
    for run in 0..args.runs {
        if encoder {
            break;
        }
        eprintln!("bench: run {} of {}", run + 1, args.runs);
        for (i, p) in prompts.iter().enumerate() {
            let stats = run_once(&mut session, p, 1)?;
            prefill_tps[i].push(p.len() as f64 / (stats.prefill_ms / 1000.0));
        }
        let stats = run_once(&mut session, &decode_prompt, args.decode)?;
        decode_tps.push(stats.decode_tok_per_s);
        ttft_ms.push(stats.time_to_first_token_ms);
        if let (Some(py), None) = (&python, &llama_error) {
            match llama_cpp_once(
                py,
                model,
                &prompts,
                &decode_prompt,
                args.decode,
                Some(threads),
            ) {
                Ok(v) => llama_runs.push(v),
                Err(e) => llama_error = Some(e),
            }
        }
    }

    let saved = match saved_tokens {
        0 => Value::Null,
        n => crate::bench_saved::saved_conversation(&mut session, n, args.runs)?,
    };
    let embedded = match (args.embed_texts, args.quick) {
        (0, _) => Value::Null,
        (n, quick) => crate::bench_embed::embeddings(
            &mut session,
            model,
            if quick { n.min(8) } else { n },
            args.runs,
            python.as_deref(),
            threads,
        )?,
    };
    let decode = Spread::of(&decode_tps);
    let prefill: Vec<Spread> = prefill_tps.iter().map(|v| Spread::of(v)).collect();
    let llama = if llama_runs.is_empty() {
        json!({ "available": false, "reason": llama_error.clone().unwrap_or_default() })
    } else {
        let pick = |f: &dyn Fn(&Value) -> Option<f64>| -> Vec<f64> {
            llama_runs.iter().filter_map(f).collect()
        };
        let theirs: Vec<Spread> = (0..prompts.len())
            .map(|i| Spread::of(&pick(&|v| v["prefill_tok_s"][i].as_f64())))
            .collect();
        let theirs_decode = Spread::of(&pick(&|v| v["decode_tok_s"].as_f64()));
        json!({
            "available": true,
            "version": llama_runs[0]["version"],
            "threads": llama_runs[0]["threads"],
            "load_s": Spread::of(&pick(&|v| v["load_s"].as_f64())),
            "prefill_tok_s": theirs,
            "decode_tok_s": theirs_decode,
            "ratio_prefill_ours_over_theirs": prefill.iter().zip(&theirs)
                .map(|(o, t)| o.median / t.median).collect::<Vec<_>>(),
            "ratio_decode_ours_over_theirs": decode.median / theirs_decode.median,
            "error_after_some_runs": llama_error,
        })
    };
    let result = json!({
        "date": chrono::Local::now().to_rfc3339(),
        "backend": "cpu",
        "precision": precision.as_str(),
        "cpu": cpu,
        "instruction_set": isa,
        "threads": threads,
        "model": model.display().to_string(),
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
        "settings": {
            "prefill": prefill_lengths, "decode": args.decode, "runs": args.runs,
            "context": context, "quick": args.quick,
        },
        "encoder": encoder,
        "load_s": Spread::of(&load_s),
        "prefill_tok_s": prefill_lengths.iter().zip(&prefill)
            .map(|(n, s)| json!({ "tokens": n, "tok_s": s })).collect::<Vec<_>>(),
        "decode_tok_s": decode,
        "ttft_ms": Spread::of(&ttft_ms),
        "saved_conversation": saved,
        "embeddings": embedded,
        "llama_cpp": llama,
    });

    println!("emberlm bench — {} — CPU backend ({cpu})", model.display());
    println!(
        "build {}, {isa}, {threads} threads, runs {}, context {context}",
        result["build"].as_str().unwrap_or(""),
        args.runs
    );
    println!("{:<44}{}", "load (s)", Spread::of(&load_s));
    for (n, s) in prefill_lengths.iter().zip(&prefill) {
        println!("{:<44}{s}", format!("prefill {n} tokens (tok/s)"));
    }
    if !encoder {
        println!(
            "{:<44}{decode}",
            format!("decode {} tokens greedy (tok/s)", args.decode)
        );
        println!(
            "{:<44}{}",
            format!(
                "time to first token, {}-token prompt (ms)",
                decode_prompt.len()
            ),
            Spread::of(&ttft_ms)
        );
    }
    crate::bench_saved::print(&saved);
    crate::bench_embed::print(&embedded);
    if llama["available"] == true {
        let ratio = |v: &Value| v.as_f64().unwrap_or(0.0);
        println!(
            "llama.cpp {} ({} threads), same ids:",
            llama["version"].as_str().unwrap_or("?"),
            llama["threads"]
        );
        for (i, n) in prefill_lengths.iter().enumerate() {
            println!(
                "  prefill {n}: {:.2} tok/s → ours/theirs {:.3}",
                ratio(&llama["prefill_tok_s"][i]["median"]),
                ratio(&llama["ratio_prefill_ours_over_theirs"][i])
            );
        }
        println!(
            "  decode: {:.2} tok/s → ours/theirs {:.3}",
            ratio(&llama["decode_tok_s"]["median"]),
            ratio(&llama["ratio_decode_ours_over_theirs"])
        );
    } else {
        println!(
            "llama.cpp: NOT RUN — {}",
            llama["reason"].as_str().unwrap_or("unknown")
        );
    }
    let out = match &args.out {
        Some(p) => p.clone(),
        None => crate::bench_common::fresh_result_path(&format!(
            "{}-cpu-{}-{threads}t{}-{}",
            chrono::Local::now().format("%Y-%m-%d"),
            sanitize(&cpu),
            match precision {
                emberlm::backend::cpu::CpuPrecision::Int8 => "",
                // exact products: a file of their own beside the default's
                emberlm::backend::cpu::CpuPrecision::F32 => "-f32",
            },
            sanitize(
                &model
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default()
            )
        )),
    };
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    std::fs::write(&out, serde_json::to_string_pretty(&result).map_err(fail)?).map_err(fail)?;
    println!("JSON: {}", out.display());
    Ok(())
}

/// The CPU's model name (`/proc/cpuinfo` on Linux), or the architecture.
fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}
