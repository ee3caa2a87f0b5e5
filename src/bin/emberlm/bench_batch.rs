//! The bench's batched decoding section: aggregate decode tokens/s and the time per step for
//! B = 1, 4, 8 and 16 sequences advanced together, each at its own position in its own KV
//! slot, with the greedy candidate selection of every row read back as real decoding does. On
//! the GPU (the full bench and `--batch-only`) or the CPU backend (`--batch-only --device cpu`).

use emberlm::backend::cpu::CpuForward;
use emberlm::backend::gpu::Forward;
use emberlm::backend::gpu::{DeviceChoice, KernelCache};
use emberlm::backend::{Backend, BatchToken, DEFAULT_CHUNK};
use emberlm::candidates::SelectRequest;
use emberlm::model::weights::ModelWeights;
use emberlm::sampling::{Sampler, SamplingParams};
use emberlm::GpuContext;
use serde_json::{json, Value};
use web_time::Instant;

use crate::CliResult;

/// Batch sizes measured.
pub const SIZES: [usize; 4] = [1, 4, 8, 16];

/// `emberlm bench --batch-only`: the section alone on `model`, printed, on the GPU or (with
/// `--device cpu`) on the CPU backend.
pub fn only(model: &std::path::Path, quick: bool) -> CliResult<()> {
    let files = emberlm::loader::ModelFiles::open(model)?;
    let weights = files.weights()?;
    let bench = BatchBench {
        steps: if quick { 3 } else { 8 },
        position: 64,
    };
    let options = crate::cli::gpu_options();
    let (json, lines) = if options.device == DeviceChoice::Cpu {
        eprintln!("bench: {} on the CPU backend", model.display());
        let context = bench.context(&weights);
        let mut backend: Box<dyn Backend> = Box::new(CpuForward::with_precision(
            &weights,
            context,
            DEFAULT_CHUNK,
            crate::cli::cpu_precision(),
        )?);
        bench.measure(&mut backend, context, &weights)?
    } else {
        let ctx = pollster::block_on(GpuContext::new(options))?;
        eprintln!("bench: {} on {}", model.display(), ctx.report());
        bench.run(&ctx, &KernelCache::new(), &weights)?
    };
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

/// A forward pass that can take batched steps: the GPU's (with its device) or a [`Backend`].
trait BatchStep {
    fn max_batch(&self) -> usize;
    fn set_batch(&mut self, slots: usize) -> CliResult<()>;
    fn step(&mut self, tokens: &[BatchToken], requests: &[Option<&SelectRequest>])
        -> CliResult<()>;
}

/// The GPU forward pass with the device and pipelines it runs on.
struct OnGpu<'a> {
    ctx: &'a GpuContext,
    cache: &'a KernelCache,
    fwd: Forward,
}

impl BatchStep for OnGpu<'_> {
    fn max_batch(&self) -> usize {
        self.fwd.max_batch()
    }
    fn set_batch(&mut self, slots: usize) -> CliResult<()> {
        Ok(pollster::block_on(
            self.fwd.set_batch(self.ctx, self.cache, slots),
        )?)
    }
    fn step(
        &mut self,
        tokens: &[BatchToken],
        requests: &[Option<&SelectRequest>],
    ) -> CliResult<()> {
        pollster::block_on(self.fwd.decode_batch(self.ctx, tokens, requests))?;
        Ok(())
    }
}

impl BatchStep for Box<dyn Backend> {
    fn max_batch(&self) -> usize {
        self.as_ref().max_batch()
    }
    fn set_batch(&mut self, slots: usize) -> CliResult<()> {
        Ok(pollster::block_on(self.as_mut().set_batch(slots))?)
    }
    fn step(
        &mut self,
        tokens: &[BatchToken],
        requests: &[Option<&SelectRequest>],
    ) -> CliResult<()> {
        pollster::block_on(self.decode_batch(tokens, requests))?;
        Ok(())
    }
}

impl BatchBench {
    /// Cache positions the section needs: the start, the steps and the slots' offsets.
    fn context(&self, weights: &ModelWeights<'_>) -> usize {
        (self.position + self.steps + 2 * SIZES[SIZES.len() - 1] + 2)
            .min(weights.config.context_length)
    }

    /// Runs the section on the GPU of `ctx` with `weights` and a KV cache of its own.
    pub fn run(
        &self,
        ctx: &GpuContext,
        cache: &KernelCache,
        weights: &ModelWeights<'_>,
    ) -> CliResult<(Value, Vec<String>)> {
        let context = self.context(weights);
        let fwd = pollster::block_on(Forward::new(ctx, cache, weights, context, 64))?;
        self.measure(&mut OnGpu { ctx, cache, fwd }, context, weights)
    }

    /// Times every batch size on `fwd`, whose cache holds `context` positions per slot.
    fn measure(
        &self,
        fwd: &mut dyn BatchStep,
        context: usize,
        weights: &ModelWeights<'_>,
    ) -> CliResult<(Value, Vec<String>)> {
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
            fwd.set_batch(b)?;
            let mut tokens: Vec<BatchToken> = (0..b)
                .map(|slot| BatchToken {
                    slot,
                    pos: (self.position + 2 * slot).min(context.saturating_sub(self.steps + 2)),
                    token: (17 + 31 * slot as u32) % vocab as u32,
                })
                .collect();
            let requests = vec![request.as_ref(); b];
            let mut step = |tokens: &mut [BatchToken]| -> CliResult<()> {
                fwd.step(tokens, &requests)?;
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
