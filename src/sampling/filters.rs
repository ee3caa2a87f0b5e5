//! The filters after temperature (top-k, typical, top-p, min-p) as one pipeline, built once
//! from the parameters: the order they run in, what each does to the surviving candidates, and
//! what the candidate path needs to stand in for the whole row when a filter runs first.

use crate::sampling::SamplingParams;

use super::logits::{id_of, ix, key, max_f64, weight};

/// One filter with its setting. The pipeline runs them in this order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Filter {
    /// Keeps the `k` largest logits (ties to the lower id), then puts the survivors in logit
    /// order, so that the sums after it do not depend on how the selection left them.
    TopK(usize),
    /// Locally typical sampling keeping this much probability.
    Typical(f64),
    /// Nucleus sampling keeping this much probability.
    TopP(f64),
    /// Keeps the tokens at least this fraction as probable as the most probable one.
    MinP(f64),
}

/// What the GPU's top candidates must show for a filter that runs first, so that they decide
/// the same kept set as the whole row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Need {
    /// The order of the `k` largest processed logits.
    Largest(usize),
    /// That the nucleus ends inside the candidates for every total mass the row can have.
    Nucleus,
    /// Every token's value: only the whole row decides.
    Row,
}

impl Filter {
    /// Filters the survivors `cand` (keys) of `logits`, setting removed tokens to `-inf`.
    /// Reads nothing outside `cand`.
    fn run(self, logits: &mut [f32], cand: &mut Vec<u64>) {
        match self {
            Filter::TopK(k) => {
                if k == 0 || k >= cand.len() {
                    return;
                }
                cand.select_nth_unstable(k - 1);
                filter_out(logits, &cand[k..]);
                cand.truncate(k);
                cand.sort_unstable();
            }
            Filter::Typical(mass) => typical(logits, cand, mass),
            Filter::TopP(mass) => top_p(logits, cand, mass),
            Filter::MinP(ratio) => min_p(logits, cand, ratio),
        }
    }

    /// What the candidates must show when this filter runs first.
    pub(super) fn need(self) -> Need {
        match self {
            Filter::TopK(k) => Need::Largest(k),
            Filter::TopP(_) => Need::Nucleus,
            Filter::Typical(_) | Filter::MinP(_) => Need::Row,
        }
    }
}

/// The filters a sampler's parameters turn on, in the order they run; each filter at its
/// neutral value (`top_k` 0 or the whole vocabulary, `typical_p` 1, `top_p` 1, `min_p` 0) is
/// left out, and a greedy sampler has none (only the argmax is kept).
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Pipeline {
    filters: Vec<Filter>,
}

impl Pipeline {
    /// The pipeline of `p` for a vocabulary of `vocab` tokens.
    pub(super) fn of(p: &SamplingParams, vocab: usize) -> Self {
        if p.is_greedy() {
            return Self::default();
        }
        let mut filters = Vec::new();
        if p.top_k > 0 && p.top_k < vocab {
            filters.push(Filter::TopK(p.top_k));
        }
        if p.typical_p < 1.0 {
            filters.push(Filter::Typical(f64::from(p.typical_p)));
        }
        if p.top_p < 1.0 {
            filters.push(Filter::TopP(f64::from(p.top_p)));
        }
        if p.min_p > 0.0 {
            filters.push(Filter::MinP(f64::from(p.min_p)));
        }
        Self { filters }
    }

    /// The filters, in the order they run.
    pub(super) fn filters(&self) -> &[Filter] {
        &self.filters
    }

    /// Whether no filter changes anything when `allowed` tokens remain.
    pub(super) fn idle(&self, allowed: usize) -> bool {
        self.filters
            .iter()
            .all(|f| matches!(*f, Filter::TopK(k) if k >= allowed))
    }

    /// What the candidates must show for the whole pipeline: the first filter's need, or the
    /// whole row when no filter keeps the kept set small.
    pub(super) fn need(&self) -> Need {
        self.filters.first().map_or(Need::Row, |f| f.need())
    }
}

/// Runs `filters` in order on the survivors `cand` (keys) of `logits`.
pub(super) fn run(filters: &[Filter], logits: &mut [f32], cand: &mut Vec<u64>) {
    for f in filters {
        f.run(logits, cand);
    }
}

/// Removes the `removed` candidates by setting their logits to `-inf`.
pub(super) fn filter_out(logits: &mut [f32], removed: &[u64]) {
    for &k in removed {
        logits[id_of(k)] = f32::NEG_INFINITY;
    }
}

/// Puts the smallest `items` first in ascending order, only as far as needed, and returns the
/// length of the shortest such prefix whose weights add up to `target` (all of them when rounding
/// keeps the full sum just below it). Sorts the smallest 256 first, then up to four times as many
/// as are sorted so far, and so on: a peaked distribution never sorts the whole vocabulary.
pub(super) fn shortest_prefix<T: Ord + Copy>(
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
    let lse = max + crate::math::ln(sum);
    let logprob = |id: usize| f64::from(logits[id]) - lse;
    let entropy: f64 = -cand
        .iter()
        .map(|&k| {
            let lp = logprob(id_of(k));
            crate::math::exp(lp) * lp
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
    let keep = shortest_prefix(&mut scored, mass, |(_, id)| {
        crate::math::exp(logprob(ix(id)))
    });
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
    let threshold = crate::math::ln(min_p);
    cand.retain(|&k| {
        let keep = f64::from(logits[id_of(k)]) - max >= threshold;
        if !keep {
            logits[id_of(k)] = f32::NEG_INFINITY;
        }
        keep
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(top_k: usize, typical_p: f32, top_p: f32, min_p: f32) -> SamplingParams {
        SamplingParams {
            temperature: 0.8,
            top_k,
            typical_p,
            top_p,
            min_p,
            ..SamplingParams::default()
        }
    }

    #[test]
    fn the_pipeline_keeps_the_order_and_leaves_neutral_filters_out() {
        let all = Pipeline::of(&params(40, 0.9, 0.95, 0.05), 100);
        assert_eq!(
            all.filters(),
            [
                Filter::TopK(40),
                Filter::Typical(f64::from(0.9f32)),
                Filter::TopP(f64::from(0.95f32)),
                Filter::MinP(f64::from(0.05f32)),
            ]
        );
        // top-k over the whole vocabulary (or 0), typical 1, top-p 1 and min-p 0 do nothing
        assert_eq!(Pipeline::of(&params(100, 1.0, 1.0, 0.0), 100).filters(), []);
        assert_eq!(Pipeline::of(&params(0, 1.0, 1.0, 0.0), 100).filters(), []);
        // greedy keeps the argmax only: no filter runs
        let greedy = SamplingParams {
            temperature: 0.0,
            ..params(40, 0.9, 0.95, 0.05)
        };
        assert_eq!(Pipeline::of(&greedy, 100).filters(), []);
        // top-k alone is idle when no more tokens than k are allowed
        let top_k = Pipeline::of(&params(40, 1.0, 1.0, 0.0), 100);
        assert!(top_k.idle(40) && !top_k.idle(41));
        assert!(!all.idle(10));
    }

    #[test]
    fn the_first_filter_says_what_the_candidates_must_show() {
        let need = |p: SamplingParams| Pipeline::of(&p, 1000).need();
        assert_eq!(need(params(40, 0.9, 0.95, 0.05)), Need::Largest(40));
        assert_eq!(need(params(0, 1.0, 0.95, 0.05)), Need::Nucleus);
        assert_eq!(need(params(0, 0.9, 0.95, 0.0)), Need::Row);
        assert_eq!(need(params(0, 1.0, 1.0, 0.05)), Need::Row);
        // nothing filters: every token keeps some probability
        assert_eq!(need(params(0, 1.0, 1.0, 0.0)), Need::Row);
    }

    #[test]
    fn filters_run_in_order_on_the_survivors() {
        // logits 0..8 as ids 0..8: top-k 5 keeps 3..8, then min-p 0.1 keeps those within
        // -ln(0.1) = 2.30 of the largest (5, 6 and 7)
        let mut logits: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let mut cand: Vec<u64> = logits
            .iter()
            .enumerate()
            .map(|(i, &x)| key(x, i as u32))
            .collect();
        run(
            &[Filter::TopK(5), Filter::MinP(0.1)],
            &mut logits,
            &mut cand,
        );
        let kept: Vec<usize> = (0..8).filter(|&i| logits[i].is_finite()).collect();
        assert_eq!(kept, [5, 6, 7]);
        assert_eq!(cand.len(), 3);
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
}
