//! The bench's batched decoding section: aggregate decode tokens/s and the time per step for
//! B = 1, 4, 8 and 16 sequences advanced together, each at its own position in its own KV
//! slot, with the greedy candidate selection of every row read back as real decoding does.

use emberlm::forward::{BatchToken, Forward};
use emberlm::gpu::KernelCache;
use emberlm::model::weights::ModelWeights;
use emberlm::sampling::{Sampler, SamplingParams};
use emberlm::GpuContext;
use serde_json::{json, Value};
use web_time::Instant;

use crate::CliResult;

/// Batch sizes measured.
pub const SIZES: [usize; 4] = [1, 4, 8, 16];

/// `emberlm bench --batch-only`: the section alone on `model`, printed.
pub fn only(model: &std::path::Path, quick: bool) -> CliResult<()> {
    let files = emberlm::loader::ModelFiles::open(model)?;
    let weights = files.weights()?;
    let ctx = pollster::block_on(GpuContext::new(crate::cli::gpu_options()))?;
    eprintln!("bench: {} on {}", model.display(), ctx.report());
    let bench = BatchBench {
        steps: if quick { 3 } else { 8 },
        position: 64,
    };
    let (json, lines) = bench.run(&ctx, &KernelCache::new(), &weights)?;
    for line in lines {
        println!("{line}");
    }
    println!("{json}");
    Ok(())
}

/// What the section measures.
pub struct BatchBench {
    /// Timed steps per batch size (after one untimed step).
    pub steps: usize,
    /// Cached positions each sequence starts from (they differ by a few per slot).
    pub position: usize,
}

impl BatchBench {
    /// Runs the section on `weights` with a KV cache of its own.
    pub fn run(
        &self,
        ctx: &GpuContext,
        cache: &KernelCache,
        weights: &ModelWeights<'_>,
    ) -> CliResult<(Value, Vec<String>)> {
        let context = (self.position + self.steps + 2 * SIZES[SIZES.len() - 1] + 2)
            .min(weights.config.context_length);
        let mut fwd = pollster::block_on(Forward::new(ctx, cache, weights, context, 64))?;
        let vocab = weights.config.vocab_size;
        let sampler = Sampler::new(&SamplingParams::greedy(), vocab)?;
        let request = sampler.select_request(&[], &[])?;
        let mut rows = Vec::new();
        let mut lines = Vec::new();
        let mut base = None;
        for b in SIZES {
            if b > fwd.max_batch() {
                lines.push(format!(
                    "batched decoding B = {b}: past the step size, skipped"
                ));
                continue;
            }
            eprintln!("bench: batched decoding B = {b}");
            pollster::block_on(fwd.set_batch(ctx, cache, b))?;
            let mut tokens: Vec<BatchToken> = (0..b)
                .map(|slot| BatchToken {
                    slot,
                    pos: (self.position + 2 * slot).min(context.saturating_sub(self.steps + 2)),
                    token: (17 + 31 * slot as u32) % vocab as u32,
                })
                .collect();
            let requests = vec![request.as_ref(); b];
            let mut step = |tokens: &mut [BatchToken]| -> CliResult<()> {
                pollster::block_on(fwd.decode_batch(ctx, tokens, &requests))?;
                for t in tokens.iter_mut() {
                    t.pos += 1;
                }
                Ok(())
            };
            step(&mut tokens)?;
            let start = Instant::now();
            for _ in 0..self.steps {
                step(&mut tokens)?;
            }
            let secs = start.elapsed().as_secs_f64();
            let step_ms = secs * 1000.0 / self.steps.max(1) as f64;
            let tok_s = (b * self.steps) as f64 / secs;
            let speedup = *base.get_or_insert(tok_s);
            let ratio = tok_s / speedup;
            rows.push(json!({
                "batch": b, "step_ms": step_ms, "aggregate_tok_s": tok_s, "over_b1": ratio,
            }));
            lines.push(format!(
                "batched decode B = {b:>2}: {step_ms:8.1} ms/step, {tok_s:7.2} tok/s aggregate ({ratio:.2}× B = 1)"
            ));
        }
        Ok((
            json!({ "context": context, "start_position": self.position, "steps": self.steps, "rows": rows }),
            lines,
        ))
    }
}
