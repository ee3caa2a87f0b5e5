//! The filters after top-k: typical, top-p and min-p, each over the surviving candidates.

use crate::sampling::SamplingParams;

use super::logits::{id_of, ix, key, max_f64, weight};

/// The filters after top-k, on the survivors `cand` (keys) of `logits`: typical, top-p and
/// min-p, each when asked for. Reads nothing outside `cand`.
pub(super) fn filter_candidates(
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
