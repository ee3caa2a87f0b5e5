//! The constrained draw against the target: on a tiny model's real logits, the empirical
//! distribution of draws under a grammar that admits a few tokens matches the softmax of the
//! raw logits renormalised over the allowed tokens (chi-square, p > 0.001).

use std::sync::Arc;

use emberlm::backend::cpu::CpuForward;
use emberlm::constrain::{Grammars, ResponseFormat};
use emberlm::loader::ModelFiles;
use emberlm::sampling::{Sampler, SamplingParams};

use super::support::fixture;

/// The chi-square value a statistic with `df` degrees of freedom exceeds with probability
/// 0.001 (Wilson-Hilferty; within a few percent for df >= 2).
pub fn critical_value(df: f64) -> f64 {
    let z = 3.0902; // the standard normal's 0.999 quantile
    let a = 2.0 / (9.0 * df);
    df * (1.0 - a + z * a.sqrt()).powi(3)
}

/// Pearson's chi-square over `(observed, expected)` cells, the cells expecting fewer than 5
/// pooled into one, and its degrees of freedom (cells − 1).
pub fn pooled_chi_square(cells: impl Iterator<Item = (f64, f64)>) -> (f64, f64) {
    let (mut chi, mut n, mut pooled_obs, mut pooled_exp) = (0.0, 0usize, 0.0, 0.0);
    for (observed, expected) in cells {
        if expected < 5.0 {
            pooled_obs += observed;
            pooled_exp += expected;
            continue;
        }
        chi += (observed - expected).powi(2) / expected;
        n += 1;
    }
    if pooled_exp > 0.0 {
        chi += (pooled_obs - pooled_exp).powi(2) / pooled_exp.max(1e-9);
        n += 1;
    }
    (chi, n.saturating_sub(1) as f64)
}

#[test]
fn constrained_draws_follow_the_renormalised_distribution() {
    for model in ["tiny-gpt2-f32.gguf", "tiny-llama-spm-f32.gguf"] {
        let files = ModelFiles::open(&fixture(model)).unwrap();
        let tokenizer = Arc::new(files.tokenizer().unwrap());
        let weights = files.weights().unwrap();
        let mut forward = CpuForward::backend(&weights, 64).unwrap();
        let prompt = tokenizer.encode("the letters", false, None).unwrap();
        let logits = pollster::block_on(forward.forward(&prompt, false)).unwrap();
        let vocab = weights.config.vocab_size.min(tokenizer.vocab_size());
        let logits = &logits[..vocab];
        let eos = tokenizer.eos_ids().first().copied().unwrap_or(0);
        let grammars = Grammars::new(&tokenizer, vocab, eos).unwrap();
        let constraint = grammars
            .compile(&ResponseFormat::Regex("[a-h]x?".into()))
            .unwrap()
            .unwrap();
        let mask = constraint.start().mask(&[eos]).unwrap();
        let allowed: Vec<u32> = (0..vocab as u32).filter(|&i| mask.allows(i)).collect();
        assert!(allowed.len() >= 4, "{model}: {allowed:?}");
        // the target, computed here from the raw logits alone
        let max = allowed
            .iter()
            .map(|&i| f64::from(logits[i as usize]))
            .fold(f64::MIN, f64::max);
        let weights_: Vec<f64> = allowed
            .iter()
            .map(|&i| (f64::from(logits[i as usize]) - max).exp())
            .collect();
        let total: f64 = weights_.iter().sum();
        let params = SamplingParams {
            temperature: 1.0,
            seed: Some(99),
            ..SamplingParams::unfiltered()
        };
        let mut sampler = Sampler::new(&params, vocab).unwrap();
        sampler.set_mask(Some(mask)).unwrap();
        let draws = 20_000;
        let mut counts = vec![0usize; allowed.len()];
        for _ in 0..draws {
            let s = sampler.sample(logits, &prompt, &[]).unwrap();
            let at = allowed
                .iter()
                .position(|&i| i == s.id)
                .unwrap_or_else(|| panic!("{model}: drew forbidden token {}", s.id));
            counts[at] += 1;
        }
        let cells = counts
            .iter()
            .zip(&weights_)
            .map(|(&c, w)| (c as f64, draws as f64 * w / total));
        let (chi, df) = pooled_chi_square(cells);
        assert!(df >= 2.0, "{model}: too few cells");
        let limit = critical_value(df);
        eprintln!("{model}: chi-square {chi:.2} over {df} df (limit {limit:.2})");
        assert!(
            chi < limit,
            "{model}: chi-square {chi} >= {limit} at df {df}"
        );
    }
}
