//! Speculative decoding's token-level rules: verifying a drafted token against the target's
//! distribution (modified rejection sampling, which keeps the output distribution the
//! target's), prompt lookup (drafts copied from earlier text), and the adaptive draft length.
//!
//! Distributions here are what [`Sampler::distribution`] returns: the softmax of the logits
//! after every processor (bias, penalties, temperature, filters), so a verified token is drawn
//! exactly as plain decoding would draw it. Greedy parameters make both distributions one-hot
//! on their argmax, and the same rule then accepts exactly while the draft equals the target's
//! argmax and replaces the first mismatch by that argmax, with no random draw.

use super::logits::{log_sum_exp, uniform};
use super::Sampler;
use crate::{Error, Result};

/// Most tokens one speculative step may draft.
pub const SPEC_MAX_K: usize = 64;

/// What verifying one drafted token decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The drafted token stands.
    Accept,
    /// The drafted token is rejected; this token (drawn from the residual distribution)
    /// replaces it, and the rest of the draft is dropped.
    Replace(u32),
}

impl Sampler {
    /// Verifies drafted token `draft` against the target's distribution `p` (`[vocab]`, as
    /// [`Sampler::distribution`] gives), the draft having been drawn from `q` (`None`: a
    /// deterministic draft, `q` one-hot on `draft`, as prompt lookup proposes).
    ///
    /// Accepts with probability `min(1, p(draft) / q(draft))`; otherwise draws the
    /// replacement from `norm(max(0, p − q))`. Greedy parameters use no random draw. Errors
    /// when the lengths differ from the vocabulary or `draft` is outside it.
    pub fn verify(&mut self, p: &[f64], q: Option<&[f64]>, draft: u32) -> Result<Verdict> {
        let d = draft as usize;
        if p.len() != self.vocab_size || q.is_some_and(|q| q.len() != self.vocab_size) {
            return Err(Error::invalid(
                "distribution",
                format!("length must equal the vocabulary size {}", self.vocab_size),
            ));
        }
        if d >= self.vocab_size {
            return Err(Error::invalid(
                "draft",
                format!(
                    "token id {draft} is outside the vocabulary of {}",
                    self.vocab_size
                ),
            ));
        }
        let q_d = q.map_or(1.0, |q| q[d]);
        let ratio = if q_d > 0.0 { p[d] / q_d } else { 0.0 };
        let accept = if ratio >= 1.0 {
            true
        } else if ratio <= 0.0 {
            false
        } else {
            uniform(&mut self.rng) < ratio
        };
        if accept {
            return Ok(Verdict::Accept);
        }
        let residual: Vec<f64> = match q {
            Some(q) => p.iter().zip(q).map(|(&a, &b)| (a - b).max(0.0)).collect(),
            None => {
                let mut r = p.to_vec();
                r[d] = 0.0;
                r
            }
        };
        Ok(Verdict::Replace(self.draw_from(&residual, p)))
    }

    /// Draws from the unnormalised weights `w` (inverse CDF in id order with one uniform
    /// draw; the only positive weight without one). When rounding leaves no positive weight,
    /// draws from `fallback` instead.
    pub fn draw_from(&mut self, w: &[f64], fallback: &[f64]) -> u32 {
        let positive = |v: &[f64]| v.iter().filter(|&&x| x > 0.0).count();
        let w = if positive(w) == 0 { fallback } else { w };
        let last = w.iter().rposition(|&x| x > 0.0).unwrap_or(0);
        if positive(w) == 1 {
            return last as u32;
        }
        let total: f64 = w.iter().sum();
        let target = uniform(&mut self.rng) * total;
        let mut acc = 0.0;
        for (i, &x) in w.iter().enumerate() {
            acc += x;
            if x > 0.0 && acc > target {
                return i as u32;
            }
        }
        last as u32
    }
}

/// The log-probability of `id` under the raw logits `row` (before any processor), as
/// [`super::Sampled::logprob`] reports it.
pub fn raw_logprob(row: &[f32], id: u32) -> f32 {
    (f64::from(row[id as usize]) - log_sum_exp(row)) as f32
}

/// Prompt lookup: up to `k` tokens that followed the latest earlier occurrence of the last `n`
/// tokens of `history`, for `n` from `max_n` down to 1 (the longest match wins). Empty when
/// nothing matches.
pub fn lookup_draft(history: &[u32], k: usize, max_n: usize) -> Vec<u32> {
    if k == 0 {
        return Vec::new();
    }
    for n in (1..=max_n.min(history.len().saturating_sub(1))).rev() {
        let tail = &history[history.len() - n..];
        // latest occurrence first, ending before the tail itself
        let found = (0..history.len() - n)
            .rev()
            .find(|&i| &history[i..i + n] == tail);
        if let Some(i) = found {
            let from = i + n;
            let to = (from + k).min(history.len());
            if from < to {
                return history[from..to].to_vec();
            }
        }
    }
    Vec::new()
}

/// The draft length policy: `k` tokens per step, or with `adaptive` a length in
/// `[1, 2 · k]` that grows by one after a step that accepted its whole draft and shrinks by
/// one after a step that accepted less than half of it; and a running acceptance rate below
/// `disable_below` (after at least `2 · k` drafted tokens) turns speculation off for the rest
/// of the generation.
#[derive(Clone, Debug, PartialEq)]
pub struct DraftLength {
    base: usize,
    k: usize,
    adaptive: bool,
    disable_below: f64,
    drafted: usize,
    accepted: usize,
    disabled: bool,
}

impl DraftLength {
    /// Starts at `k` (1..=[`SPEC_MAX_K`]).
    pub fn new(k: usize, adaptive: bool, disable_below: f64) -> Self {
        Self {
            base: k.max(1),
            k: k.max(1),
            adaptive,
            disable_below,
            drafted: 0,
            accepted: 0,
            disabled: false,
        }
    }

    /// Tokens to draft next (0 once speculation is off).
    pub fn next(&self) -> usize {
        if self.disabled {
            0
        } else {
            self.k
        }
    }

    /// Records a step that drafted `drafted` tokens and accepted `accepted` of them.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        self.drafted += drafted;
        self.accepted += accepted;
        if self.adaptive {
            let top = (2 * self.base).min(SPEC_MAX_K);
            if accepted == drafted {
                self.k = (self.k + 1).min(top);
            } else if 2 * accepted < drafted {
                self.k = self.k.saturating_sub(1).max(1);
            }
        }
        if self.drafted >= 2 * self.base && self.rate() < self.disable_below {
            self.disabled = true;
        }
    }

    /// Accepted over drafted so far (0 before any draft).
    pub fn rate(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }

    /// Whether the acceptance rate turned speculation off.
    pub fn disabled(&self) -> bool {
        self.disabled
    }

    /// The current draft length.
    pub fn current(&self) -> usize {
        self.k
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::SamplingParams;

    fn sampler(temperature: f32, seed: u64) -> Sampler {
        let params = SamplingParams {
            temperature,
            seed: Some(seed),
            ..SamplingParams::unfiltered()
        };
        match Sampler::new(&params, 4) {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn lookup_takes_the_latest_longest_match() {
        // "1 2 3 9 ... 1 2 3 7 8 ... 2 3" -> after the latest "2 3": 7 8
        let h = [1, 2, 3, 9, 5, 1, 2, 3, 7, 8, 4, 2, 3];
        assert_eq!(lookup_draft(&h, 2, 3), vec![7, 8]);
        assert_eq!(lookup_draft(&h, 5, 3), vec![7, 8, 4, 2, 3]);
        // no earlier occurrence of any suffix
        assert!(lookup_draft(&[1, 2, 3, 4], 3, 3).is_empty());
        assert!(lookup_draft(&[5], 3, 3).is_empty());
        assert!(lookup_draft(&h, 0, 3).is_empty());
        // falls back to a single token: "... 6 5" matches the earlier "5" only
        assert_eq!(lookup_draft(&[5, 1, 6, 5], 2, 3), vec![1, 6]);
    }

    #[test]
    fn greedy_verification_accepts_the_argmax_and_replaces_the_rest() {
        let mut s = sampler(0.0, 1);
        let p = [0.0, 0.0, 1.0, 0.0];
        let q = [0.0, 1.0, 0.0, 0.0];
        assert_eq!(s.verify(&p, None, 2).ok(), Some(Verdict::Accept));
        assert_eq!(s.verify(&p, None, 1).ok(), Some(Verdict::Replace(2)));
        assert_eq!(s.verify(&p, Some(&q), 1).ok(), Some(Verdict::Replace(2)));
        assert!(s.verify(&p, None, 4).is_err());
        assert!(s.verify(&p[..3], None, 0).is_err());
    }

    #[test]
    fn rejection_sampling_keeps_the_target_distribution() {
        // one step of draft-then-verify, many times: the emitted token must follow p
        let p = [0.1, 0.2, 0.3, 0.4];
        let q = [0.7, 0.1, 0.1, 0.1];
        let mut s = sampler(1.0, 7);
        let n = 200_000;
        let mut counts = [0usize; 4];
        for _ in 0..n {
            let d = s.draw_from(&q, &q);
            let id = match s.verify(&p, Some(&q), d) {
                Ok(Verdict::Accept) => d,
                Ok(Verdict::Replace(r)) => r,
                Err(e) => panic!("{e}"),
            };
            counts[id as usize] += 1;
        }
        let chi2: f64 = (0..4)
            .map(|i| {
                let e = p[i] * n as f64;
                (counts[i] as f64 - e).powi(2) / e
            })
            .sum();
        // 3 degrees of freedom: p = 0.001 at 16.27
        assert!(chi2 < 16.27, "chi-square {chi2}, counts {counts:?}");
    }

    #[test]
    fn adaptive_length_moves_within_its_bounds_and_disables_below_the_rate() {
        let mut d = DraftLength::new(2, true, 0.0);
        for _ in 0..10 {
            d.record(d.next(), d.next());
        }
        assert_eq!(d.current(), 4);
        for _ in 0..10 {
            d.record(d.next(), 0);
        }
        assert_eq!(d.current(), 1);
        let mut off = DraftLength::new(4, false, 0.5);
        off.record(4, 1);
        assert!(!off.disabled(), "too few drafted tokens to judge");
        off.record(4, 1);
        assert!(off.disabled());
        assert_eq!(off.next(), 0);
        assert!((off.rate() - 0.25).abs() < 1e-12);
    }
}
