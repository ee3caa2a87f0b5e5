//! How far two runs' logits are apart: the mean negative log-likelihood of given next tokens,
//! the mean KL divergence between two sets of next-token distributions, and
//! [`LogitAgreement`] (largest |Δ logit|, top-1 agreement, NLL delta), over `[rows, vocab]`
//! logit blocks (f64 accumulation). The automatic cache plan measures kinds against the f32
//! cache with them, and `logits --precision f16` and the bench compare precisions.

use serde::Serialize;

/// Mean NLL of `tokens[i + 1]` under row `i` of `logits` (`[rows, vocab]`), for rows
/// `first..rows`.
pub fn mean_nll(logits: &[f32], tokens: &[u32], vocab: usize, first: usize) -> f64 {
    let rows = logits.len() / vocab;
    let mut total = 0.0;
    let mut n = 0usize;
    for i in first..rows.min(tokens.len().saturating_sub(1)) {
        let row = &logits[i * vocab..(i + 1) * vocab];
        total += log_sum_exp(row) - f64::from(row[tokens[i + 1] as usize]);
        n += 1;
    }
    total / n.max(1) as f64
}

fn log_sum_exp(row: &[f32]) -> f64 {
    let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    f64::from(m)
        + crate::math::ln(
            row.iter()
                .map(|&x| crate::math::exp(f64::from(x - m)))
                .sum::<f64>(),
        )
}

/// Mean KL(p ‖ q) over the rows `first..` of two `[rows, vocab]` logit blocks.
pub fn mean_kl(p_logits: &[f32], q_logits: &[f32], vocab: usize, first: usize) -> f64 {
    let rows = p_logits.len() / vocab;
    let mut total = 0.0;
    for i in first..rows {
        let (p, q) = (
            &p_logits[i * vocab..(i + 1) * vocab],
            &q_logits[i * vocab..(i + 1) * vocab],
        );
        let (lp, lq) = (log_sum_exp(p), log_sum_exp(q));
        total += p
            .iter()
            .zip(q)
            .map(|(&a, &b)| {
                let la = f64::from(a) - lp;
                crate::math::exp(la) * (la - (f64::from(b) - lq))
            })
            .sum::<f64>();
    }
    total / rows.saturating_sub(first).max(1) as f64
}

/// How `other`'s logits agree with `reference`'s over the same positions.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LogitAgreement {
    /// Positions compared.
    pub positions: usize,
    /// Largest |Δ logit| over every position and token.
    pub max_abs_diff: f32,
    /// Share of positions where both pick the same most likely token.
    pub top1_agreement: f64,
    /// Mean NLL of the next input tokens under the reference (nats per token).
    pub nll_reference: f64,
    /// ... and under `other` minus under the reference.
    pub nll_delta: f64,
    /// Mean KL(reference ‖ other) of the next-token distributions.
    pub mean_kl: f64,
}

fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (i, &v)| {
            if v > best.1 {
                (i, v)
            } else {
                best
            }
        })
        .0
}

/// Compares two `[rows, vocab]` logit blocks of the same input `tokens` (row `i` predicts
/// `tokens[i + 1]`; rows past the input count toward the differences only).
pub fn agreement(reference: &[f32], other: &[f32], tokens: &[u32], vocab: usize) -> LogitAgreement {
    let rows = reference.len().min(other.len()) / vocab.max(1);
    let mut max_abs_diff = 0.0f32;
    let mut same = 0usize;
    for i in 0..rows {
        let (a, b) = (
            &reference[i * vocab..(i + 1) * vocab],
            &other[i * vocab..(i + 1) * vocab],
        );
        for (x, y) in a.iter().zip(b) {
            let d = (x - y).abs();
            // a NaN counts as the largest difference
            max_abs_diff = if d.is_nan() {
                f32::NAN
            } else {
                max_abs_diff.max(d)
            };
        }
        same += usize::from(argmax(a) == argmax(b));
    }
    let nll_reference = mean_nll(&reference[..rows * vocab], tokens, vocab, 0);
    let nll_other = mean_nll(&other[..rows * vocab], tokens, vocab, 0);
    LogitAgreement {
        positions: rows,
        max_abs_diff,
        top1_agreement: same as f64 / rows.max(1) as f64,
        nll_reference,
        nll_delta: nll_other - nll_reference,
        mean_kl: mean_kl(&reference[..rows * vocab], &other[..rows * vocab], vocab, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divergences_of_known_distributions() {
        // two rows over a vocabulary of 2: identical, then p = (0.5, 0.5) vs q = (0.8, 0.2)
        let p = [0.0f32, 0.0, 0.0, 0.0];
        let q = [0.0f32, 0.0, (0.8f32 / 0.2).ln(), 0.0];
        let kl = mean_kl(&p, &q, 2, 1);
        let want = 0.5 * (0.5f64 / 0.8).ln() + 0.5 * (0.5f64 / 0.2).ln();
        assert!((kl - want).abs() < 1e-6, "{kl} vs {want}");
        assert_eq!(mean_kl(&p, &p, 2, 0), 0.0);
        // NLL of token 1 after row 0 with uniform logits is ln 2
        assert!((mean_nll(&p, &[0, 1, 0], 2, 0) - 2f64.ln()).abs() < 1e-9);
        // agreement: row 1 changes its top token, by 1.386 at most
        let a = agreement(&p, &q, &[0, 1, 0], 2);
        assert_eq!(a.positions, 2);
        assert!((a.max_abs_diff - (0.8f32 / 0.2).ln()).abs() < 1e-6);
        assert_eq!(a.top1_agreement, 1.0, "ties and the first index agree");
        let flipped = [0.0f32, 1.0, 1.0, 0.0];
        let b = agreement(&p, &flipped, &[0, 1, 0], 2);
        assert_eq!(b.top1_agreement, 0.5);
        assert!(b.nll_delta < 0.0 && b.mean_kl > 0.0);
    }
}
