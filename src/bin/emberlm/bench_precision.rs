//! The bench's precision section: the same prompt in f32 and in f16 (matrix products on
//! f16 inputs), how the logits agree (largest |Δ logit|, top-1 agreement, NLL delta, mean KL),
//! and the prefill and decode speed of each. Skipped, and said so, where the adapter has no
//! `shader-f16`.

use emberlm::backend::gpu::Forward;
use emberlm::backend::gpu::{KernelCache, Precision};
use emberlm::backend::Readback;
use emberlm::model::weights::ModelWeights;
use emberlm::sampling::agreement;
use emberlm::{GpuContext, GpuOptions};
use serde_json::{json, Value};
use web_time::Instant;

use crate::CliResult;

/// What the section measures.
pub struct PrecisionBench<'a> {
    /// The prompt (prefilled with every row's logits kept).
    pub tokens: &'a [u32],
    /// Decode steps timed after the prompt.
    pub decode_steps: usize,
}

/// Logits of every prompt position, prefill seconds and decode tokens per second.
struct Run {
    logits: Vec<f32>,
    prefill_s: f64,
    decode_tok_s: f64,
}

impl PrecisionBench<'_> {
    fn run_one(&self, weights: &ModelWeights<'_>, options: GpuOptions) -> CliResult<Run> {
        let ctx = pollster::block_on(GpuContext::new(options))?;
        let cache = KernelCache::new();
        let context = self.tokens.len() + self.decode_steps + 2;
        let mut fwd = pollster::block_on(Forward::new(
            &ctx,
            &cache,
            weights,
            context,
            emberlm::backend::DEFAULT_CHUNK,
        ))?;
        // one untimed pass builds every pipeline
        pollster::block_on(fwd.forward(&ctx, self.tokens, false))?;
        fwd.truncate(0)?;
        let start = Instant::now();
        let logits = pollster::block_on(fwd.forward(&ctx, self.tokens, true))?;
        let prefill_s = start.elapsed().as_secs_f64();
        let start = Instant::now();
        for _ in 0..self.decode_steps {
            pollster::block_on(fwd.run(&ctx, &[1], Readback::LastRow))?;
        }
        let decode_tok_s = self.decode_steps as f64 / start.elapsed().as_secs_f64().max(1e-9);
        Ok(Run {
            logits,
            prefill_s,
            decode_tok_s,
        })
    }

    /// Runs both precisions on `weights` with `base` options and returns the JSON and the
    /// text lines.
    pub fn run(
        &self,
        weights: &ModelWeights<'_>,
        base: &GpuOptions,
    ) -> CliResult<(Value, Vec<String>)> {
        let probe = pollster::block_on(GpuContext::new(GpuOptions {
            precision: Precision::F32,
            allow_shader_f16: true,
            ..base.clone()
        }))?;
        if !probe.report().shader_f16 {
            let reason = "the adapter has no shader-f16";
            return Ok((
                json!({ "available": false, "reason": reason }),
                vec![format!("precision f16 vs f32: skipped ({reason})")],
            ));
        }
        drop(probe);
        eprintln!("bench: precision f32 and f16");
        let with = |precision| GpuOptions {
            precision,
            ..base.clone()
        };
        let f32_run = self.run_one(weights, with(Precision::F32))?;
        let f16_run = self.run_one(weights, with(Precision::F16))?;
        let vocab = weights.config.vocab_size;
        let a = agreement(&f32_run.logits, &f16_run.logits, self.tokens, vocab);
        let n = self.tokens.len() as f64;
        let line = format!(
            "precision f16 vs f32 over {} positions: max |Δ logit| {:.4}, top-1 agreement {:.3}, ΔNLL {:+.5}, KL {:.2e}; prefill {:.1} vs {:.1} tok/s, decode {:.2} vs {:.2} tok/s",
            a.positions,
            a.max_abs_diff,
            a.top1_agreement,
            a.nll_delta,
            a.mean_kl,
            n / f16_run.prefill_s,
            n / f32_run.prefill_s,
            f16_run.decode_tok_s,
            f32_run.decode_tok_s,
        );
        let side =
            |r: &Run| json!({ "prefill_tok_s": n / r.prefill_s, "decode_tok_s": r.decode_tok_s });
        Ok((
            json!({
                "available": true,
                "prompt_tokens": self.tokens.len(),
                "decode_steps": self.decode_steps,
                "agreement": a,
                "f32": side(&f32_run),
                "f16": side(&f16_run),
            }),
            vec![line],
        ))
    }
}
