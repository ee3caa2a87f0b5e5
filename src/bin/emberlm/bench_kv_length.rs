//! `emberlm bench --kv-compare`: what the KV cache is worth at length, on whichever backend runs
//! the model (`--device cpu` or the adapter). At each length N it times the two ways to get
//! the next token once N tokens are there:
//! - without a cache: the N tokens computed again (a prefill of N from an empty cache), whose
//!   cost grows with N for the matrix products and with N² for attention;
//! - with the cache: one decode step that reads N cached keys and values, whose cost is the
//!   weights' once and grows with N only through attention.
//!
//! The same prefill serves both (it is the recomputation's cost, and it fills the cache that
//! the decode steps then read), so each length costs one prefill and a few steps per run.
//! Token ids are synthetic (a fixed stride through the vocabulary): a step's cost depends on
//! how many positions it reads, not on which tokens they are.
//!
//! With `--llama-cpp-python`, llama.cpp times the same two ways on the same file, token ids and
//! number of threads (`tools/bench_llama_cpp_kv.py`), each of its runs right after ours.

use std::path::{Path, PathBuf};
use std::time::Instant;

use emberlm::backend::cpu::CpuForward;
use emberlm::backend::gpu::{DeviceChoice, GpuModel};
use emberlm::backend::{Backend, DEFAULT_CHUNK};
use emberlm::loader::ModelFiles;
use emberlm::GpuContext;
use serde_json::{json, Value};

use crate::bench_common::{fail, python_request, sanitize, Spread};
use crate::CliResult;

/// What the section measures.
pub struct KvLengthBench<'a> {
    /// Lengths N at which the next token is timed with and without the cache.
    pub lengths: &'a [usize],
    /// Decode steps timed per length and run (after one untimed step).
    pub steps: usize,
    /// Runs per length (medians, min and max).
    pub runs: usize,
    /// llama-cpp-python's interpreter, to time llama.cpp beside each run.
    pub llama_cpp_python: Option<&'a Path>,
}

/// llama.cpp's side of one length: the runs so far, or why there are none.
#[derive(Default)]
struct Peer {
    off: Vec<f64>,
    on: Vec<f64>,
    version: Option<String>,
    error: Option<String>,
}

impl Peer {
    /// One run at `tokens` on `model`, added to the others (the first failure ends the peer's
    /// runs and is reported).
    fn time(&mut self, python: &Path, model: &Path, tokens: &[u32], steps: usize) {
        if self.error.is_some() {
            return;
        }
        let request = json!({
            "model": model,
            "ids": tokens,
            "steps": steps,
            "threads": emberlm::backend::cpu::threads(),
        });
        match python_request(python, "tools/bench_llama_cpp_kv.py", &request) {
            Ok(v) => match (v["kv_off_ms"].as_f64(), v["kv_on_ms"].as_f64()) {
                (Some(off), Some(on)) => {
                    self.off.push(off);
                    self.on.push(on);
                    self.version = v["version"].as_str().map(str::to_string);
                }
                _ => self.error = Some(format!("llama.cpp output without timings: {v}")),
            },
            Err(e) => self.error = Some(e),
        }
    }
}

/// `n` synthetic token ids within `vocab`.
fn ids(n: usize, vocab: usize) -> Vec<u32> {
    let vocab = vocab.max(2) as u64;
    (0..n as u64)
        .map(|i| ((i * 7919 + 13) % (vocab - 1) + 1) as u32)
        .collect()
}

impl KvLengthBench<'_> {
    /// Times every length on `backend` (its cache is reset at each), and llama.cpp on `model`
    /// beside it when asked, and returns the JSON rows, the text lines and notes for lengths
    /// skipped or a peer that failed.
    pub fn run(
        &self,
        backend: &mut dyn Backend,
        model: &Path,
    ) -> CliResult<(Value, Vec<String>, Vec<String>)> {
        let vocab = backend.config().vocab_size;
        let (mut rows, mut lines, mut notes) = (Vec::new(), Vec::new(), Vec::new());
        for &n in self.lengths {
            if n == 0 || n + self.steps + 1 > backend.context() {
                notes.push(format!(
                    "KV at length {n} skipped: past the context of {} (the model's, or what was \
                     allocated)",
                    backend.context()
                ));
                continue;
            }
            let tokens = ids(n, vocab);
            let (mut off, mut on, mut peer) = (Vec::new(), Vec::new(), Peer::default());
            for run in 0..self.runs {
                eprintln!("bench: KV at length {n}, run {} of {}", run + 1, self.runs);
                backend.truncate(0)?;
                let start = Instant::now();
                pollster::block_on(backend.forward(&tokens, false))?;
                off.push(start.elapsed().as_secs_f64() * 1000.0);
                pollster::block_on(backend.forward(&[1], false))?;
                let start = Instant::now();
                for _ in 0..self.steps {
                    pollster::block_on(backend.forward(&[1], false))?;
                }
                on.push(start.elapsed().as_secs_f64() * 1000.0 / self.steps.max(1) as f64);
                if let Some(python) = self.llama_cpp_python {
                    peer.time(python, model, &tokens, self.steps);
                }
            }
            let (off, on) = (Spread::of(&off), Spread::of(&on));
            let speedup = off.median / on.median.max(1e-9);
            lines.push(format!(
                "KV at {n:>5} tokens: next token {:>9.2} ms with the cache, {:>10.1} ms without \
                 (recomputing {n}) → {speedup:.1}×",
                on.median, off.median
            ));
            let llama = match (self.llama_cpp_python, &peer.error) {
                (None, _) => json!({ "available": false, "reason": "not asked for" }),
                (Some(_), Some(e)) if peer.on.is_empty() => {
                    notes.push(format!("llama.cpp at length {n}: {e}"));
                    json!({ "available": false, "reason": e })
                }
                (Some(_), error) => {
                    let (t_off, t_on) = (Spread::of(&peer.off), Spread::of(&peer.on));
                    let theirs = t_off.median / t_on.median.max(1e-9);
                    // speed ratios: their time over ours (above 1: ours is faster)
                    lines.push(format!(
                        "      llama.cpp: next token {:>9.2} ms with the cache, {:>10.1} ms \
                         without → {theirs:.1}×; ours / theirs: {:.2}× with, {:.2}× without",
                        t_on.median,
                        t_off.median,
                        t_on.median / on.median.max(1e-9),
                        t_off.median / off.median.max(1e-9),
                    ));
                    json!({
                        "available": true,
                        "version": peer.version,
                        "kv_on_ms_per_token": t_on,
                        "kv_off_ms_per_token": t_off,
                        "speedup": theirs,
                        "ours_over_theirs_with_cache": t_on.median / on.median.max(1e-9),
                        "ours_over_theirs_without_cache": t_off.median / off.median.max(1e-9),
                        "error_after_some_runs": error,
                    })
                }
            };
            rows.push(json!({
                "tokens": n,
                "kv_on_ms_per_token": on,
                "kv_off_ms_per_token": off,
                "speedup": speedup,
                "llama_cpp": llama,
            }));
        }
        Ok((Value::Array(rows), lines, notes))
    }
}

/// `emberlm bench --kv-compare`: the section alone on `model`, printed and written as JSON
/// (`out`, or `bench/results/<date>-kv-length-<backend>-<model>.json`, numbered where taken).
pub fn only(model: &Path, bench: &KvLengthBench<'_>, out: Option<PathBuf>) -> CliResult<()> {
    let files = ModelFiles::open(model)?;
    let weights = files.weights()?;
    let longest = bench.lengths.iter().copied().max().unwrap_or(1);
    let context = (longest + bench.steps + 2).min(weights.config.context_length);
    let options = crate::cli::gpu_options();
    let (mut backend, device): (Box<dyn Backend>, String) = match options.device {
        DeviceChoice::Cpu => {
            let precision = crate::cli::cpu_precision();
            let threads = emberlm::backend::cpu::threads();
            let isa = emberlm::backend::cpu::dot::instruction_set();
            let fwd = CpuForward::with_precision(&weights, context, DEFAULT_CHUNK, precision)?;
            (
                Box::new(fwd),
                format!(
                    "cpu ({isa}, {threads} threads, {} products)",
                    precision.as_str()
                ),
            )
        }
        _ => {
            let ctx = pollster::block_on(GpuContext::new(options))?;
            let name = ctx.report().to_string();
            let gpu = pollster::block_on(GpuModel::load(ctx, &weights, context, &mut |_, _| {}))?;
            (Box::new(gpu), name)
        }
    };
    eprintln!("bench: KV at length on {} ({device})", model.display());
    let (rows, lines, notes) = bench.run(backend.as_mut(), model)?;
    println!(
        "emberlm bench --kv-compare — {} — {device}",
        model.display()
    );
    for line in lines.iter().chain(&notes) {
        println!("{line}");
    }
    let result = json!({
        "date": chrono::Local::now().to_rfc3339(),
        "device": device,
        "model": model.display().to_string(),
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
        "settings": {
            "lengths": bench.lengths,
            "steps": bench.steps,
            "runs": bench.runs,
            // the CPU backend's threads, and llama.cpp's beside either backend
            "cpu_threads": emberlm::backend::cpu::threads(),
        },
        "kv_at_length": rows,
        "notes": notes,
    });
    let out = out.unwrap_or_else(|| {
        let stem = model
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let backend = match backend.gpu() {
            Some(_) => "gpu",
            None => "cpu",
        };
        crate::bench_common::fresh_result_path(&format!(
            "{}-kv-length-{backend}-{}",
            chrono::Local::now().format("%Y-%m-%d"),
            sanitize(&stem)
        ))
    });
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    std::fs::write(&out, serde_json::to_string_pretty(&result).map_err(fail)?).map_err(fail)?;
    println!("JSON: {}", out.display());
    Ok(())
}
