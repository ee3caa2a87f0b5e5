//! Sampling from the GPU's top candidates instead of the whole row: what to ask the GPU to
//! select, and the proof that the candidates decide the token [`Sampler::sample`] would draw.

use std::sync::Arc;

use crate::candidates::saturate;
use crate::candidates::{Candidates, SelectRequest, MAX_ADJUSTMENTS, MAX_CANDIDATES};
use crate::Result;

use super::filters::{self, Filter, Need};
use super::logits::{argmax, draw, ix, key, log_sum_exp, max_f64, uniform, weight};
use super::sampler::top_logprobs;
use super::{Sampled, Sampler, TopLogprob};

/// The tokens a processed distribution keeps, as the candidates prove them.
struct Kept {
    /// `(id, raw logit)` of each kept token in id order; greedy: the one token.
    tokens: Vec<(u32, f32)>,
    /// Their processed logits (`-inf` where a filter after top-k removed one), `[tokens]`.
    values: Vec<f32>,
    /// Log of the raw row's sum of exponentials (the log-probabilities' base).
    lse: f64,
    /// The alternatives asked for.
    top: Vec<TopLogprob>,
    /// Greedy: `tokens[0]` is the token, with no random draw.
    greedy: bool,
}

/// Candidates asked for beyond what greedy or top-k strictly need: the slack that lets the
/// exactness check pass when a penalised token's GPU value differs in the last bit.
const CANDIDATE_MARGIN: usize = 16;

/// Relative error allowed for the GPU's f32 tail sum (exp and summation rounding) when bounding
/// the total probability mass for top-p.
const TAIL_SUM_TOLERANCE: f64 = 1e-3;

/// Relative slack for the order in which the full path adds its f64 weights.
const F64_SUM_TOLERANCE: f64 = 1e-12;

impl Sampler {
    /// What the GPU should select for the next token when the candidates can stand in for the
    /// whole row, or `None` when they cannot by the parameters alone (read the row instead):
    /// greedy -> a few candidates; `top_k <= MAX_CANDIDATES` -> top_k plus a margin; top-p
    /// without top-k or typical -> [`MAX_CANDIDATES`]; a vocabulary of at most
    /// [`MAX_CANDIDATES`] -> all of it. `None` too with more than [`MAX_ADJUSTMENTS`]
    /// adjusted tokens. A constraint's mask goes with the request, so the selection ranks and
    /// sums the allowed tokens only. History ids outside the vocabulary -> Error.
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
        let masked = self.mask.is_some();
        if self.top_logprobs > 0 && (masked || !adjustments.is_empty()) {
            // the alternatives rank raw logits; adjusted candidates are ranked otherwise
            return Ok(None);
        }
        let k = if n <= MAX_CANDIDATES {
            n
        } else if p.is_greedy() {
            1 + CANDIDATE_MARGIN
        } else {
            match self.pipeline.need() {
                Need::Largest(k) if k <= MAX_CANDIDATES => k + CANDIDATE_MARGIN,
                Need::Nucleus => MAX_CANDIDATES,
                Need::Largest(_) | Need::Row => return Ok(None),
            }
        };
        Ok(Some(SelectRequest {
            n: n as u32,
            k: k.max(self.top_logprobs).min(MAX_CANDIDATES).min(n) as u32,
            temperature: if p.is_greedy() { 1.0 } else { p.temperature },
            adjustments,
            mask: self.mask.as_ref().map(|m| Arc::clone(m.shared_words())),
        }))
    }

    /// [`Self::sample`] from the GPU's selection `c` for `request` instead of the whole row:
    /// `Some` with exactly the token `sample` would return on the full row (and the same use of
    /// the random generator), or `None`, consuming nothing, when the candidates cannot prove it
    /// (read the whole row and call `sample`). The log-probability comes from the GPU's raw max
    /// and sum: it may differ from `sample`'s in the last bits. How the proof goes:
    /// [`Self::distribution_candidates`].
    pub fn sample_candidates(
        &mut self,
        c: &Candidates,
        request: &SelectRequest,
        prompt: &[u32],
        generated: &[u32],
    ) -> Result<Option<Sampled>> {
        let Some(kept) = self.prove(c, request, prompt, generated)? else {
            return Ok(None);
        };
        let i = match kept.greedy {
            true => 0,
            false => draw(&kept.values, uniform(&mut self.rng)),
        };
        let (id, raw) = kept.tokens[i];
        Ok(Some(Sampled {
            id,
            logprob: (f64::from(raw) - kept.lse) as f32,
            top: kept.top,
        }))
    }

    /// [`Self::distribution`] (`[vocab]`) from the GPU's selection `c` for `request` instead
    /// of the whole row: `Some` with the same values bit for bit, or `None` when the
    /// candidates cannot prove them (read the whole row). Speculative decoding verifies drafts
    /// against it.
    ///
    /// The adjusted logits of the candidates and of every adjusted token are recomputed here
    /// from their raw values with [`LogitAdjustment::apply`]; every other token's adjusted
    /// logit equals its raw one and, not being selected, is at most the last candidate's.
    /// From that bound the leading candidates whose place in the full order is certain are
    /// known; greedy and top-k need the kept tokens among them; top-p without top-k also needs
    /// the nucleus to end there for every total mass within the GPU's tail sum (with a
    /// tolerance) and a rigorous bound on it. The kept tokens' weights are then summed in id
    /// order, as the full row's are (whose other weights are zero). Non-finite rows give
    /// `None` (then `distribution` reports them).
    ///
    /// [`LogitAdjustment::apply`]: crate::candidates::LogitAdjustment::apply
    pub fn distribution_candidates(
        &self,
        c: &Candidates,
        request: &SelectRequest,
        prompt: &[u32],
        generated: &[u32],
    ) -> Result<Option<Vec<f64>>> {
        let Some(kept) = self.prove(c, request, prompt, generated)? else {
            return Ok(None);
        };
        let mut p = vec![0.0; self.vocab_size];
        if kept.greedy {
            p[ix(kept.tokens[0].0)] = 1.0;
            return Ok(Some(p));
        }
        let max = max_f64(kept.values.iter().copied());
        let total: f64 = kept.values.iter().map(|&x| weight(x, max)).sum();
        for (&(id, _), &x) in kept.tokens.iter().zip(&kept.values) {
            p[ix(id)] = weight(x, max) / total;
        }
        Ok(Some(p))
    }

    /// The tokens the processed distribution keeps, proven from the candidates (see
    /// [`Self::distribution_candidates`]), or `None` when the candidates do not decide them.
    fn prove(
        &self,
        c: &Candidates,
        request: &SelectRequest,
        prompt: &[u32],
        generated: &[u32],
    ) -> Result<Option<Kept>> {
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
            return self.prove_row(&row, prompt, generated).map(Some);
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
        match (&self.mask, &request.mask) {
            (Some(mask), Some(words)) if Arc::ptr_eq(words, mask.shared_words()) => {
                // The selection ranked and summed the allowed tokens only: forbidden ones
                // (after the allowed among the candidates) drop out.
                pool.retain(|e| mask.allows(e.0));
                if pool.is_empty() {
                    return Ok(None);
                }
            }
            (None, None) => {}
            // a request made for another mask proves nothing
            _ => return Ok(None),
        }
        // Every token outside the pool has an adjusted logit of at most `bound`, and equal
        // to it only with an id above `bound_id`.
        let (bound, bound_id) = (c.adjusted[k - 1], c.ids[k - 1]);
        let p = &self.params;
        let lse = f64::from(c.raw_max) + crate::math::ln(f64::from(c.raw_sum));
        // Without adjustments or a mask (`select_request` asks for no candidates otherwise) the
        // candidates are the row's largest raw logits, at least `top_logprobs` of them.
        let top = if self.top_logprobs > 0 {
            if !request.adjustments.is_empty() || self.mask.is_some() || k < self.top_logprobs {
                return Ok(None);
            }
            top_logprobs(&c.raw, lse, self.top_logprobs)
                .into_iter()
                .map(|t| TopLogprob {
                    id: c.ids[ix(t.id)],
                    logprob: t.logprob,
                })
                .collect()
        } else {
            Vec::new()
        };

        if p.is_greedy() {
            let Some(&(id, raw, value)) = pool.iter().min_by_key(|e| key(e.2, e.0)) else {
                return Ok(None);
            };
            if key(value, id) > key(bound, bound_id) {
                return Ok(None);
            }
            return Ok(Some(Kept {
                tokens: vec![(id, raw)],
                values: vec![value],
                lse,
                top,
                greedy: true,
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

        // The first filter decides what the candidates must show; the ones after it run on
        // the kept tokens as they do on the row's survivors.
        let Some((&first, after)) = self.pipeline.filters().split_first() else {
            return Ok(None);
        };
        // Whether the survivors reach the filters after the first in logit order (top-k puts
        // them so when it removes any) or in id order (the row's order when it removes none),
        // as on the full row: their sums add in that order.
        let mut in_logit_order = true;
        let kept = match first {
            Filter::TopK(top_k) => {
                // under a mask, fewer tokens than top_k may be allowed: top-k keeps them all
                let allowed = self.mask.as_ref().map_or(n, |m| m.count());
                in_logit_order = top_k < allowed;
                let top_k = top_k.min(allowed);
                if certain < top_k {
                    return Ok(None);
                }
                top_k
            }
            Filter::TopP(_) => match self.nucleus(c, &order[..certain], &pool, bound, n) {
                Some(keep) => keep,
                None => return Ok(None),
            },
            Filter::Typical(_) | Filter::MinP(_) => return Ok(None),
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
        if in_logit_order {
            cand.sort_unstable();
        }
        filters::run(after, &mut values, &mut cand);
        Ok(Some(Kept {
            tokens: kept.iter().map(|&(id, raw, _)| (id, raw)).collect(),
            values,
            lse,
            top,
            greedy: false,
        }))
    }

    /// [`Kept`] from a whole row (every token was a candidate): its processed logits.
    fn prove_row(&self, row: &[f32], prompt: &[u32], generated: &[u32]) -> Result<Kept> {
        let lse = log_sum_exp(row);
        let mut values = row.to_vec();
        self.process(&mut values, prompt, generated)?;
        let top = top_logprobs(row, lse, self.top_logprobs);
        let greedy = self.params.is_greedy();
        let (tokens, values) = match greedy {
            true => {
                let best = argmax(&values);
                (vec![(best as u32, row[best])], vec![values[best]])
            }
            // every token in id order, as the row is
            false => ((0..).zip(row.iter().copied()).collect(), values),
        };
        Ok(Kept {
            tokens,
            values,
            lse,
            top,
            greedy,
        })
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
        let (lo_rest, hi_rest) = if self.mask.as_ref().is_some_and(|m| m.count() == pool.len()) {
            // every allowed token is in the pool: the mass is known exactly, no tail remains
            (0.0, 0.0)
        } else {
            let rest = (n - pool.len()) as f64;
            let rigorous = rest * weight(scale(bound), max);
            // The GPU's weights are relative to its adjusted max; the exact max is `order[0]`'s.
            let exact_max = pool.iter().find(|e| e.0 == order[0].1).map(|e| e.2)?;
            // Near saturation the GPU's scaled differences no longer match the processed logits.
            if !(f64::from(exact_max) / t).abs().lt(&1e37)
                || !(f64::from(bound) / t).abs().lt(&1e37)
            {
                return None;
            }
            let factor = crate::math::exp((f64::from(c.adjusted_max) - f64::from(exact_max)) / t);
            let gpu_rest =
                (f64::from(c.tail_sum) - f64::from(c.adjusted_tail_sum)).max(0.0) * factor;
            let slack = TAIL_SUM_TOLERANCE
                * (f64::from(c.tail_sum) + f64::from(c.adjusted_tail_sum))
                * factor;
            if !(gpu_rest.is_finite() && slack.is_finite() && pool_mass.is_finite()) {
                return None;
            }
            let hi_rest = (gpu_rest + slack).min(rigorous);
            ((gpu_rest - slack).max(0.0).min(hi_rest), hi_rest)
        };
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
}
