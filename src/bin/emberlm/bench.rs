//! `emberlm bench`: load time, prefill and decode speed, time to first token, GPU memory, the
//! engine counters per token and per chunk, copy bandwidth and decode efficiency, KV cache on
//! vs off, and llama.cpp (through llama-cpp-python) side by side on the same model file.
//! Prints a table and writes JSON (bench/NOTES.md says what each figure means and records
//! the runs).

use std::path::Path;
use std::time::Instant;

use emberlm::backend::gpu::ops::copy_bandwidth;
use emberlm::backend::gpu::Forward;
use emberlm::backend::gpu::{Counters, CountersPer, KernelCache};
use emberlm::loader::ModelFiles;
use emberlm::session::{Prompt, Session};
use emberlm::GpuContext;
use serde_json::{json, Value};

pub use crate::bench_common::BenchArgs;
use crate::bench_common::{fail, greedy_forever, llama_cpp_once, prompt_tokens, sanitize, Spread};
use crate::{CliResult, Failure};

/// One generation from a fresh KV cache; returns its stats and the counters it moved.
fn run_once(
    session: &mut Session,
    prompt: &[u32],
    max_new: usize,
) -> CliResult<(emberlm::session::Stats, Counters)> {
    session.reset();
    let before = gpu_of(session)?.counters();
    let opts = greedy_forever(session, max_new);
    let g =
        pollster::block_on(session.generate(&Prompt::Tokens(prompt.to_vec()), &opts, &mut |_| {}))?;
    Ok((g.stats, gpu_of(session)?.counters().since(&before)))
}

/// The bench's session's GPU (it loads every model on one).
fn gpu_of(session: &Session) -> CliResult<&GpuContext> {
    session
        .gpu()
        .ok_or_else(|| fail("the bench measures the GPU backend; this session runs on the CPU"))
}

fn mib(bytes: f64) -> f64 {
    bytes / (1024.0 * 1024.0)
}

/// Runs the benchmark and prints the table; writes the JSON.
pub fn bench(mut args: BenchArgs) -> CliResult<()> {
    if args.quick {
        args.prefill = vec![16, 32];
        args.decode = 8;
        args.kv_tokens.get_or_insert_with(|| vec![4, 8]);
        args.kv_positions = vec![64, 128];
        args.kv_steps = 2;
        args.kv_lengths = vec![16, 32];
    }
    if args.prefill.is_empty() || args.prefill.contains(&0) || args.decode < 2 || args.runs == 0 {
        return Err(Failure::usage(
            "--prefill lengths must be ≥ 1, --decode ≥ 2 and --runs ≥ 1",
        ));
    }
    let model = crate::cli::model_path(args.model.clone()).map_err(Failure::usage)?;
    if args.batch_only {
        return crate::bench_batch::only(&model, args.quick);
    }
    if args.kv_compare {
        let bench = crate::bench_kv_length::KvLengthBench {
            lengths: &args.kv_lengths,
            steps: args.kv_steps.max(1),
            runs: args.runs,
            llama_cpp_python: args.llama_cpp_python.as_deref(),
        };
        return crate::bench_kv_length::only(&model, &bench, args.out.clone());
    }
    if crate::cli::gpu_options().device == emberlm::backend::gpu::DeviceChoice::Cpu {
        if args.kv_kinds_only {
            return Err(Failure::usage(
                "--kv-kinds-only measures the GPU's KV-cache kinds; on the CPU backend the \
                 automatic KV plan (`--kv-cache auto`) measures them",
            ));
        }
        return crate::bench_cpu::bench(&args, &model);
    }
    if args.kv_kinds_only {
        let kinds = crate::bench_kv::KvKindsBench {
            positions: &args.kv_positions,
            steps: args.kv_steps.max(1),
            budget_mb: args.kv_budget_mb,
        };
        return crate::bench_kv::only(&model, &kinds);
    }
    let mut notes: Vec<String> = Vec::new();
    let longest = args.prefill.iter().copied().max().unwrap_or(1);
    let context = longest.max(args.prefill[0] + args.decode) + 8;

    // Load (the first load also opens the adapter; later ones reuse nothing but the OS cache).
    let mut load_s = Vec::new();
    let mut session = None;
    for _ in 0..args.runs {
        drop(session.take());
        let start = Instant::now();
        let files = ModelFiles::open(&model)?;
        let ctx = pollster::block_on(GpuContext::new(crate::cli::gpu_options()))?;
        let s = pollster::block_on(Session::new(ctx, &files, Some(context)))?;
        load_s.push(start.elapsed().as_secs_f64());
        session = Some(s);
    }
    let mut session = session.ok_or_else(|| fail("no session"))?;
    let adapter = gpu_of(&session)?.report().clone();
    eprintln!("bench: {} on {adapter}", model.display());

    let files = ModelFiles::open(&model)?;
    let weights = files.weights()?;
    let model_weight_bytes: u64 = weights.tensors.values().map(|t| t.data.len() as u64).sum();
    let config = weights.config.clone();
    let memory = session.forward().memory();
    let nodes = session.forward().node_count();
    let chunk = session.forward().chunk();

    let prompts: Vec<Vec<u32>> = args
        .prefill
        .iter()
        .map(|&n| prompt_tokens(&session, n))
        .collect::<CliResult<_>>()?;
    let decode_prompt = prompts[0].clone();

    let llama_python = args.llama_cpp_python.clone().filter(|p| p.exists());
    let mut llama_error = match (&args.llama_cpp_python, &llama_python) {
        (None, _) => Some("not asked for (--llama-cpp-python)".to_string()),
        (Some(p), None) => Some(format!("{} does not exist", p.display())),
        _ => None,
    };
    let mut llama_runs: Vec<Value> = Vec::new();

    // Alternating runs: ours, then llama.cpp, `runs` times.
    let mut prefill_tps: Vec<Vec<f64>> = vec![Vec::new(); prompts.len()];
    let mut decode_tps = Vec::new();
    let mut ttft_ms = Vec::new();
    let mut chunk_counters = Vec::new();
    let mut token_counters = Vec::new();
    for run in 0..args.runs {
        eprintln!("bench: run {} of {}", run + 1, args.runs);
        for (i, p) in prompts.iter().enumerate() {
            let (stats, c) = run_once(&mut session, p, 1)?;
            prefill_tps[i].push(p.len() as f64 / (stats.prefill_ms / 1000.0));
            if i == 0 {
                chunk_counters.push(c);
            }
        }
        let (stats, total) = run_once(&mut session, &decode_prompt, args.decode)?;
        decode_tps.push(stats.decode_tok_per_s);
        ttft_ms.push(stats.time_to_first_token_ms);
        if let Some(prefill) = chunk_counters.last() {
            token_counters.push(total.since(prefill));
        }
        if let Some(python) = &llama_python {
            if llama_error.is_none() {
                match llama_cpp_once(python, &model, &prompts, &decode_prompt, args.decode, None) {
                    Ok(v) => llama_runs.push(v),
                    Err(e) => llama_error = Some(e),
                }
            }
        }
    }
    let per_chunk = chunk_counters
        .last()
        .map(|c| c.per(c.forward_steps))
        .unwrap_or_default();
    let per_token: CountersPer = token_counters
        .last()
        .map(|c| c.per(c.forward_steps))
        .unwrap_or_default();

    // Bandwidth and efficiency.
    let cache = KernelCache::new();
    let bw = pollster::block_on(copy_bandwidth(
        gpu_of(&session)?,
        &cache,
        args.copy_mib << 20,
        8,
    ))?;
    let decode = Spread::of(&decode_tps);
    let avg_pos = (decode_prompt.len() + args.decode / 2) as f64;
    let kv_bytes_per_token = 2.0 * config.n_layers as f64 * avg_pos * config.kv_dim() as f64 * 4.0;
    let bytes_per_token = per_token.weight_bytes_bound + kv_bytes_per_token;
    let efficiency = bytes_per_token * decode.median / bw.bytes_per_s;

    // KV cache on vs off, on a Forward of its own.
    let kv_prompt = prompt_tokens(&session, 8)?;
    let kv_tokens = match args.kv_tokens.clone() {
        Some(t) => t,
        None => {
            // Estimate: decode steps cost 1/decode speed; a recomputation of p tokens costs
            // p / prefill speed.
            let pre = Spread::of(&prefill_tps[0]).median.max(1e-9);
            let dec = decode.median.max(1e-9);
            let cost = |n: usize| {
                let off: f64 = (0..n).map(|i| (kv_prompt.len() + i + 1) as f64 / pre).sum();
                n as f64 / dec + off
            };
            let mut want = vec![128usize, 256, 512];
            while want.iter().map(|&n| cost(n)).sum::<f64>() > args.kv_budget_s && want[0] > 2 {
                want = want.iter().map(|n| n / 2).collect();
            }
            if want[0] != 128 {
                notes.push(format!(
                    "KV on/off measured at {want:?} generated tokens instead of 128/256/512: the estimate at full size passed {} s (pass --kv-tokens 128,256,512 to force)",
                    args.kv_budget_s
                ));
            }
            want
        }
    };
    drop(session);
    let ctx = pollster::block_on(GpuContext::new(crate::cli::gpu_options()))?;
    let kv_context = kv_prompt.len() + kv_tokens.iter().copied().max().unwrap_or(0) + 1;
    let mut fwd = pollster::block_on(Forward::new(
        &ctx,
        &cache,
        &weights,
        kv_context.min(config.context_length),
        chunk,
    ))?;
    let mut kv_rows = Vec::new();
    for &n in &kv_tokens {
        if kv_prompt.len() + n + 1 > fwd.kv().context() {
            notes.push(format!(
                "KV on/off at {n} tokens skipped: past the model's context"
            ));
            continue;
        }
        eprintln!("bench: KV on/off at {n} tokens");
        let on = crate::bench_kv::kv_run(&ctx, &mut fwd, &kv_prompt, n, true)?;
        let off = crate::bench_kv::kv_run(&ctx, &mut fwd, &kv_prompt, n, false)?;
        kv_rows.push(json!({ "tokens": n, "kv_on_s": on, "kv_off_s": off, "speedup": off / on }));
    }
    let (kv_kinds, kv_kind_lines, kv_kind_notes) = crate::bench_kv::KvKindsBench {
        positions: &args.kv_positions,
        steps: args.kv_steps.max(1),
        budget_mb: args.kv_budget_mb,
    }
    .run(&ctx, &cache, &mut fwd)?;
    notes.extend(kv_kind_notes);
    drop(fwd);
    let (batched, batch_lines) = crate::bench_batch::BatchBench {
        steps: if args.quick { 3 } else { 8 },
        position: 64,
    }
    .run(&ctx, &cache, &weights)?;
    let (precision, precision_lines) = crate::bench_precision::PrecisionBench {
        tokens: &prompts[0],
        decode_steps: args.decode.min(32),
    }
    .run(&weights, &crate::cli::gpu_options())?;
    let spec = crate::bench_spec::SpecBench {
        max_new_tokens: if args.quick { 24 } else { 64 },
    };
    let (speculative, spec_lines) = spec.run(&model, Path::new("tests/fixtures"))?;

    // llama.cpp figures and ratios.
    let llama = if llama_runs.is_empty() {
        json!({ "available": false, "reason": llama_error.clone().unwrap_or_default() })
    } else {
        let pick = |f: &dyn Fn(&Value) -> Option<f64>| -> Vec<f64> {
            llama_runs.iter().filter_map(f).collect()
        };
        let prefill: Vec<Spread> = (0..prompts.len())
            .map(|i| Spread::of(&pick(&|v| v["prefill_tok_s"][i].as_f64())))
            .collect();
        let decode_l = Spread::of(&pick(&|v| v["decode_tok_s"].as_f64()));
        json!({
            "available": true,
            "version": llama_runs[0]["version"],
            "load_s": Spread::of(&pick(&|v| v["load_s"].as_f64())),
            "prefill_tok_s": prefill,
            "decode_tok_s": decode_l,
            "ratio_prefill_ours_over_theirs": prefill.iter().zip(&prefill_tps)
                .map(|(t, o)| Spread::of(o).median / t.median).collect::<Vec<_>>(),
            "ratio_decode_ours_over_theirs": decode.median / decode_l.median,
            "error_after_some_runs": llama_error,
        })
    };

    let load = Spread::of(&load_s);
    let ttft = Spread::of(&ttft_ms);
    let result = json!({
        "date": chrono::Local::now().to_rfc3339(),
        "adapter": adapter,
        "model": model.display().to_string(),
        "model_weight_bytes": model_weight_bytes,
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
        "settings": {
            "prefill": args.prefill, "decode": args.decode, "runs": args.runs,
            "context": context, "chunk": chunk, "quick": args.quick,
        },
        "load_s": load,
        "prefill_tok_s": args.prefill.iter().zip(&prefill_tps)
            .map(|(n, v)| json!({ "tokens": n, "tok_s": Spread::of(v) })).collect::<Vec<_>>(),
        "decode_tok_s": decode,
        "ttft_ms": ttft,
        "memory": memory,
        "graph_nodes": nodes,
        "layers": config.n_layers,
        "counters_per_decode_token": per_token,
        "counters_per_prefill_chunk": per_chunk,
        "weight_bytes_bound_per_token_over_model_weight_bytes":
            per_token.weight_bytes_bound / model_weight_bytes as f64,
        "copy_bandwidth": bw,
        "decode_bytes_read_per_token": bytes_per_token,
        "decode_efficiency": efficiency,
        "kv_cache": kv_rows,
        "kv_kinds": kv_kinds,
        "precision": precision,
        "speculative": speculative,
        "batched": batched,
        "llama_cpp": llama,
        "notes": notes,
    });

    // The table.
    println!("emberlm bench — {} — {}", model.display(), adapter);
    println!(
        "build {}, runs {}, context {context}, chunk {chunk}",
        result["build"].as_str().unwrap_or(""),
        args.runs
    );
    println!("{:<44}{load}", "load (s)");
    for (n, v) in args.prefill.iter().zip(&prefill_tps) {
        println!(
            "{:<44}{}",
            format!("prefill {n} tokens (tok/s)"),
            Spread::of(v)
        );
    }
    println!(
        "{:<44}{decode}",
        format!("decode {} tokens greedy (tok/s)", args.decode)
    );
    println!(
        "{:<44}{ttft}",
        format!(
            "time to first token, {}-token prompt (ms)",
            decode_prompt.len()
        )
    );
    println!(
        "GPU memory: weights {:.1} MiB, KV {:.1} MiB, activations {:.1} MiB (total {:.1} MiB)",
        mib(memory.weights as f64),
        mib(memory.kv_cache as f64),
        mib(memory.activations as f64),
        mib(memory.total() as f64)
    );
    for (what, c) in [("decode token", per_token), ("prefill chunk", per_chunk)] {
        println!(
            "per {what:<14}: {:.1} dispatches ({} nodes, {} layers), {:.1} passes, {:.1} command buffers, {:.1} submits, {:.1} readbacks ({:.0} B), {:.1} buffers / {:.1} bind groups / {:.1} pipelines created",
            c.dispatches, nodes, config.n_layers, c.compute_passes, c.command_buffers, c.submits,
            c.readback_waits, c.readback_bytes, c.buffers_created, c.bind_groups_created,
            c.pipelines_created
        );
    }
    println!(
        "weight bytes bound per token: {:.1} MiB of the model's {:.1} MiB ({:.2}×)",
        mib(per_token.weight_bytes_bound),
        mib(model_weight_bytes as f64),
        per_token.weight_bytes_bound / model_weight_bytes as f64
    );
    println!(
        "copy bandwidth: {:.2} GB/s ({} MiB × {}); decode reads {:.1} MiB/token → efficiency {:.1}%",
        bw.bytes_per_s / 1e9,
        bw.buffer_bytes >> 20,
        bw.copies,
        mib(bytes_per_token),
        efficiency * 100.0
    );
    for row in &kv_rows {
        let f = |k: &str| row[k].as_f64().unwrap_or(0.0);
        println!(
            "KV cache at {:>4} generated tokens: on {:.2} s, off {:.2} s → {:.1}× faster with it",
            row["tokens"],
            f("kv_on_s"),
            f("kv_off_s"),
            f("speedup")
        );
    }
    for line in kv_kind_lines
        .iter()
        .chain(&precision_lines)
        .chain(&batch_lines)
        .chain(&spec_lines)
    {
        println!("{line}");
    }
    if llama["available"].as_bool() == Some(true) {
        println!(
            "llama.cpp {} (CPU, same GGUF, same tokens):",
            llama["version"]
        );
        for (i, n) in args.prefill.iter().enumerate() {
            println!(
                "  prefill {n}: {:.2} tok/s → ours/theirs {:.3}",
                llama["prefill_tok_s"][i]["median"].as_f64().unwrap_or(0.0),
                llama["ratio_prefill_ours_over_theirs"][i]
                    .as_f64()
                    .unwrap_or(0.0)
            );
        }
        println!(
            "  decode: {:.2} tok/s → ours/theirs {:.3}",
            llama["decode_tok_s"]["median"].as_f64().unwrap_or(0.0),
            llama["ratio_decode_ours_over_theirs"]
                .as_f64()
                .unwrap_or(0.0)
        );
    } else {
        println!(
            "llama.cpp: NOT RUN — {}",
            llama["reason"].as_str().unwrap_or("unknown")
        );
    }
    for n in &notes {
        println!("note: {n}");
    }

    let out = match args.out {
        Some(p) => p,
        None => crate::bench_common::fresh_result_path(&format!(
            "{}-{}",
            chrono::Local::now().format("%Y-%m-%d"),
            sanitize(&adapter.name)
        )),
    };
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    std::fs::write(&out, serde_json::to_string_pretty(&result).map_err(fail)?).map_err(fail)?;
    println!("JSON: {}", out.display());
    Ok(())
}
