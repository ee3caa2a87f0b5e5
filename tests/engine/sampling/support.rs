//! Sampler construction, processed logits and distributions, and comparisons shared by the
//! sampling tests.

use emberlm::sampling::{Sampler, SamplingParams};

pub const NEG_INF: f32 = f32::NEG_INFINITY;

pub fn sampler(params: &SamplingParams, vocab: usize) -> Sampler {
    match Sampler::new(params, vocab) {
        Ok(s) => s,
        Err(e) => panic!("Sampler::new({params:?}, {vocab}): {e}"),
    }
}

pub fn seeded(seed: u64) -> SamplingParams {
    SamplingParams {
        seed: Some(seed),
        ..SamplingParams::unfiltered()
    }
}

pub fn processed(
    params: &SamplingParams,
    logits: &[f32],
    prompt: &[u32],
    generated: &[u32],
) -> Vec<f32> {
    let s = sampler(params, logits.len());
    let mut out = logits.to_vec();
    if let Err(e) = s.process(&mut out, prompt, generated) {
        panic!("process({logits:?}) with {params:?}: {e}");
    }
    out
}

pub fn distribution(params: &SamplingParams, logits: &[f32]) -> Vec<f64> {
    let s = sampler(params, logits.len());
    match s.distribution(logits, &[], &[]) {
        Ok(d) => d,
        Err(e) => panic!("distribution({logits:?}) with {params:?}: {e}"),
    }
}

/// Ids whose processed logit is finite.
pub fn survivors(logits: &[f32]) -> Vec<usize> {
    (0..logits.len())
        .filter(|&i| logits[i].is_finite())
        .collect()
}

/// Logits whose softmax is exactly `probs` (up to f32 rounding of the logarithms).
pub fn logits_of(probs: &[f64]) -> Vec<f32> {
    probs.iter().map(|p| p.ln() as f32).collect()
}

pub fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "got {got:?}, want {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol,
            "index {i}: got {g}, want {w} (got {got:?}, want {want:?})"
        );
    }
}

pub fn draw(s: &mut Sampler, logits: &[f32], prompt: &[u32], generated: &[u32]) -> u32 {
    match s.sample(logits, prompt, generated) {
        Ok(t) => t.id,
        Err(e) => panic!("sample({logits:?}): {e}"),
    }
}

pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best as u32
}
