//! What the automatic cache plan measures against the f32 cache: the mean negative
//! log-likelihood of given next tokens and the mean KL divergence between two sets of
//! next-token distributions, over `[rows, vocab]` logit blocks (f64 accumulation).

/// Mean NLL of `tokens[i + 1]` under row `i` of `logits` (`[rows, vocab]`), for rows
/// `first..rows`.
pub(super) fn mean_nll(logits: &[f32], tokens: &[u32], vocab: usize, first: usize) -> f64 {
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
        + row
            .iter()
            .map(|&x| f64::from(x - m).exp())
            .sum::<f64>()
            .ln()
}

/// Mean KL(p ‖ q) over the rows `first..` of two `[rows, vocab]` logit blocks.
pub(super) fn mean_kl(p_logits: &[f32], q_logits: &[f32], vocab: usize, first: usize) -> f64 {
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
                la.exp() * (la - (f64::from(b) - lq))
            })
            .sum::<f64>();
    }
    total / rows.saturating_sub(first).max(1) as f64
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
    }
}
