//! Logit processing and token drawing.

use std::collections::BTreeMap;

use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha20Rng;

use crate::candidates::saturate;
use crate::candidates::{LogitAdjustment, OpenAiPenalty};
use crate::sampling::params::draw_seed;
use crate::sampling::{Checked, SamplingParams, TokenMask};
use crate::{Error, Result};

use super::filters::{self, Pipeline};
pub use super::logits::log_softmax;
use super::logits::{argmax, check_logits, draw, ix, key, log_sum_exp, max_f64, uniform, weight};

/// The chosen token and its log-probability under the model's raw distribution (log-softmax of
/// the logits as the model produced them, before any processor).
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    /// Token id.
    pub id: u32,
    /// Log-probability of `id` under the raw logits.
    pub logprob: f32,
    /// The most likely tokens under the raw logits, most likely first (ties to the lower id),
    /// as many as [`Sampler::set_top_logprobs`] asked for (empty by default).
    pub top: Vec<TopLogprob>,
}

/// Most alternatives [`Sampler::set_top_logprobs`] accepts (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One of the most likely tokens at a step, with its log-probability under the raw logits.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
#[cfg_attr(target_arch = "wasm32", derive(tsify::Tsify))]
pub struct TopLogprob {
    /// Token id.
    pub id: u32,
    /// Its log-probability under the raw logits.
    pub logprob: f32,
}

/// The `n` largest of `logits` as log-probabilities (`lse`: their log-sum-exp), largest first,
/// ties to the lower id. `logits` must be finite.
pub(super) fn top_logprobs(logits: &[f32], lse: f64, n: usize) -> Vec<TopLogprob> {
    let n = n.min(logits.len());
    if n == 0 {
        return Vec::new();
    }
    let mut keys: Vec<u64> = logits
        .iter()
        .enumerate()
        .map(|(i, &x)| key(x, i as u32))
        .collect();
    keys.select_nth_unstable(n - 1);
    keys.truncate(n);
    keys.sort_unstable();
    keys.into_iter()
        .map(|k| {
            let id = k as u32;
            TopLogprob {
                id,
                logprob: (f64::from(logits[ix(id)]) - lse) as f32,
            }
        })
        .collect()
}

/// Draws tokens from logits according to [`SamplingParams`]; see the [module
/// documentation](crate::sampling) for what each parameter does and in which order. A clone
/// continues the same random sequence independently.
#[derive(Clone, Debug)]
pub struct Sampler {
    pub(super) params: SamplingParams,
    /// The filters after temperature, built once from `params`.
    pub(super) pipeline: Pipeline,
    pub(super) rng: ChaCha20Rng,
    seed: u64,
    pub(super) vocab_size: usize,
    /// The tokens a constraint allows at the next draw (`None`: all).
    pub(super) mask: Option<TokenMask>,
    /// Alternatives reported with each draw ([`Sampled::top`]).
    pub(super) top_logprobs: usize,
}

impl Sampler {
    /// Checks `params` for `vocab_size` ([`SamplingParams::check`]) and builds the sampler.
    pub fn new(params: &SamplingParams, vocab_size: usize) -> Result<Self> {
        Self::checked(&params.check(vocab_size)?)
    }

    /// A sampler of parameters already checked; seeds the RNG from the seed or
    /// [`draw_seed`] (the only failure: the system random source).
    pub fn checked(params: &Checked) -> Result<Self> {
        let seed = match params.seed {
            Some(seed) => seed,
            None => draw_seed()?,
        };
        Ok(Sampler {
            params: SamplingParams::clone(params),
            pipeline: Pipeline::of(params, params.vocab_size()),
            rng: ChaCha20Rng::seed_from_u64(seed),
            seed,
            vocab_size: params.vocab_size(),
            mask: None,
            top_logprobs: 0,
        })
    }

    /// Reports the `n` most likely tokens (under the raw logits) with every draw, `0..=20`
    /// ([`MAX_TOP_LOGPROBS`]). On the GPU's candidate path this asks for at least `n`
    /// candidates, and reads the whole row when logit adjustments or a constraint reorder them.
    pub fn set_top_logprobs(&mut self, n: usize) -> Result<()> {
        if n > MAX_TOP_LOGPROBS {
            return Err(Error::invalid(
                "top_logprobs",
                format!("must be in 0..={MAX_TOP_LOGPROBS}, got {n}"),
            ));
        }
        self.top_logprobs = n;
        Ok(())
    }

    /// The seed in use (reported to users so a run can be repeated).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The sampler of sequence `sequence` of a call's `num_return_sequences`: the same seed and
    /// parameters, its own random stream (sequence 0's is this sampler's at its start), so a
    /// sequence draws the same tokens whether it runs alone, after the others, or beside them.
    pub fn for_sequence(&self, sequence: usize) -> Self {
        let mut rng = ChaCha20Rng::seed_from_u64(self.seed);
        rng.set_stream(sequence as u64);
        Self {
            params: self.params.clone(),
            pipeline: self.pipeline.clone(),
            rng,
            seed: self.seed,
            vocab_size: self.vocab_size,
            mask: None,
            top_logprobs: self.top_logprobs,
        }
    }

    /// Restricts the next draws to the tokens `mask` allows (`None` lifts the restriction).
    /// The mask acts before every processor: a forbidden token is gone, and the bias,
    /// penalties, temperature and filters work on the allowed ones, so a draw is an
    /// unconstrained draw from the allowed set renormalised. A mask of another length, or one
    /// that allows nothing -> Error.
    pub fn set_mask(&mut self, mask: Option<TokenMask>) -> Result<()> {
        if let Some(m) = &mask {
            if m.len() != self.vocab_size {
                return Err(Error::invalid(
                    "mask",
                    format!(
                        "covers {} tokens but the vocabulary has {}",
                        m.len(),
                        self.vocab_size
                    ),
                ));
            }
            if m.count() == 0 {
                return Err(Error::invalid(
                    "response_format",
                    "the constraint allows no token at this point",
                ));
            }
        }
        self.mask = mask;
        Ok(())
    }

    /// The mask the next draw obeys, if any.
    pub fn mask(&self) -> Option<&TokenMask> {
        self.mask.as_ref()
    }

    /// The parameters this sampler was built with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Rejects a history holding a token id outside the vocabulary.
    pub(super) fn check_history(&self, name: &'static str, tokens: &[u32]) -> Result<()> {
        if let Some((i, id)) = tokens
            .iter()
            .enumerate()
            .find(|&(_, &id)| ix(id) >= self.vocab_size)
        {
            return Err(Error::invalid(
                name,
                format!(
                    "token ids must be in 0..{} (the vocabulary), got {id} at position {i}",
                    self.vocab_size
                ),
            ));
        }
        Ok(())
    }

    /// The parts of `prompt` and `generated` inside the penalty window: the last
    /// `penalty_last_n` tokens of `prompt ++ generated` (everything when it is 0).
    fn window<'a>(&self, prompt: &'a [u32], generated: &'a [u32]) -> (&'a [u32], &'a [u32]) {
        let n = self.params.penalty_last_n;
        if n == 0 {
            return (prompt, generated);
        }
        let generated = &generated[generated.len().saturating_sub(n)..];
        let from_prompt = n - generated.len();
        (
            &prompt[prompt.len().saturating_sub(from_prompt)..],
            generated,
        )
    }

    /// Applies, in place and in this order: logit bias -> repetition penalty (HF: over the
    /// distinct tokens of prompt+generated within the penalty_last_n window; positive logits
    /// divided by r, negative multiplied) -> presence/frequency penalties (OpenAI: over generated
    /// tokens within the window: logit -= presence*[count>0] + frequency*count) -> temperature
    /// (divide; skipped when greedy) -> top-k -> typical -> top-p -> min-p (min-p keeps tokens
    /// whose probability >= min_p * max probability). Filtered tokens become f32::NEG_INFINITY;
    /// every filter keeps at least one token. When greedy, the filters are replaced by keeping
    /// only the argmax (lowest id on ties). `logits.len()` must equal the vocab size; non-finite
    /// input logits -> Error (name index), never a NaN draw.
    ///
    /// `prompt`: the prompt tokens; `generated`: tokens generated so far in this sequence.
    pub fn process(&self, logits: &mut [f32], prompt: &[u32], generated: &[u32]) -> Result<()> {
        if logits.len() != self.vocab_size {
            return Err(Error::invalid(
                "logits",
                format!(
                    "length must equal the vocabulary size {}, got {}",
                    self.vocab_size,
                    logits.len()
                ),
            ));
        }
        check_logits(logits)?;
        let p = &self.params;
        // A forbidden token is gone before any processor; the processors below leave `-inf`
        // as it is.
        if let Some(mask) = &self.mask {
            mask.apply(logits);
        }

        // Each token's adjustments depend only on its own logit, so applying them token by
        // token gives the same values as applying each processor to the whole row in turn.
        for a in self.adjustments(prompt, generated)? {
            let x = logits[ix(a.id)];
            if x != f32::NEG_INFINITY {
                logits[ix(a.id)] = a.apply(x);
            }
        }

        if p.is_greedy() {
            let best = argmax(logits);
            for (i, x) in logits.iter_mut().enumerate() {
                if i != best {
                    *x = f32::NEG_INFINITY;
                }
            }
            return Ok(());
        }

        if p.temperature != 1.0 {
            let t = f64::from(p.temperature);
            for x in logits.iter_mut().filter(|x| **x != f32::NEG_INFINITY) {
                *x = saturate(f64::from(*x) / t);
            }
        }

        // Only allowed tokens are candidates (all of them without a mask).
        let allowed = match &self.mask {
            Some(mask) => mask.count(),
            None => logits.len(),
        };
        if self.pipeline.idle(allowed) {
            return Ok(());
        }

        // The surviving candidates, as keys that sort by logit; each filter sorts only as much
        // as it needs.
        let mut cand: Vec<u64> = logits
            .iter()
            .enumerate()
            .filter(|(_, &x)| x != f32::NEG_INFINITY)
            .map(|(i, &x)| key(x, i as u32))
            .collect();
        filters::run(self.pipeline.filters(), logits, &mut cand);
        Ok(())
    }

    /// The bias and penalties for `prompt` and `generated`, one entry per affected token,
    /// sorted by id: what [`Self::process`] applies before temperature. Ids of `logit_bias`
    /// outside the vocabulary are left out; a history id outside it -> Error.
    pub fn adjustments(&self, prompt: &[u32], generated: &[u32]) -> Result<Vec<LogitAdjustment>> {
        self.check_history("prompt", prompt)?;
        self.check_history("generated", generated)?;
        let p = &self.params;
        let mut map: BTreeMap<u32, LogitAdjustment> = BTreeMap::new();
        fn at(map: &mut BTreeMap<u32, LogitAdjustment>, id: u32) -> &mut LogitAdjustment {
            map.entry(id).or_insert(LogitAdjustment {
                id,
                bias: None,
                repetition: None,
                penalty: None,
            })
        }
        for (&id, &bias) in &p.logit_bias {
            if ix(id) < self.vocab_size {
                at(&mut map, id).bias = Some(bias);
            }
        }
        let (prompt_window, generated_window) = self.window(prompt, generated);
        if p.repetition_penalty != 1.0 {
            for &id in prompt_window.iter().chain(generated_window) {
                at(&mut map, id).repetition = Some(p.repetition_penalty);
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            let mut counted = generated_window.to_vec();
            counted.sort_unstable();
            for run in counted.chunk_by(|a, b| a == b) {
                at(&mut map, run[0]).penalty = Some(OpenAiPenalty {
                    presence: p.presence_penalty,
                    frequency: p.frequency_penalty,
                    count: run.len() as u32,
                });
            }
        }
        Ok(map.into_values().collect())
    }

    /// Processes a copy of `logits` and draws one token. Greedy: the argmax of the processed
    /// logits, ties to the lowest id, with no random draw. Otherwise exactly one uniform draw
    /// `u` in `[0, 1)` and inverse-CDF over the softmax of the survivors in token-id order: the
    /// first id whose cumulative probability exceeds `u`. Returns the id and its logprob per
    /// [`Sampled`].
    pub fn sample(&mut self, logits: &[f32], prompt: &[u32], generated: &[u32]) -> Result<Sampled> {
        let mut work = logits.to_vec();
        self.process(&mut work, prompt, generated)?;
        let id = if self.params.is_greedy() {
            argmax(&work)
        } else {
            draw(&work, uniform(&mut self.rng))
        };
        let lse = log_sum_exp(logits);
        Ok(Sampled {
            id: id as u32,
            logprob: (f64::from(logits[id]) - lse) as f32,
            top: top_logprobs(logits, lse, self.top_logprobs),
        })
    }

    /// The probability distribution `sample` would draw from (softmax of the processed logits;
    /// zeros for filtered tokens). For tests and for inspection.
    pub fn distribution(
        &self,
        logits: &[f32],
        prompt: &[u32],
        generated: &[u32],
    ) -> Result<Vec<f64>> {
        let mut work = logits.to_vec();
        self.process(&mut work, prompt, generated)?;
        let max = max_f64(work.iter().copied());
        let total: f64 = work.iter().map(|&x| weight(x, max)).sum();
        Ok(work.iter().map(|&x| weight(x, max) / total).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(params: SamplingParams, vocab: usize) -> Sampler {
        match Sampler::new(&params, vocab) {
            Ok(s) => s,
            Err(e) => panic!("sampler: {e}"),
        }
    }

    #[test]
    fn window_takes_the_last_n_tokens_of_the_history() {
        let mut params = SamplingParams {
            seed: Some(1),
            penalty_last_n: 4,
            ..SamplingParams::unfiltered()
        };
        let s = sampler(params.clone(), 10);
        let (p, g) = s.window(&[1, 2, 3, 4], &[5, 6]);
        assert_eq!((p, g), (&[3u32, 4][..], &[5u32, 6][..]));
        let (p, g) = s.window(&[1, 2], &[3, 4, 5, 6, 7]);
        assert_eq!((p, g), (&[][..], &[4u32, 5, 6, 7][..]));
        params.penalty_last_n = 100;
        let s = sampler(params, 10);
        let (p, g) = s.window(&[1, 2], &[3]);
        assert_eq!((p, g), (&[1u32, 2][..], &[3u32][..]));
    }

    #[test]
    fn extreme_temperature_saturates_instead_of_overflowing() {
        let params = SamplingParams {
            temperature: 1e-30,
            seed: Some(3),
            ..SamplingParams::unfiltered()
        };
        let mut s = sampler(params, 3);
        let logits = [3e38, -3e38, 1.0];
        let dist = s.distribution(&logits, &[], &[]).unwrap_or_default();
        assert!(dist.iter().all(|p| p.is_finite()), "{dist:?}");
        assert_eq!(dist[0], 1.0);
        let drawn = s.sample(&logits, &[], &[]).map(|t| t.id).ok();
        assert_eq!(drawn, Some(0));
    }

    #[test]
    fn top_k_only_keeps_exactly_k() {
        let params = SamplingParams {
            top_k: 2,
            seed: Some(5),
            ..SamplingParams::unfiltered()
        };
        let s = sampler(params, 5);
        let mut logits = [0.5, 2.0, 2.0, 1.0, 2.0];
        assert!(s.process(&mut logits, &[], &[]).is_ok());
        // Three-way tie at 2.0: the two lowest ids survive.
        let inf = f32::NEG_INFINITY;
        assert_eq!(logits, [inf, 2.0, 2.0, inf, inf]);
    }
}
