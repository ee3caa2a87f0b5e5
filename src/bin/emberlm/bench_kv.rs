//! The bench's KV-cache sections: with the cache against recomputing the prefix
//! ([`kv_run`]), and per kind: per kind, the bytes per token, the positions a fixed
//! budget holds, and the decode speed at given cache positions (the positions before are
//! marked cached without being computed: a step's cost depends on how many keys it reads, not
//! on their values).

use emberlm::backend::gpu::Forward;
use emberlm::backend::gpu::KernelCache;
use emberlm::backend::Readback;
use emberlm::config::KvLayout;
use emberlm::dtype::kv::{KvKind, KvKinds};
use emberlm::GpuContext;
use serde_json::{json, Value};
use web_time::Instant;

use crate::CliResult;

/// `emberlm bench --kv-kinds-only`: the KV-cache kinds section alone on `model`, printed and
/// as JSON on stdout.
pub fn only(model: &std::path::Path, bench: &KvKindsBench<'_>) -> CliResult<()> {
    let files = emberlm::loader::ModelFiles::open(model)?;
    let weights = files.weights()?;
    let ctx = pollster::block_on(GpuContext::new(crate::cli::gpu_options()))?;
    eprintln!("bench: {} on {}", model.display(), ctx.report());
    let cache = KernelCache::new();
    let mut fwd = pollster::block_on(Forward::new(&ctx, &cache, &weights, 64, 64))?;
    let (json, lines, notes) = bench.run(&ctx, &cache, &mut fwd)?;
    for line in lines.iter().chain(&notes) {
        println!("{line}");
    }
    println!("{json}");
    Ok(())
}

/// What the section measures.
pub struct KvKindsBench<'a> {
    /// Cache positions at which decode is timed.
    pub positions: &'a [usize],
    /// Decode steps timed at each position (after one untimed step).
    pub steps: usize,
    /// The fixed budget, MiB, for the positions-per-budget figure.
    pub budget_mb: f64,
}

impl KvKindsBench<'_> {
    /// Runs every kind on `fwd` (its cache is replaced; the caller is done with it) and
    /// returns the JSON rows, the text lines and notes for what was skipped.
    pub fn run(
        &self,
        ctx: &GpuContext,
        cache: &KernelCache,
        fwd: &mut Forward,
    ) -> CliResult<(Value, Vec<String>, Vec<String>)> {
        let config = fwd.config().clone();
        let budget = self.budget_mb * f64::from(1u32 << 20);
        let mut rows = Vec::new();
        let mut lines = Vec::new();
        let mut notes = Vec::new();
        for kind in KvKind::ALL {
            let kinds = KvKinds::both(kind);
            // per position of the layers that keep every position (local layers keep rings)
            let per_token = fwd
                .kv()
                .layout()
                .position_bytes(kinds.row_bytes(config.kv_dim()))
                .max(1);
            // the rings' fixed rows count against the budget too
            let fits = KvLayout::trained(&config, usize::MAX, fwd.chunk())
                .positions_within(kinds.row_bytes(config.kv_dim()), budget as u64);
            let mut speeds = Vec::new();
            for &pos in self.positions {
                let needed = pos + self.steps + 2;
                if needed > config.context_length {
                    let note = format!(
                        "KV kinds: decode at {pos} positions skipped: past the model's context of {}",
                        config.context_length
                    );
                    if !notes.contains(&note) {
                        notes.push(note);
                    }
                    continue;
                }
                eprintln!("bench: {kind} cache, decode at {pos} positions");
                pollster::block_on(fwd.set_kv(ctx, cache, kinds, needed))?;
                fwd.assume_cached(pos)?;
                pollster::block_on(fwd.run(ctx, &[1], Readback::LastRow))?;
                let start = Instant::now();
                for _ in 0..self.steps {
                    pollster::block_on(fwd.run(ctx, &[1], Readback::LastRow))?;
                }
                let tok_s = self.steps as f64 / start.elapsed().as_secs_f64().max(1e-9);
                speeds.push(json!({ "positions": pos, "decode_tok_s": tok_s }));
            }
            lines.push(format!(
                "KV {:<5} {:>6} B/token, {:>7} positions in {} MiB, decode {}",
                kind.name(),
                per_token,
                fits,
                self.budget_mb,
                speeds
                    .iter()
                    .map(|s| format!(
                        "{:.2} tok/s at {}",
                        s["decode_tok_s"].as_f64().unwrap_or(0.0),
                        s["positions"]
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            rows.push(json!({
                "kind": kind.name(),
                "bytes_per_token": per_token,
                "budget_mb": self.budget_mb,
                "positions_in_budget": fits,
                "decode": speeds,
            }));
        }
        Ok((Value::Array(rows), lines, notes))
    }
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = (0usize, f32::NEG_INFINITY);
    for (i, &v) in row.iter().enumerate() {
        if v > best.1 {
            best = (i, v);
        }
    }
    best.0 as u32
}

/// Seconds to generate `n` tokens greedily after `prompt`, with the KV cache (`kv`) or by
/// recomputing the whole prefix every step.
pub fn kv_run(
    ctx: &GpuContext,
    fwd: &mut Forward,
    prompt: &[u32],
    n: usize,
    kv: bool,
) -> CliResult<f64> {
    fwd.truncate(0)?;
    let start = Instant::now();
    let mut tokens = prompt.to_vec();
    let mut logits = pollster::block_on(fwd.forward(ctx, &tokens, false))?;
    for _ in 0..n {
        let next = argmax(&logits);
        tokens.push(next);
        logits = if kv {
            pollster::block_on(fwd.forward(ctx, &[next], false))?
        } else {
            fwd.truncate(0)?;
            pollster::block_on(fwd.forward(ctx, &tokens, false))?
        };
    }
    Ok(start.elapsed().as_secs_f64())
}
