//! The kernel plan of a loaded model: forced, reused from the [`crate::tune`] store, or measured
//! here on the model's own bound kernels.
//!
//! Measuring times, for each family still undecided, every variant over the family's distinct
//! shapes in this model (one node per distinct weight shape, not every layer): batches of
//! dispatches in one pass and one submit, doubled until a batch takes long enough for coarse
//! timers, within a budget of ~2 s on CPU-like adapters and ~0.3 s on GPUs. Each variant first
//! runs once untimed: a first dispatch may compile the pipeline (SwiftShader compiles at first
//! use) or fault in memory, which neither counts as the variant's time nor spends the budget.
//! A family the budget did not reach keeps the adapter-type guess and the plan is not stored, so
//! the next load measures again.

use std::collections::BTreeSet;

use web_time::{Duration, Instant};

use super::{Forward, Node};
use crate::backend::gpu::plan::{Family, KernelOverrides, Source, StoredPlan, Timing};
use crate::backend::gpu::precision::MatmulPrecision;
use crate::backend::gpu::variants::attention as attention_variants;
use crate::backend::gpu::{GpuContext, KernelPlan, StepParams, Variant};
use crate::error::Result;
use crate::model::weights::ModelWeights;
use crate::tune::{Store, TuneKey};

/// A batch that takes at least this long is timed well enough by any timer.
const MIN_BATCH: Duration = Duration::from_millis(25);
/// Most repetitions of one batch.
const MAX_REPS: u32 = 256;

/// Whether the adapter is a CPU in disguise (lavapipe, SwiftShader, WARP).
pub(crate) fn cpu_adapter(ctx: &GpuContext) -> bool {
    ctx.report().is_software()
}

/// A model's shape as tune keys name it: its dimensions (`Llama layers=30 d=576 heads=9/3x64
/// ffn=1536 vocab=49152`) and its weight types (`F32,Q4_1,Q8_0`).
pub(crate) fn model_shape(weights: &ModelWeights<'_>) -> (String, String) {
    let c = &weights.config;
    let types: BTreeSet<String> = weights
        .tensors
        .values()
        .map(|t| t.dtype.to_string())
        .collect();
    let dims = format!(
        "{:?} layers={} d={} heads={}/{}x{} ffn={} vocab={}",
        c.arch,
        c.n_layers,
        c.hidden_size,
        c.n_heads,
        c.n_kv_heads,
        c.head_dim,
        c.ffn_size,
        c.vocab_size,
    );
    (dims, types.into_iter().collect::<Vec<_>>().join(","))
}

/// The store key of a model's kernel plan on this device: adapter, driver, engine version and
/// the shapes the kernels see (dimensions, weight types, chunk).
pub fn plan_key(ctx: &GpuContext, weights: &ModelWeights<'_>, chunk: usize) -> TuneKey {
    let r = ctx.report();
    let (dims, types) = model_shape(weights);
    let shape = format!("{dims} chunk={chunk} types={types}");
    // the kinds change attention's cost (an f32 cache keeps the key it always had)
    let kinds = ctx.options().kv_cache;
    let shape = if kinds.is_f32() {
        shape
    } else {
        format!("{shape} kv={kinds}")
    };
    // so does f16 precision (f32 keeps the key it always had)
    let shape = match ctx.precision() {
        MatmulPrecision::F32 => shape,
        p => format!("{shape} precision={p}"),
    };
    TuneKey::new(
        "kernel-plan",
        format!(
            "{} [{}, {}] subgroups={}",
            r.name, r.backend, r.device_type, r.subgroups
        ),
        format!("{} {}", r.driver, r.driver_info),
        shape,
    )
}

/// The plan before the graph is built: forced families fixed, the rest reused from the store
/// or left to measure (built in every variant).
pub(super) async fn initial_plan(
    ctx: &GpuContext,
    weights: &ModelWeights<'_>,
    chunk: usize,
) -> Result<(KernelPlan, TuneKey)> {
    let overrides = KernelOverrides::from_env()?.merged(&ctx.options().kernels);
    let key = plan_key(ctx, weights, chunk);
    let store = Store::platform();
    let all_forced = Family::ALL.iter().all(|f| overrides.get(*f).is_some());
    if !all_forced {
        if let Some(mut plan) = store
            .load::<StoredPlan>(&key)
            .await
            .and_then(|s| s.apply(&overrides))
        {
            plan.stored_at = store.location(&key);
            return Ok((plan, key));
        }
    }
    Ok((KernelPlan::guessed(cpu_adapter(ctx), &overrides), key))
}

/// [`initial_plan`] with the variants this model cannot run ruled out, as their tables say
/// (attention's rows shape takes heads of at most 128; Gemma 3's are 256). Without this such
/// a variant was "timed" as the one it falls back to, could win by noise, and the stored plan
/// then failed every later load of the model.
pub(super) async fn model_plan(
    ctx: &GpuContext,
    weights: &ModelWeights<'_>,
    chunk: usize,
) -> Result<(KernelPlan, TuneKey)> {
    let (mut plan, key) = initial_plan(ctx, weights, chunk).await?;
    let head_dim = super::compile::heads_of(&weights.config).head_dim;
    for v in attention_variants::ALL {
        if !v.applies(head_dim) {
            plan.rule_out(Family::Attention, v.spec.variant);
        }
    }
    Ok((plan, key))
}

impl Forward {
    /// Measures the families the plan left undecided, then stores the plan when every family
    /// was decided by measuring or reuse.
    pub(super) async fn finish_plan(&mut self, ctx: &GpuContext, key: &TuneKey) -> Result<()> {
        // cheapest to time first: when the budget runs out, the family left on the adapter-type
        // guess is the decode linear, whose guess is the surest
        let pending: Vec<Family> = [
            Family::Attention,
            Family::LinearPrefill,
            Family::LinearDecode,
        ]
        .into_iter()
        .filter(|f| matches!(self.plan.choices.get(f), Some((_, Source::Guessed))))
        .collect();
        if pending.is_empty() {
            return Ok(());
        }
        let budget = if cpu_adapter(ctx) {
            Duration::from_secs(2)
        } else {
            Duration::from_millis(300)
        };
        let mut clock = Budget::new(budget);
        for family in pending {
            let mut timings: Vec<Timing> = Vec::new();
            for variant in self.plan.candidates(family) {
                let best = timings.iter().map(|t| t.seconds).reduce(f64::min);
                if clock.spent() {
                    break;
                }
                let seconds = self
                    .time_family(ctx, family, variant, &mut clock, best)
                    .await?;
                timings.push(Timing {
                    family,
                    variant,
                    seconds,
                });
            }
            // Only a family whose every variant was timed is decided.
            if timings.len() == self.plan.candidates(family).len() {
                if let Some(best) = timings
                    .iter()
                    .min_by(|a, b| a.seconds.total_cmp(&b.seconds))
                {
                    self.plan
                        .choices
                        .insert(family, (best.variant, Source::Measured));
                }
            }
            self.plan.timings.extend(timings);
        }
        self.plan.measure_seconds = clock.wall().as_secs_f64();
        let decided = self
            .plan
            .choices
            .values()
            .all(|(_, s)| *s != Source::Guessed);
        if decided {
            let stored = StoredPlan {
                choices: self.plan.choices.iter().map(|(f, c)| (*f, c.0)).collect(),
                timings: self.plan.timings.clone(),
            };
            let store = Store::platform();
            // A plan that cannot be persisted still holds for this load.
            if store.save(key, &stored).await.is_ok() {
                self.plan.stored_at = store.location(key);
            }
        }
        Ok(())
    }

    /// Seconds per run of `family`'s distinct nodes in `variant`: the step shapes the family
    /// serves (one decode token at a mid-context position; a full prefill chunk).
    async fn time_family(
        &mut self,
        ctx: &GpuContext,
        family: Family,
        variant: Variant,
        clock: &mut Budget,
        beat: Option<f64>,
    ) -> Result<f64> {
        // a decode step at a mid-length context, and a chunk after a short prompt
        let context = self.kv.context() as u32;
        let chunk = (self.chunk as u32).min(context);
        let decode_pos = context.min(512) - 1;
        let chunk_pos = (context - chunk).min(256);
        let steps: &[(u32, u32)] = match family {
            Family::LinearDecode => &[(decode_pos, 1)],
            Family::LinearPrefill => &[(0, chunk)],
            Family::Attention => &[(decode_pos, 1), (chunk_pos, chunk)],
        };
        let mut plan = self.plan.clone();
        plan.choices.insert(family, (variant, Source::Forced));
        let nodes = self.distinct_nodes(family);
        // the LM head is the largest decode linear
        let head = self
            .head_last
            .as_ref()
            .filter(|_| family == Family::LinearDecode);
        let mut total = 0.0;
        for &(pos0, n_tokens) in steps {
            let params = StepParams::new(pos0, n_tokens);
            params.write(ctx, &self.step);
            let record = |pass: &mut wgpu::ComputePass<'_>| {
                for node in &nodes {
                    node.record(pass, &params, &plan);
                }
                if let Some(h) = head {
                    h.record_planned(pass, n_tokens, plan.linear());
                }
            };
            // The first run warms up (a first dispatch may compile the pipeline or fault in
            // memory): untimed, and outside the budget.
            let warm_up = Instant::now();
            self.run_batch(ctx, 1, &record).await?;
            clock.exclude(warm_up.elapsed());
            let mut reps = 1u32;
            loop {
                let elapsed = self.run_batch(ctx, reps, &record).await?;
                // clearly slower than the best variant so far: no need to time it better
                let so_far = total + elapsed.as_secs_f64() / f64::from(reps);
                if beat.is_some_and(|b| so_far > 2.0 * b) {
                    return Ok(so_far);
                }
                if elapsed >= MIN_BATCH || reps >= MAX_REPS || clock.spent() {
                    total += elapsed.as_secs_f64() / f64::from(reps);
                    break;
                }
                reps = (reps * 4).min(MAX_REPS);
            }
        }
        Ok(total)
    }

    /// One node per distinct shape of `family` (layers repeat the same shapes).
    fn distinct_nodes(&self, family: Family) -> Vec<&Node> {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for node in &self.nodes {
            let key = match (family, node) {
                (Family::LinearDecode | Family::LinearPrefill, Node::Linear(l)) => l.shape(),
                // every layer's attention has the same shape
                (Family::Attention, Node::Attention(_)) => (0, 0),
                _ => continue,
            };
            if seen.insert(key) {
                out.push(node);
            }
        }
        out
    }

    /// Records `record` `reps` times in one pass, submits, waits; the wall time.
    pub(super) async fn run_batch(
        &self,
        ctx: &GpuContext,
        reps: u32,
        record: &dyn Fn(&mut wgpu::ComputePass<'_>),
    ) -> Result<Duration> {
        let t0 = Instant::now();
        let mut encoder = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("kernel plan timing"),
            });
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("kernel plan timing"),
                timestamp_writes: None,
            });
            for _ in 0..reps {
                record(&mut pass);
            }
        }
        encoder.copy_buffer_to_buffer(&self.act.logits, 0, &self.select_staging, 0, 4);
        let submission = ctx.queue.submit([encoder.finish()]);
        ctx.read_staging(&self.select_staging, 4, submission)
            .await?;
        Ok(t0.elapsed())
    }
}

/// The measuring budget: wall time since measuring began, less the warm-up runs.
struct Budget {
    start: Instant,
    limit: Duration,
    excluded: Duration,
}

impl Budget {
    fn new(limit: Duration) -> Self {
        Budget {
            start: Instant::now(),
            limit,
            excluded: Duration::ZERO,
        }
    }

    /// Leaves `d` (a warm-up run) out of the time spent.
    fn exclude(&mut self, d: Duration) {
        self.excluded += d;
    }

    /// Whether the timed runs have used the budget up.
    fn spent(&self) -> bool {
        self.wall().saturating_sub(self.excluded) > self.limit
    }

    /// All the time measuring took, warm-ups included.
    fn wall(&self) -> Duration {
        self.start.elapsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_ups_do_not_spend_the_budget() {
        let mut b = Budget::new(Duration::from_millis(300));
        std::thread::sleep(Duration::from_millis(350));
        assert!(b.spent());
        b.exclude(Duration::from_millis(350));
        assert!(!b.spent(), "a slow first dispatch leaves the budget whole");
        assert!(b.wall() >= Duration::from_millis(350));
    }
}
