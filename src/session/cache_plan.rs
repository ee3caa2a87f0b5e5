//! `kv_cache: "auto"`: the KV-cache kind chosen for this model on this device under a memory
//! budget and quality gates, measured once and kept in the [`crate::tune`] store.
//!
//! 1. **Budget:** kinds whose cache for the session's context exceeds `cache_budget_mb` are
//!    dropped.
//! 2. **Quality gates** against the f32 cache, on the loaded model, over one calibration
//!    sequence that is also a needle-in-a-haystack probe: a prompt of
//!    `cache_quality_prompt_len` tokens (a fact first, then prose, then a question about the
//!    fact), then its answer fed back one token per step for `cache_quality_decode_steps`
//!    steps (teacher-forced). Over the rows that predict the answer: the mean NLL increase,
//!    the perplexity ratio (`exp` of it) and the mean KL divergence of the next-token
//!    distributions from f32's. A kind passes when all three are within their limits (the
//!    prompt runs as one prefill whose other rows skip the LM head, so a kind costs one
//!    prompt and a few decode steps).
//! 3. **Speed:** with `cache_auto_benchmark`, the survivors decode `cache_auto_bench_steps`
//!    tokens after a `cache_auto_bench_prompt_len`-token prompt and the fastest is kept;
//!    without it, the smallest survivor.
//! 4. **Persist:** the decision (and every measured value) is stored under the model, adapter,
//!    context and budget, reused by later loads, and measured again when older than
//!    `cache_plan_probe_interval_sec` with `cache_plan_probe` on.
//!
//! When no kind passes, f32 is used if it fits the budget; otherwise loading fails naming the
//! budget. Every candidate runs through [`Forward::set_kv`](crate::backend::gpu::Forward::set_kv)
//! on the model already on the device: nothing is uploaded twice.

use serde::{Deserialize, Serialize};
use web_time::{Instant, SystemTime, UNIX_EPOCH};

use super::Session;
use crate::backend::{Readback, Rows};
use crate::dtype::kv::{KvKind, KvKinds};
use crate::error::{Error, Result};
use crate::sampling::divergence::{mean_kl, mean_nll};
use crate::tune::{Store, TuneKey};

/// The automatic cache plan's settings (the requirements' names; defaults in
/// [`CachePlanOptions::default`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CachePlanOptions {
    /// Largest KV cache allowed, MiB (`None`: no limit).
    pub cache_budget_mb: Option<f64>,
    /// Calibration prompt, tokens (64).
    pub cache_quality_prompt_len: usize,
    /// Calibration tokens decoded one at a time after the prompt (4).
    pub cache_quality_decode_steps: usize,
    /// Largest mean NLL increase over f32, nats per token (0.05).
    pub cache_quality_max_delta_nll: f64,
    /// Largest perplexity ratio to f32 (1.05).
    pub cache_quality_max_ppl_ratio: f64,
    /// Largest mean KL divergence from f32's next-token distributions on the needle probe (0.1).
    pub cache_quality_max_mean_kl: f64,
    /// Time the kinds that pass and keep the fastest (true); else keep the smallest.
    pub cache_auto_benchmark: bool,
    /// Decode steps timed per kind (8).
    pub cache_auto_bench_steps: usize,
    /// Prompt before the timed steps, tokens (64).
    pub cache_auto_bench_prompt_len: usize,
    /// Folder of the stored decisions (natively; default: the user's cache directory, as the
    /// kernel plan). In the browser decisions go to the Cache API.
    pub cache_plan_path: Option<String>,
    /// Measure again when the stored decision is older than the interval (true).
    pub cache_plan_probe: bool,
    /// Age after which a stored decision is measured again, seconds (3600).
    pub cache_plan_probe_interval_sec: u64,
}

impl Default for CachePlanOptions {
    fn default() -> Self {
        Self {
            cache_budget_mb: None,
            cache_quality_prompt_len: 64,
            cache_quality_decode_steps: 4,
            cache_quality_max_delta_nll: 0.05,
            cache_quality_max_ppl_ratio: 1.05,
            cache_quality_max_mean_kl: 0.1,
            cache_auto_benchmark: true,
            cache_auto_bench_steps: 8,
            cache_auto_bench_prompt_len: 64,
            cache_plan_path: None,
            cache_plan_probe: true,
            cache_plan_probe_interval_sec: 3600,
        }
    }
}

impl CachePlanOptions {
    /// Checks every setting, naming the first bad one.
    pub fn validate(&self) -> Result<()> {
        if let Some(b) = self.cache_budget_mb {
            if !(b.is_finite() && b > 0.0) {
                return Err(Error::invalid(
                    "cache_budget_mb",
                    format!("must be a positive number of MiB, got {b}"),
                ));
            }
        }
        for (name, v) in [
            ("cache_quality_prompt_len", self.cache_quality_prompt_len),
            (
                "cache_quality_decode_steps",
                self.cache_quality_decode_steps,
            ),
            ("cache_auto_bench_steps", self.cache_auto_bench_steps),
            (
                "cache_auto_bench_prompt_len",
                self.cache_auto_bench_prompt_len,
            ),
        ] {
            if v == 0 || v > 4096 {
                return Err(Error::invalid(
                    name,
                    format!("must be in 1..=4096, got {v}"),
                ));
            }
        }
        for (name, v, min) in [
            (
                "cache_quality_max_delta_nll",
                self.cache_quality_max_delta_nll,
                0.0,
            ),
            (
                "cache_quality_max_ppl_ratio",
                self.cache_quality_max_ppl_ratio,
                1.0,
            ),
            (
                "cache_quality_max_mean_kl",
                self.cache_quality_max_mean_kl,
                0.0,
            ),
        ] {
            if !(v.is_finite() && v >= min) {
                return Err(Error::invalid(
                    name,
                    format!("must be a number >= {min}, got {v}"),
                ));
            }
        }
        Ok(())
    }
}

/// What the plan found for one kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheCandidate {
    /// The kind, for K and V.
    pub kind: String,
    /// Bytes of the cache at the session's context.
    pub bytes: u64,
    /// Bytes per cached token, all layers.
    pub bytes_per_token: u64,
    /// Why the kind was dropped (budget or a gate), `None` when it passed.
    pub dropped: Option<String>,
    /// Mean NLL increase over f32 on the calibration answer, nats per token.
    pub delta_nll: Option<f64>,
    /// Perplexity ratio to f32 on the calibration answer.
    pub ppl_ratio: Option<f64>,
    /// Mean KL divergence from f32's next-token distributions on the answer positions.
    pub mean_kl: Option<f64>,
    /// Decode speed in the timed steps, tokens per second.
    pub decode_tok_s: Option<f64>,
}

/// The plan's decision and everything measured for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheDecision {
    /// The chosen kind (K and V).
    pub kind: String,
    /// `measured` on this load, or `reused` from the store.
    pub source: String,
    /// When it was measured, seconds since the Unix epoch.
    pub measured_at: u64,
    /// The budget it was made under, MiB.
    pub budget_mb: Option<f64>,
    /// The context it was made for, positions.
    pub context: usize,
    /// Every kind, in order f32, f16, q8_0, q4_0, nf4.
    pub candidates: Vec<CacheCandidate>,
    /// Why the choice fell back, when it did ("no kind passed ...").
    pub notice: Option<String>,
    /// Where the decision is kept (a file or a cache URL), when it is.
    pub stored_at: Option<String>,
}

fn now_sec() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 20)
}

/// The haystack: plain English prose between the fact and the question.
const CALIBRATION: &str = "The harbour town woke slowly on winter mornings. Fishermen checked \
their nets by lamplight while the bakery on the corner pulled the first loaves from its oven, \
and the smell of bread drifted down to the water. Children walked to school along the sea \
wall, counting the gulls that sat on the posts. By nine the market square was full: farmers \
sold apples and cabbages from wooden carts, a woman mended shoes beside the fountain, and the \
old clockmaker opened his shutters to show the week's repairs. Nobody hurried. Visitors who \
arrived on the afternoon ferry often said the place felt as if it had been painted rather than \
built, and they stayed longer than they had planned, walking the cliffs in the wind and \
eating fish soup in the evenings while the lighthouse swept its beam across the bay.";

/// The needle: a fact at the start of the calibration prompt.
const NEEDLE: &str = "Remember this: the code for the blue gate is 4817.";
/// The question at the end of the calibration prompt, and the answer fed after it.
const QUESTION: &str = " Question: what is the code for the blue gate? Answer:";
const ANSWER: &str = " the code for the blue gate is 4817.";

/// The calibration sequence: a prompt of `prompt_len` tokens (a fact, a haystack of prose,
/// a question about the fact) and then the answer, `decode_steps + 1` tokens that are fed
/// back one per step (teacher-forced); the last is only predicted.
struct Calibration {
    tokens: Vec<u32>,
    prompt_len: usize,
}

impl Session {
    /// The automatic cache plan's decision for this session, when one was made.
    pub fn cache_decision(&self) -> Option<&CacheDecision> {
        self.cache_decision.as_ref()
    }

    /// Stores K and V in `kinds` from now on (the cache is emptied; the context stays).
    pub async fn set_kv_kinds(&mut self, kinds: KvKinds) -> Result<()> {
        let context = self.context();
        self.cached.clear();
        self.forward.set_kv(kinds, context).await
    }

    /// Chooses the KV-cache kind under `options` (see the module documentation), applies it
    /// and returns the decision (also kept: [`Session::cache_decision`]). The conversation
    /// is forgotten.
    pub async fn plan_kv_cache(&mut self, options: &CachePlanOptions) -> Result<CacheDecision> {
        options.validate()?;
        let context = self.context();
        let config = self.config().clone();
        if config.bidirectional {
            // an encoder's cache holds only the text being embedded, and the calibration
            // measures generation, which it does not do: its cache stays as loaded
            let decision = CacheDecision {
                kind: self.forward.kv_kinds().k.name().to_string(),
                source: "not planned".into(),
                measured_at: now_sec(),
                budget_mb: options.cache_budget_mb,
                context,
                candidates: Vec::new(),
                notice: Some(format!(
                    "this {} model is an encoder: its KV cache holds only the text being \
                     embedded, so there is nothing to plan",
                    config.arch.name()
                )),
                stored_at: None,
            };
            self.cache_decision = Some(decision.clone());
            return Ok(decision);
        }
        // the GPU adapter, or the CPU backend's instruction set and threads: what the kinds'
        // speeds depend on
        let (device, driver) = self.forward.device_key();
        let budget = options
            .cache_budget_mb
            .map(|mb| format!("{mb}"))
            .unwrap_or("none".into());
        let key = TuneKey::new(
            "kv-cache-plan",
            device,
            driver,
            format!(
                "{:?} layers={} d={} heads={}/{}x{} vocab={} context={context} budget={budget} gates={}/{}/{}",
                config.arch,
                config.n_layers,
                config.hidden_size,
                config.n_heads,
                config.n_kv_heads,
                config.head_dim,
                config.vocab_size,
                options.cache_quality_max_delta_nll,
                options.cache_quality_max_ppl_ratio,
                options.cache_quality_max_mean_kl,
            ),
        );
        let store = match &options.cache_plan_path {
            Some(dir) => Store::Dir(dir.into()),
            None => Store::platform(),
        };
        let stored: Option<CacheDecision> = store.load(&key).await;
        let fresh = |d: &CacheDecision| {
            !options.cache_plan_probe
                || now_sec().saturating_sub(d.measured_at) < options.cache_plan_probe_interval_sec
        };
        let reused = stored
            .filter(fresh)
            .and_then(|d| KvKind::parse("kv_cache", &d.kind).ok().map(|k| (k, d)));
        let (kind, mut decision) = match reused {
            Some((kind, mut d)) => {
                d.source = "reused".into();
                (kind, d)
            }
            None => {
                let before = self.forward.kv_kinds();
                let measured = self.measure_kv_kinds(options, context).await;
                let (kind, mut d) = match measured {
                    Ok(m) => m,
                    Err(e) => {
                        // leave the session as it was loaded (measuring resized its cache)
                        self.cached.clear();
                        self.forward.set_kv(before, context).await?;
                        return Err(e);
                    }
                };
                d.stored_at = store.location(&key);
                // a decision that cannot be kept still holds for this load
                if let Err(e) = store.save(&key, &d).await {
                    d.stored_at = None;
                    d.notice = Some(match d.notice.take() {
                        Some(n) => format!("{n}; not stored: {e}"),
                        None => format!("not stored: {e}"),
                    });
                }
                (kind, d)
            }
        };
        decision.stored_at = decision.stored_at.or_else(|| store.location(&key));
        self.cached.clear();
        self.forward.set_kv(KvKinds::both(kind), context).await?;
        self.cache_decision = Some(decision.clone());
        Ok(decision)
    }

    /// Steps 1–3 of the plan on this session's model; the cache is left in some kind (the
    /// caller sets the chosen one).
    async fn measure_kv_kinds(
        &mut self,
        options: &CachePlanOptions,
        context: usize,
    ) -> Result<(KvKind, CacheDecision)> {
        let config = self.config().clone();
        let kv_dim = config.kv_dim();
        // local layers keep rings rather than the context (as the loaded cache does)
        let layout = crate::config::KvLayout::trained(&config, context, self.forward.chunk());
        let budget = options
            .cache_budget_mb
            .map(|mb| (mb * f64::from(1u32 << 20)) as u64);
        let mut candidates: Vec<CacheCandidate> = KvKind::ALL
            .iter()
            .map(|&kind| {
                let per_token = layout.position_bytes(KvKinds::both(kind).row_bytes(kv_dim));
                let bytes = layout.sequence_bytes(KvKinds::both(kind).row_bytes(kv_dim));
                CacheCandidate {
                    kind: kind.name().into(),
                    bytes,
                    bytes_per_token: per_token,
                    dropped: budget.filter(|&b| bytes > b).map(|b| {
                        format!(
                            "its cache for {context} positions needs {:.3} MiB, over the budget of {:.3} MiB",
                            mib(bytes),
                            mib(b)
                        )
                    }),
                    delta_nll: None,
                    ppl_ratio: None,
                    mean_kl: None,
                    decode_tok_s: None,
                }
            })
            .collect();
        let cal = self.calibration(options, context)?;
        // the f32 reference, then every kind within the budget
        let reference = self.calibration_logits(KvKinds::default(), &cal).await?;
        for (c, &kind) in candidates.iter_mut().zip(&KvKind::ALL) {
            if c.dropped.is_some() {
                continue;
            }
            let rows = if kind == KvKind::F32 {
                reference.clone()
            } else {
                self.calibration_logits(KvKinds::both(kind), &cal).await?
            };
            let vocab = config.vocab_size;
            // row i predicts tokens[prompt_len + i]
            let targets = &cal.tokens[cal.prompt_len - 1..];
            let d = mean_nll(&rows, targets, vocab, 0) - mean_nll(&reference, targets, vocab, 0);
            let kl = mean_kl(&reference, &rows, vocab, 0);
            c.delta_nll = Some(d);
            c.ppl_ratio = Some(crate::math::exp(d));
            c.mean_kl = Some(kl);
            let mut failed = Vec::new();
            if d > options.cache_quality_max_delta_nll {
                failed.push(format!(
                    "NLL +{d:.4} > cache_quality_max_delta_nll {}",
                    options.cache_quality_max_delta_nll
                ));
            }
            if crate::math::exp(d) > options.cache_quality_max_ppl_ratio {
                failed.push(format!(
                    "perplexity ratio {:.4} > cache_quality_max_ppl_ratio {}",
                    crate::math::exp(d),
                    options.cache_quality_max_ppl_ratio
                ));
            }
            if kl > options.cache_quality_max_mean_kl {
                failed.push(format!(
                    "mean KL {kl:.4} > cache_quality_max_mean_kl {}",
                    options.cache_quality_max_mean_kl
                ));
            }
            if !failed.is_empty() {
                c.dropped = Some(failed.join("; "));
            }
        }
        let survivors: Vec<usize> = (0..candidates.len())
            .filter(|&i| candidates[i].dropped.is_none())
            .collect();
        if options.cache_auto_benchmark && survivors.len() > 1 {
            for &i in &survivors {
                let speed = self.decode_speed(KvKind::ALL[i], options).await?;
                candidates[i].decode_tok_s = Some(speed);
            }
        }
        let mut notice = None;
        let chosen = if survivors.is_empty() {
            let f32_fits = budget.is_none_or(|b| candidates[0].bytes <= b);
            if !f32_fits {
                return Err(Error::invalid(
                    "cache_budget_mb",
                    format!(
                        "no KV-cache kind passes the quality gates within the budget of {:.3} MiB for {context} positions, and the f32 cache needs {:.3} MiB ({})",
                        mib(budget.unwrap_or(0)),
                        mib(candidates[0].bytes),
                        candidates
                            .iter()
                            .map(|c| format!("{}: {}", c.kind, c.dropped.as_deref().unwrap_or("passed")))
                            .collect::<Vec<_>>()
                            .join("; ")
                    ),
                ));
            }
            notice = Some("no kind passed the quality gates within the budget; using f32".into());
            0
        } else if options.cache_auto_benchmark && survivors.len() > 1 {
            // fastest; the smaller on a tie
            *survivors
                .iter()
                .max_by(|&&a, &&b| {
                    let (sa, sb) = (candidates[a].decode_tok_s, candidates[b].decode_tok_s);
                    sa.partial_cmp(&sb)
                        .unwrap_or(std::cmp::Ordering::Equal)
                        .then(candidates[b].bytes.cmp(&candidates[a].bytes))
                })
                .unwrap_or(&survivors[0])
        } else {
            *survivors
                .iter()
                .min_by_key(|&&i| candidates[i].bytes)
                .unwrap_or(&survivors[0])
        };
        let kind = KvKind::ALL[chosen];
        Ok((
            kind,
            CacheDecision {
                kind: kind.name().into(),
                source: "measured".into(),
                measured_at: now_sec(),
                budget_mb: options.cache_budget_mb,
                context,
                candidates,
                notice,
                stored_at: None,
            },
        ))
    }

    /// Tokenizes the calibration sequence: the fact, prose up to `cache_quality_prompt_len`
    /// tokens with the question at the end, then the answer (more prose if the answer is
    /// shorter than the decode steps), all cut to the context.
    fn calibration(&self, options: &CachePlanOptions, context: usize) -> Result<Calibration> {
        let tok = &self.tokenizer;
        let steps = options.cache_quality_decode_steps;
        let fact = tok.encode(NEEDLE, false, None)?;
        let question = tok.encode(QUESTION, false, Some(false))?;
        let answer_text = tok.encode(ANSWER, false, Some(false))?;
        let prose = tok.encode(CALIBRATION, false, Some(false))?;
        if prose.is_empty() || question.is_empty() {
            return Err(Error::invalid(
                "tokenizer",
                "the calibration text encodes to nothing",
            ));
        }
        let prompt_len = options
            .cache_quality_prompt_len
            .min(context.saturating_sub(steps + 1))
            .max(fact.len() + question.len() + 1);
        let room = prompt_len - fact.len() - question.len();
        let mut tokens = fact;
        tokens.extend(prose.iter().cycle().take(room));
        tokens.extend(&question);
        let mut answer = answer_text;
        answer.extend(
            prose
                .iter()
                .cycle()
                .take((steps + 1).saturating_sub(answer.len())),
        );
        answer.truncate(steps + 1);
        tokens.extend(answer);
        if tokens.len() > context {
            return Err(Error::invalid(
                "context",
                format!(
                    "{context} positions cannot hold the cache plan's calibration ({} tokens: the fact, question and {} decode steps)",
                    tokens.len(),
                    steps
                ),
            ));
        }
        Ok(Calibration { tokens, prompt_len })
    }

    /// The logits, with the cache in `kinds`, of the rows that predict the answer: the
    /// prompt's last row (its other rows skip the head), then one row per decode step.
    async fn calibration_logits(&mut self, kinds: KvKinds, cal: &Calibration) -> Result<Vec<f32>> {
        self.cached.clear();
        self.forward.set_kv(kinds, cal.tokens.len()).await?;
        let prompt = &cal.tokens[..cal.prompt_len];
        let mut rows = self.forward.forward(prompt, false).await?;
        // the last token is only predicted, never fed
        for &t in &cal.tokens[cal.prompt_len..cal.tokens.len() - 1] {
            rows.extend(self.forward.forward(&[t], false).await?);
        }
        self.forward.truncate(0)?;
        Ok(rows)
    }

    /// Decode tokens per second with the cache in `kind` (after one untimed step).
    async fn decode_speed(&mut self, kind: KvKind, options: &CachePlanOptions) -> Result<f64> {
        let prompt = options.cache_auto_bench_prompt_len;
        let steps = options.cache_auto_bench_steps;
        let len = (prompt + steps + 1).min(self.config().context_length);
        self.cached.clear();
        self.forward.set_kv(KvKinds::both(kind), len).await?;
        let bos = self.tokenizer.bos_id().unwrap_or(0);
        let tokens: Vec<u32> = (0..len as u32)
            .map(|i| (bos + i) % self.config().vocab_size as u32)
            .collect();
        let prompt = prompt.min(len.saturating_sub(steps + 1)).max(1);
        self.forward
            .run(Rows::Next(&tokens[..prompt]), Readback::None)
            .await?;
        self.forward
            .run(Rows::Next(&tokens[prompt..prompt + 1]), Readback::LastRow)
            .await?;
        let start = Instant::now();
        let mut ran = 0usize;
        for &t in &tokens[prompt + 1..] {
            self.forward
                .run(Rows::Next(&[t]), Readback::LastRow)
                .await?;
            ran += 1;
        }
        let secs = start.elapsed().as_secs_f64().max(1e-9);
        self.forward.truncate(0)?;
        Ok(ran as f64 / secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_validated_by_name() {
        assert!(CachePlanOptions::default().validate().is_ok());
        let bad = CachePlanOptions {
            cache_budget_mb: Some(-1.0),
            ..CachePlanOptions::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("cache_budget_mb"));
        let bad = CachePlanOptions {
            cache_quality_max_ppl_ratio: 0.9,
            ..CachePlanOptions::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("cache_quality_max_ppl_ratio"));
    }
}
