//! Logit processing and token drawing.

use std::collections::BTreeMap;

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

use crate::candidates::saturate;
use crate::candidates::{
    Candidates, LogitAdjustment, OpenAiPenalty, SelectRequest, MAX_ADJUSTMENTS, MAX_CANDIDATES,
};
use crate::sampling::params::draw_seed;
use crate::sampling::SamplingParams;
use crate::{Error, Result};

/// Candidates asked for beyond what greedy or top-k strictly need: the slack that lets the
/// exactness check pass when a penalised token's GPU value differs in the last bit.
const CANDIDATE_MARGIN: usize = 16;

/// Relative error allowed for the GPU's f32 tail sum (exp and summation rounding) when bounding
/// the total probability mass for top-p.
const TAIL_SUM_TOLERANCE: f64 = 1e-3;

/// Relative slack for the order in which the full path adds its f64 weights.
const F64_SUM_TOLERANCE: f64 = 1e-12;

/// The chosen token and its log-probability under the model's raw distribution (log-softmax of
/// the logits as the model produced them, before any processor).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampled {
    /// Token id.
    pub id: u32,
    /// Log-probability of `id` under the raw logits.
    pub logprob: f32,
}

/// Rejects empty or non-finite logits, naming the first bad index.
fn check_logits(logits: &[f32]) -> Result<()> {
    if logits.is_empty() {
        return Err(Error::invalid("logits", "must not be empty, got 0 logits"));
    }
    if let Some((i, x)) = logits.iter().enumerate().find(|(_, x)| !x.is_finite()) {
        return Err(Error::invalid(
            "logits",
            format!("every logit must be finite, got {x} at index {i}"),
        ));
    }
    Ok(())
}

/// Largest element as f64; `-inf` for an empty slice or one holding only `-inf`.
fn max_f64(values: impl Iterator<Item = f32>) -> f64 {
    values.fold(f64::NEG_INFINITY, |m, x| m.max(f64::from(x)))
}

/// `exp(x - max)`, exactly zero for filtered (`-inf`) logits.
fn weight(x: f32, max: f64) -> f64 {
    if x == f32::NEG_INFINITY {
        0.0
    } else {
        (f64::from(x) - max).exp()
    }
}

/// Log of the sum of exponentials of finite, non-empty `logits`, in f64.
fn log_sum_exp(logits: &[f32]) -> f64 {
    let max = max_f64(logits.iter().copied());
    let sum: f64 = logits.iter().map(|&x| weight(x, max)).sum();
    max + sum.ln()
}

/// Log-softmax of `logits` (`[vocab]`), computed stably in f64 and returned as f32; non-finite
/// input -> Error naming the first bad index.
pub fn log_softmax(logits: &[f32]) -> Result<Vec<f32>> {
    check_logits(logits)?;
    let lse = log_sum_exp(logits);
    Ok(logits
        .iter()
        .map(|&x| (f64::from(x) - lse) as f32)
        .collect())
}

/// A uniform draw in `[0, 1)` from the top 53 bits of one `u64`, identical on every target.
fn uniform(rng: &mut ChaCha20Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Token `i` as an index into the logits (ids are checked against the vocabulary beforehand).
fn ix(id: u32) -> usize {
    id as usize
}

/// A candidate token as one sortable integer: the high half ranks its logit (a larger logit
/// gives a smaller key) and the low half is its id, so ascending keys order candidates by logit,
/// largest first, ties to the lower id. `logit` must not be NaN.
fn key(logit: f32, id: u32) -> u64 {
    // `+ 0.0` turns -0.0 into +0.0 so that the two compare equal, as floats do.
    let bits = (logit + 0.0).to_bits();
    // An unsigned integer that grows with the float.
    let ascending = if bits >> 31 == 1 {
        !bits
    } else {
        bits | 0x8000_0000
    };
    (u64::from(!ascending) << 32) | u64::from(id)
}

/// The token id held in a [`key`].
fn id_of(key: u64) -> usize {
    ix(key as u32)
}

/// Index of the largest logit, ties to the lowest index; `logits` must not be empty.
fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best
}

/// Inverse-CDF draw over the softmax of `work` in index order: the first index whose
/// cumulative weight exceeds `u` times the total (`u` in `[0, 1)`).
fn draw(work: &[f32], u: f64) -> usize {
    let max = max_f64(work.iter().copied());
    let total: f64 = work.iter().map(|&x| weight(x, max)).sum();
    let target = u * total;
    let mut cumulative = 0.0;
    let mut last = 0;
    for (i, &x) in work.iter().enumerate() {
        let w = weight(x, max);
        if w > 0.0 {
            cumulative += w;
            last = i;
            if cumulative > target {
                return i;
            }
        }
    }
    // Rounding can leave the running sum a hair below `target`: take the last survivor.
    last
}

/// The filters after top-k, on the survivors `cand` (keys) of `logits`: typical, top-p and
/// min-p, each when asked for. Reads nothing outside `cand`.
fn filter_candidates(
    logits: &mut [f32],
    cand: &mut Vec<u64>,
    p: &SamplingParams,
    use_typical: bool,
    use_top_p: bool,
    use_min_p: bool,
) {
    if use_typical {
        typical(logits, cand, f64::from(p.typical_p));
    }
    if use_top_p {
        top_p(logits, cand, f64::from(p.top_p));
    }
    if use_min_p {
        min_p(logits, cand, f64::from(p.min_p));
    }
}

/// Removes the `removed` candidates by setting their logits to `-inf`.
fn filter_out(logits: &mut [f32], removed: &[u64]) {
    for &k in removed {
        logits[id_of(k)] = f32::NEG_INFINITY;
    }
}

/// Puts the smallest `items` first in ascending order, only as far as needed, and returns the
/// length of the shortest such prefix whose weights add up to `target` (all of them when rounding
/// keeps the full sum just below it). Sorts the smallest 256 first, then up to four times as many
/// as are sorted so far, and so on: a peaked distribution never sorts the whole vocabulary.
fn shortest_prefix<T: Ord + Copy>(
    items: &mut [T],
    target: f64,
    weight: impl Fn(T) -> f64,
) -> usize {
    let mut sorted = 0;
    let mut cumulative = 0.0;
    loop {
        let head = items.len().min((sorted * 4).max(256));
        let rest = &mut items[sorted..];
        let grow = head - sorted;
        if grow < rest.len() {
            // grow >= 1 here: head > sorted whenever items remain.
            rest.select_nth_unstable(grow - 1);
        }
        rest[..grow].sort_unstable();
        for (i, &item) in items[sorted..head].iter().enumerate() {
            cumulative += weight(item);
            if cumulative >= target {
                return sorted + i + 1;
            }
        }
        if head == items.len() {
            return head;
        }
        sorted = head;
    }
}

/// Locally typical sampling (Meister et al.; the Hugging Face `TypicalLogitsWarper`): orders the
/// candidates by how far their surprisal `-log p` is from the entropy of the candidate
/// distribution (closest first, ties to the lower id) and keeps the shortest prefix of that
/// order whose probability reaches `mass`.
fn typical(logits: &mut [f32], cand: &mut Vec<u64>, mass: f64) {
    if cand.len() <= 1 {
        return;
    }
    let max = max_f64(cand.iter().map(|&k| logits[id_of(k)]));
    let sum: f64 = cand.iter().map(|&k| weight(logits[id_of(k)], max)).sum();
    let lse = max + sum.ln();
    let logprob = |id: usize| f64::from(logits[id]) - lse;
    let entropy: f64 = -cand
        .iter()
        .map(|&k| {
            let lp = logprob(id_of(k));
            lp.exp() * lp
        })
        .sum::<f64>();
    // (distance from the entropy, id); a non-negative f64's bits order like its value.
    let mut scored: Vec<(u64, u32)> = cand
        .iter()
        .map(|&k| {
            let id = id_of(k);
            ((-logprob(id) - entropy).abs().to_bits(), k as u32)
        })
        .collect();
    let keep = shortest_prefix(&mut scored, mass, |(_, id)| logprob(ix(id)).exp());
    cand.clear();
    cand.extend(
        scored[..keep]
            .iter()
            .map(|&(_, id)| key(logits[ix(id)], id)),
    );
    for &(_, id) in &scored[keep..] {
        logits[ix(id)] = f32::NEG_INFINITY;
    }
}

/// Nucleus sampling: keeps the shortest prefix of the candidates, ordered by logit (largest
/// first, ties to the lower id), whose probability reaches `top_p`.
fn top_p(logits: &mut [f32], cand: &mut Vec<u64>, top_p: f64) {
    let max = max_f64(cand.iter().map(|&k| logits[id_of(k)]));
    let total: f64 = cand.iter().map(|&k| weight(logits[id_of(k)], max)).sum();
    let keep = shortest_prefix(cand, top_p * total, |k| weight(logits[id_of(k)], max));
    filter_out(logits, &cand[keep..]);
    cand.truncate(keep);
}

/// Min-p: keeps the candidates whose probability is at least `min_p` times the largest one.
fn min_p(logits: &mut [f32], cand: &mut Vec<u64>, min_p: f64) {
    let max = max_f64(cand.iter().map(|&k| logits[id_of(k)]));
    // p / p_max = exp(logit - max_logit) >= min_p  <=>  logit - max_logit >= ln(min_p).
    let threshold = min_p.ln();
    cand.retain(|&k| {
        let keep = f64::from(logits[id_of(k)]) - max >= threshold;
        if !keep {
            logits[id_of(k)] = f32::NEG_INFINITY;
        }
        keep
    });
}

/// Draws tokens from logits according to [`SamplingParams`]; see the [module
/// documentation](crate::sampling) for what each parameter does and in which order. A clone
/// continues the same random sequence independently.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha20Rng,
    seed: u64,
    vocab_size: usize,
}

impl Sampler {
    /// Validates `params` for `vocab_size`, seeds the RNG from params.seed or [`draw_seed`].
    pub fn new(params: &SamplingParams, vocab_size: usize) -> Result<Self> {
        if vocab_size == 0 || u32::try_from(vocab_size - 1).is_err() {
            return Err(Error::invalid(
                "vocab_size",
                format!("must be in 1..=4294967296, got {vocab_size}"),
            ));
        }
        params.validate_for_vocab(vocab_size)?;
        let seed = match params.seed {
            Some(seed) => seed,
            None => draw_seed()?,
        };
        Ok(Sampler {
            params: params.clone(),
            rng: ChaCha20Rng::seed_from_u64(seed),
            seed,
            vocab_size,
        })
    }

    /// The seed in use (reported to users so a run can be repeated).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The parameters this sampler was built with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Rejects a history holding a token id outside the vocabulary.
    fn check_history(&self, name: &'static str, tokens: &[u32]) -> Result<()> {
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

        // Each token's adjustments depend only on its own logit, so applying them token by
        // token gives the same values as applying each processor to the whole row in turn.
        for a in self.adjustments(prompt, generated)? {
            logits[ix(a.id)] = a.apply(logits[ix(a.id)]);
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
            for x in logits.iter_mut() {
                *x = saturate(f64::from(*x) / t);
            }
        }

        let use_top_k = p.top_k > 0 && p.top_k < logits.len();
        let use_typical = p.typical_p < 1.0;
        let use_top_p = p.top_p < 1.0;
        let use_min_p = p.min_p > 0.0;
        if !(use_top_k || use_typical || use_top_p || use_min_p) {
            return Ok(());
        }

        // The surviving candidates, as keys that sort by logit; each filter sorts only as much
        // as it needs.
        let mut cand: Vec<u64> = logits
            .iter()
            .enumerate()
            .map(|(i, &x)| key(x, i as u32))
            .collect();
        if use_top_k {
            cand.select_nth_unstable(p.top_k - 1);
            filter_out(logits, &cand[p.top_k..]);
            cand.truncate(p.top_k);
            // In logit order, so that the sums below do not depend on how the selection left
            // them (and a kept set read from elsewhere gives the same bits).
            cand.sort_unstable();
        }
        filter_candidates(logits, &mut cand, p, use_typical, use_top_p, use_min_p);
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

    /// What the GPU should select for the next token when the candidates can stand in for the
    /// whole row, or `None` when they cannot by the parameters alone (read the row instead):
    /// greedy -> a few candidates; `top_k <= MAX_CANDIDATES` -> top_k plus a margin; top-p
    /// without top-k or typical -> [`MAX_CANDIDATES`]; a vocabulary of at most
    /// [`MAX_CANDIDATES`] -> all of it. `None` too with more than [`MAX_ADJUSTMENTS`]
    /// adjusted tokens. History ids outside the vocabulary -> Error.
    pub fn select_request(
        &self,
        prompt: &[u32],
        generated: &[u32],
    ) -> Result<Option<SelectRequest>> {
        let adjustments = self.adjustments(prompt, generated)?;
        if adjustments.len() > MAX_ADJUSTMENTS {
            return Ok(None);
        }
        let p = &self.params;
        let n = self.vocab_size;
        let k = if n <= MAX_CANDIDATES {
            n
        } else if p.is_greedy() {
            1 + CANDIDATE_MARGIN
        } else if p.top_k > 0 && p.top_k < n {
            if p.top_k > MAX_CANDIDATES {
                return Ok(None);
            }
            p.top_k + CANDIDATE_MARGIN
        } else if p.top_p < 1.0 && p.typical_p >= 1.0 {
            MAX_CANDIDATES
        } else {
            return Ok(None);
        };
        Ok(Some(SelectRequest {
            n: n as u32,
            k: k.min(MAX_CANDIDATES).min(n) as u32,
            temperature: if p.is_greedy() { 1.0 } else { p.temperature },
            adjustments,
        }))
    }

    /// [`Self::sample`] from the GPU's selection `c` for `request` instead of the whole row:
    /// `Some` with exactly the token `sample` would return on the full row (and the same use of
    /// the random generator), or `None`, consuming nothing, when the candidates cannot prove it
    /// (read the whole row and call `sample`). The log-probability comes from the GPU's raw max
    /// and sum: it may differ from `sample`'s in the last bits.
    ///
    /// The adjusted logits of the candidates and of every adjusted token are recomputed here
    /// from their raw values with [`LogitAdjustment::apply`]; every other token's adjusted
    /// logit equals its raw one and, not being selected, is at most the last candidate's.
    /// From that bound the leading candidates whose place in the full order is certain are
    /// known; greedy and top-k need the kept tokens among them; top-p without top-k also needs
    /// the nucleus to end there for every total mass within the GPU's tail sum (with a
    /// tolerance) and a rigorous bound on it. Non-finite rows give `None` (then `sample`
    /// reports them).
    pub fn sample_candidates(
        &mut self,
        c: &Candidates,
        request: &SelectRequest,
        prompt: &[u32],
        generated: &[u32],
    ) -> Result<Option<Sampled>> {
        self.check_history("prompt", prompt)?;
        self.check_history("generated", generated)?;
        let n = self.vocab_size;
        let k = c.ids.len();
        if c.non_finite
            || c.n as usize != n
            || k == 0
            || c.raw.len() != k
            || c.adjusted.len() != k
            || c.adjusted_raw.len() != request.adjustments.len()
            || c.ids.iter().any(|&id| ix(id) >= n)
        {
            return Ok(None);
        }
        let adjustment = |id: u32| {
            request
                .adjustments
                .binary_search_by_key(&id, |a| a.id)
                .ok()
                .map(|i| &request.adjustments[i])
        };
        if k == n {
            // Every token is a candidate: rebuild the row and take the full path.
            let mut row = vec![0.0f32; n];
            for (&id, &raw) in c.ids.iter().zip(&c.raw) {
                row[ix(id)] = raw;
            }
            return self.sample(&row, prompt, generated).map(Some);
        }

        // The pool: candidates and adjusted tokens, as (id, raw, exact adjusted logit).
        let mut pool: Vec<(u32, f32, f32)> = Vec::with_capacity(k + request.adjustments.len());
        for (&id, &raw) in c.ids.iter().zip(&c.raw) {
            pool.push((id, raw, adjustment(id).map_or(raw, |a| a.apply(raw))));
        }
        let mut chosen: Vec<u32> = c.ids.clone();
        chosen.sort_unstable();
        for (a, &raw) in request.adjustments.iter().zip(&c.adjusted_raw) {
            if ix(a.id) < n && chosen.binary_search(&a.id).is_err() {
                pool.push((a.id, raw, a.apply(raw)));
            }
        }
        // Every token outside the pool has an adjusted logit of at most `bound`, and equal
        // to it only with an id above `bound_id`.
        let (bound, bound_id) = (c.adjusted[k - 1], c.ids[k - 1]);
        let p = &self.params;
        let logprob =
            |raw: f32| (f64::from(raw) - (f64::from(c.raw_max) + f64::from(c.raw_sum).ln())) as f32;

        if p.is_greedy() {
            let Some(&(id, raw, value)) = pool.iter().min_by_key(|e| key(e.2, e.0)) else {
                return Ok(None);
            };
            if key(value, id) > key(bound, bound_id) {
                return Ok(None);
            }
            return Ok(Some(Sampled {
                id,
                logprob: logprob(raw),
            }));
        }

        let t = f64::from(p.temperature);
        let scale = |x: f32| {
            if p.temperature != 1.0 {
                saturate(f64::from(x) / t)
            } else {
                x
            }
        };
        // (key of the processed logit, id, raw, processed logit), in the full order.
        let mut order: Vec<(u64, u32, f32, f32)> = pool
            .iter()
            .map(|&(id, raw, value)| {
                let s = scale(value);
                (key(s, id), id, raw, s)
            })
            .collect();
        order.sort_unstable_by_key(|e| e.0);
        let s_bound = scale(bound);
        // Whether a logit below `bound` can be processed into `s_bound` too (then an equal
        // processed value says nothing about the id order).
        let below_reaches = scale(bound.next_down()) >= s_bound;
        let certain = order
            .iter()
            .take_while(|e| e.3 > s_bound || (e.3 == s_bound && !below_reaches && e.1 <= bound_id))
            .count();

        let use_top_k = p.top_k > 0 && p.top_k < n;
        let use_typical = p.typical_p < 1.0;
        let use_top_p = p.top_p < 1.0;
        let use_min_p = p.min_p > 0.0;
        let (kept, filters) = if use_top_k {
            if certain < p.top_k {
                return Ok(None);
            }
            (p.top_k, (use_typical, use_top_p, use_min_p))
        } else if use_top_p && !use_typical {
            let Some(keep) = self.nucleus(c, &order[..certain], &pool, bound, n) else {
                return Ok(None);
            };
            (keep, (false, false, use_min_p))
        } else {
            return Ok(None);
        };

        // The kept tokens in id order, indexed 0.. in that order: keys over these indices sort
        // exactly as keys over the ids, so the filters and the draw see the same order.
        let mut kept: Vec<(u32, f32, f32)> = order[..kept]
            .iter()
            .map(|&(_, id, raw, s)| (id, raw, s))
            .collect();
        kept.sort_unstable_by_key(|e| e.0);
        let mut values: Vec<f32> = kept.iter().map(|e| e.2).collect();
        let mut cand: Vec<u64> = values
            .iter()
            .enumerate()
            .map(|(i, &x)| key(x, i as u32))
            .collect();
        cand.sort_unstable();
        let (typical_on, top_p_on, min_p_on) = filters;
        filter_candidates(&mut values, &mut cand, p, typical_on, top_p_on, min_p_on);
        let i = draw(&values, uniform(&mut self.rng));
        let (id, raw, _) = kept[i];
        Ok(Some(Sampled {
            id,
            logprob: logprob(raw),
        }))
    }

    /// Top-p over the whole vocabulary from the certain prefix `order` of the processed
    /// candidates: the nucleus length when it is the same for every total mass the row can
    /// have, else `None`. The total is the pool's exact mass plus the rest, bounded by the
    /// GPU's tail sum (within [`TAIL_SUM_TOLERANCE`]) and by `rest count × weight(bound)`.
    fn nucleus(
        &self,
        c: &Candidates,
        order: &[(u64, u32, f32, f32)],
        pool: &[(u32, f32, f32)],
        bound: f32,
        n: usize,
    ) -> Option<usize> {
        let p = &self.params;
        let &(_, _, _, s_max) = order.first()?;
        let max = f64::from(s_max);
        let t = f64::from(p.temperature);
        let scale = |x: f32| {
            if p.temperature != 1.0 {
                saturate(f64::from(x) / t)
            } else {
                x
            }
        };
        let pool_mass: f64 = pool.iter().map(|e| weight(scale(e.2), max)).sum();
        let rest = (n - pool.len()) as f64;
        let rigorous = rest * weight(scale(bound), max);
        // The GPU's weights are relative to its adjusted max; the exact max is `order[0]`'s.
        let exact_max = pool.iter().find(|e| e.0 == order[0].1).map(|e| e.2)?;
        // Near saturation the GPU's scaled differences no longer match the processed logits.
        if !(f64::from(exact_max) / t).abs().lt(&1e37) || !(f64::from(bound) / t).abs().lt(&1e37) {
            return None;
        }
        let factor = ((f64::from(c.adjusted_max) - f64::from(exact_max)) / t).exp();
        let gpu_rest = (f64::from(c.tail_sum) - f64::from(c.adjusted_tail_sum)).max(0.0) * factor;
        let slack =
            TAIL_SUM_TOLERANCE * (f64::from(c.tail_sum) + f64::from(c.adjusted_tail_sum)) * factor;
        if !(gpu_rest.is_finite() && slack.is_finite() && pool_mass.is_finite()) {
            return None;
        }
        let hi_rest = (gpu_rest + slack).min(rigorous);
        let lo_rest = (gpu_rest - slack).max(0.0).min(hi_rest);
        let top_p = f64::from(p.top_p);
        let lo = top_p * (pool_mass + lo_rest) * (1.0 - F64_SUM_TOLERANCE);
        let hi = top_p * (pool_mass + hi_rest) * (1.0 + F64_SUM_TOLERANCE);
        let mut cumulative = 0.0;
        for (i, e) in order.iter().enumerate() {
            cumulative += weight(e.3, max);
            if cumulative >= lo {
                // The full path stops here only if it would for the largest total too.
                return (cumulative >= hi).then_some(i + 1);
            }
        }
        None
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
        let logprob = (f64::from(logits[id]) - log_sum_exp(logits)) as f32;
        Ok(Sampled {
            id: id as u32,
            logprob,
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
    fn uniform_is_in_unit_interval() {
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        for _ in 0..10_000 {
            let u = uniform(&mut rng);
            assert!((0.0..1.0).contains(&u), "{u}");
        }
    }

    #[test]
    fn window_takes_the_last_n_tokens_of_the_history() {
        let mut params = SamplingParams {
            seed: Some(1),
            penalty_last_n: 4,
            ..SamplingParams::default()
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
            ..SamplingParams::default()
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
    fn keys_sort_by_logit_descending_then_id() {
        let logits = [
            0.0,
            -0.0,
            1.5,
            -2.0,
            f32::MAX,
            -f32::MAX,
            1.5,
            1e-30,
            -1e-30,
        ];
        let mut keys: Vec<u64> = logits
            .iter()
            .enumerate()
            .map(|(i, &x)| key(x, i as u32))
            .collect();
        keys.sort_unstable();
        let order: Vec<usize> = keys.iter().map(|&k| id_of(k)).collect();
        assert_eq!(order, [4, 2, 6, 7, 0, 1, 8, 3, 5]);
    }

    #[test]
    fn shortest_prefix_grows_until_the_target_is_reached() {
        // 1000 items, weight 1 each: the target decides how far the sort has to go.
        for (target, want) in [
            (0.5, 1),
            (256.0, 256),
            (257.0, 257),
            (999.5, 1000),
            (1e9, 1000),
        ] {
            let mut items: Vec<u32> = (0..1000u32).rev().collect();
            let n = shortest_prefix(&mut items, target, |_| 1.0);
            assert_eq!(n, want, "target {target}");
            let expected: Vec<u32> = (0..n as u32).collect();
            assert_eq!(items[..n], expected[..], "target {target}");
        }
        let mut empty: Vec<u32> = Vec::new();
        assert_eq!(shortest_prefix(&mut empty, 1.0, |_| 1.0), 0);
    }

    #[test]
    fn top_k_only_keeps_exactly_k() {
        let params = SamplingParams {
            top_k: 2,
            seed: Some(5),
            ..SamplingParams::default()
        };
        let s = sampler(params, 5);
        let mut logits = [0.5, 2.0, 2.0, 1.0, 2.0];
        assert!(s.process(&mut logits, &[], &[]).is_ok());
        // Three-way tie at 2.0: the two lowest ids survive.
        let inf = f32::NEG_INFINITY;
        assert_eq!(logits, [inf, 2.0, 2.0, inf, inf]);
    }
}
