//! The CPU sampler: every logit processor on hand-computed vectors, greedy equivalences, the
//! statistics and reproducibility of seeded draws, parameter validation, JSON parsing and stop
//! strings in streamed text.

use std::collections::BTreeMap;

use emberlm::sampling::{log_softmax, Sampler, SamplingParams, StopMatcher, StopOutput};
use emberlm::Error;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

const NEG_INF: f32 = f32::NEG_INFINITY;

fn sampler(params: &SamplingParams, vocab: usize) -> Sampler {
    match Sampler::new(params, vocab) {
        Ok(s) => s,
        Err(e) => panic!("Sampler::new({params:?}, {vocab}): {e}"),
    }
}

fn seeded(seed: u64) -> SamplingParams {
    SamplingParams {
        seed: Some(seed),
        ..SamplingParams::default()
    }
}

fn processed(
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

fn distribution(params: &SamplingParams, logits: &[f32]) -> Vec<f64> {
    let s = sampler(params, logits.len());
    match s.distribution(logits, &[], &[]) {
        Ok(d) => d,
        Err(e) => panic!("distribution({logits:?}) with {params:?}: {e}"),
    }
}

/// Ids whose processed logit is finite.
fn survivors(logits: &[f32]) -> Vec<usize> {
    (0..logits.len())
        .filter(|&i| logits[i].is_finite())
        .collect()
}

/// Logits whose softmax is exactly `probs` (up to f32 rounding of the logarithms).
fn logits_of(probs: &[f64]) -> Vec<f32> {
    probs.iter().map(|p| p.ln() as f32).collect()
}

fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "got {got:?}, want {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol,
            "index {i}: got {g}, want {w} (got {got:?}, want {want:?})"
        );
    }
}

fn draw(s: &mut Sampler, logits: &[f32], prompt: &[u32], generated: &[u32]) -> u32 {
    match s.sample(logits, prompt, generated) {
        Ok(t) => t.id,
        Err(e) => panic!("sample({logits:?}): {e}"),
    }
}

fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best as u32
}

// ----------------------------------------------------------------------------------------------
// Processors, on hand-computed vectors

#[test]
fn logit_bias_is_added() {
    let params = SamplingParams {
        logit_bias: BTreeMap::from([(0, 5.0), (2, -1.5)]),
        ..seeded(1)
    };
    // [1, 2, 3, 0] + {0: +5, 2: -1.5} = [6, 2, 1.5, 0]
    let out = processed(&params, &[1.0, 2.0, 3.0, 0.0], &[], &[]);
    assert_eq!(out, [6.0, 2.0, 1.5, 0.0]);
}

#[test]
fn repetition_penalty_divides_positive_and_multiplies_negative() {
    let params = SamplingParams {
        repetition_penalty: 2.0,
        ..seeded(1)
    };
    let logits = [2.0, -1.0, 4.0, -3.0, 1.0, 0.0];
    // History prompt [0, 1] + generated [1, 3, 5]: distinct {0, 1, 3, 5}, each penalised once.
    // 0: 2 / 2 = 1; 1: -1 * 2 = -2; 3: -3 * 2 = -6; 5: 0 stays 0; 2 and 4 untouched.
    let out = processed(&params, &logits, &[0, 1], &[1, 3, 5]);
    assert_eq!(out, [1.0, -2.0, 4.0, -6.0, 1.0, 0.0]);

    // Window of 2 over prompt [0, 1] ++ generated [3] = [1, 3]: token 0 is outside it.
    let windowed = SamplingParams {
        penalty_last_n: 2,
        ..params.clone()
    };
    let out = processed(&windowed, &logits, &[0, 1], &[3]);
    assert_eq!(out, [2.0, -2.0, 4.0, -6.0, 1.0, 0.0]);

    // A penalty below 1 rewards instead: 2 / 0.5 = 4, -1 * 0.5 = -0.5.
    let reward = SamplingParams {
        repetition_penalty: 0.5,
        ..seeded(1)
    };
    let out = processed(&reward, &logits, &[0, 1], &[]);
    assert_eq!(out, [4.0, -0.5, 4.0, -3.0, 1.0, 0.0]);
}

#[test]
fn presence_and_frequency_penalties_count_generated_tokens() {
    let params = SamplingParams {
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        ..seeded(1)
    };
    let logits = [1.0; 4];
    // Generated [0, 1, 1, 0, 1]: counts 0 -> 2, 1 -> 3. Prompt tokens (3) do not count.
    // 0: 1 - 0.5 - 0.25 * 2 = 0;  1: 1 - 0.5 - 0.25 * 3 = -0.25;  2, 3: unchanged.
    let out = processed(&params, &logits, &[3, 3], &[0, 1, 1, 0, 1]);
    assert_eq!(out, [0.0, -0.25, 1.0, 1.0]);

    // Window of 3 over [3, 3, 0, 1, 1, 0, 1] = [1, 0, 1]: counts 0 -> 1, 1 -> 2.
    // 0: 1 - 0.5 - 0.25 = 0.25;  1: 1 - 0.5 - 0.5 = 0.
    let windowed = SamplingParams {
        penalty_last_n: 3,
        ..params.clone()
    };
    let out = processed(&windowed, &logits, &[3, 3], &[0, 1, 1, 0, 1]);
    assert_eq!(out, [0.25, 0.0, 1.0, 1.0]);

    // Negative penalties encourage: 1 + 1 + 0.5 * 2 = 3 for token 2 generated twice.
    let negative = SamplingParams {
        presence_penalty: -1.0,
        frequency_penalty: -0.5,
        ..seeded(1)
    };
    let out = processed(&negative, &logits, &[], &[2, 2]);
    assert_eq!(out, [1.0, 1.0, 3.0, 1.0]);
}

#[test]
fn temperature_divides_logits() {
    let params = SamplingParams {
        temperature: 0.5,
        ..seeded(1)
    };
    // [1, -2, 0.5] / 0.5 = [2, -4, 1]
    assert_eq!(
        processed(&params, &[1.0, -2.0, 0.5], &[], &[]),
        [2.0, -4.0, 1.0]
    );

    // Probabilities [0.8, 0.2] = logits [ln 4, 0] + c; at T = 2 they become [ln 2, 0]: [2/3, 1/3].
    let hot = SamplingParams {
        temperature: 2.0,
        ..seeded(1)
    };
    let d = distribution(&hot, &[4f32.ln(), 0.0]);
    assert_close(&d, &[2.0 / 3.0, 1.0 / 3.0], 1e-6);
}

#[test]
fn top_k_keeps_the_k_largest() {
    let params = SamplingParams {
        top_k: 2,
        ..seeded(1)
    };
    // Largest two of [1, 3, 2, 0, 2.5]: ids 1 (3.0) and 4 (2.5).
    let out = processed(&params, &[1.0, 3.0, 2.0, 0.0, 2.5], &[], &[]);
    assert_eq!(out, [NEG_INF, 3.0, NEG_INF, NEG_INF, 2.5]);
    // Ties at the cut go to the lower ids: of three 2.0s, ids 1 and 2 survive.
    let out = processed(&params, &[0.5, 2.0, 2.0, 1.0, 2.0], &[], &[]);
    assert_eq!(out, [NEG_INF, 2.0, 2.0, NEG_INF, NEG_INF]);
    // k at or above the vocabulary size changes nothing.
    let wide = SamplingParams {
        top_k: 5,
        ..seeded(1)
    };
    assert_eq!(
        processed(&wide, &[1.0, 3.0, 2.0, 0.0, 2.5], &[], &[]),
        [1.0, 3.0, 2.0, 0.0, 2.5]
    );
}

#[test]
fn top_p_keeps_the_smallest_nucleus() {
    // Probabilities [0.1, 0.4, 0.2, 0.3]; by probability: 1 (0.4), 3 (0.3), 2 (0.2), 0 (0.1).
    let logits = logits_of(&[0.1, 0.4, 0.2, 0.3]);
    // top_p 0.6: cumulative 0.4 < 0.6, then 0.7 >= 0.6 -> keep {1, 3}.
    let p = SamplingParams {
        top_p: 0.6,
        ..seeded(1)
    };
    assert_eq!(survivors(&processed(&p, &logits, &[], &[])), [1, 3]);
    assert_close(
        &distribution(&p, &logits),
        &[0.0, 0.4 / 0.7, 0.0, 0.3 / 0.7],
        1e-6,
    );
    // top_p 0.75: 0.4, 0.7, then 0.9 >= 0.75 -> keep {1, 3, 2}.
    let p = SamplingParams {
        top_p: 0.75,
        ..seeded(1)
    };
    assert_eq!(survivors(&processed(&p, &logits, &[], &[])), [1, 2, 3]);
    // top_p 0.3: the first token alone (0.4) reaches it.
    let p = SamplingParams {
        top_p: 0.3,
        ..seeded(1)
    };
    assert_eq!(survivors(&processed(&p, &logits, &[], &[])), [1]);
}

#[test]
fn min_p_keeps_tokens_near_the_top() {
    // Probabilities [0.5, 0.25, 0.15, 0.1].
    let logits = logits_of(&[0.5, 0.25, 0.15, 0.1]);
    // min_p 0.25: threshold 0.25 * 0.5 = 0.125 -> keep {0, 1, 2}, drop 3 (0.1).
    let p = SamplingParams {
        min_p: 0.25,
        ..seeded(1)
    };
    assert_eq!(survivors(&processed(&p, &logits, &[], &[])), [0, 1, 2]);
    assert_close(
        &distribution(&p, &logits),
        &[0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0.0],
        1e-6,
    );
    // min_p 0.45: threshold 0.225 -> keep {0, 1}.
    let p = SamplingParams {
        min_p: 0.45,
        ..seeded(1)
    };
    assert_eq!(survivors(&processed(&p, &logits, &[], &[])), [0, 1]);
    // min_p 1: only the most likely token.
    let p = SamplingParams {
        min_p: 1.0,
        ..seeded(1)
    };
    assert_eq!(survivors(&processed(&p, &logits, &[], &[])), [0]);
}

#[test]
fn typical_keeps_tokens_near_the_entropy() {
    // Probabilities [1/2, 1/4, 1/8, 1/8]. Entropy H = (1/2)ln2 + (1/4)2ln2 + 2(1/8)3ln2
    // = 1.75 ln2. Surprisals: 0 -> ln2, 1 -> 2ln2, 2 and 3 -> 3ln2. Distances from H:
    // 0 -> 0.75 ln2, 1 -> 0.25 ln2, 2 and 3 -> 1.25 ln2. Order: 1, 0, 2, 3 (tie to lower id).
    let logits = logits_of(&[0.5, 0.25, 0.125, 0.125]);
    // typical_p 0.5: cumulative 0.25 < 0.5, then 0.75 >= 0.5 -> keep {1, 0}.
    let p = SamplingParams {
        typical_p: 0.5,
        ..seeded(1)
    };
    assert_eq!(survivors(&processed(&p, &logits, &[], &[])), [0, 1]);
    assert_close(
        &distribution(&p, &logits),
        &[2.0 / 3.0, 1.0 / 3.0, 0.0, 0.0],
        1e-6,
    );
    // typical_p 0.2: token 1 alone (0.25) reaches it; the most likely token is dropped.
    let p = SamplingParams {
        typical_p: 0.2,
        ..seeded(1)
    };
    assert_eq!(survivors(&processed(&p, &logits, &[], &[])), [1]);
    // typical_p 0.8: 0.25, 0.75, then 0.875 -> keep {1, 0, 2}; 2 beats 3 on the tie.
    let p = SamplingParams {
        typical_p: 0.8,
        ..seeded(1)
    };
    assert_eq!(survivors(&processed(&p, &logits, &[], &[])), [0, 1, 2]);
}

#[test]
fn filters_see_the_survivors_of_the_previous_filter() {
    // Probabilities [0.4, 0.3, 0.2, 0.1]. top_p 0.75 alone: 0.4, 0.7, 0.9 -> keep {0, 1, 2}.
    let logits = logits_of(&[0.4, 0.3, 0.2, 0.1]);
    let p = SamplingParams {
        top_p: 0.75,
        ..seeded(1)
    };
    assert_eq!(survivors(&processed(&p, &logits, &[], &[])), [0, 1, 2]);
    // After top_k 3 the survivors renormalise to [4/9, 3/9, 2/9]: 0.444, then 0.778 >= 0.75
    // -> keep {0, 1}.
    let p = SamplingParams {
        top_k: 3,
        top_p: 0.75,
        ..seeded(1)
    };
    assert_eq!(survivors(&processed(&p, &logits, &[], &[])), [0, 1]);
    // Bias runs before the filters: +10 on token 3 makes it the only survivor of top_k 1... of
    // top_p 0.5 (its probability is then ~0.9996).
    let p = SamplingParams {
        top_p: 0.5,
        logit_bias: BTreeMap::from([(3, 10.0)]),
        ..seeded(1)
    };
    assert_eq!(survivors(&processed(&p, &logits, &[], &[])), [3]);
}

/// Survivors of top-p by the definition, with a full sort.
fn reference_top_p(logits: &[f32], top_p: f64) -> Vec<usize> {
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &x| m.max(f64::from(x)));
    let w: Vec<f64> = logits.iter().map(|&x| (f64::from(x) - max).exp()).collect();
    let total: f64 = w.iter().sum();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let mut cumulative = 0.0;
    let mut kept = Vec::new();
    for id in order {
        kept.push(id);
        cumulative += w[id];
        if cumulative >= top_p * total {
            break;
        }
    }
    kept.sort_unstable();
    kept
}

/// Survivors of typical sampling by the definition, with a full sort.
fn reference_typical(logits: &[f32], mass: f64) -> Vec<usize> {
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &x| m.max(f64::from(x)));
    let sum: f64 = logits.iter().map(|&x| (f64::from(x) - max).exp()).sum();
    let lse = max + sum.ln();
    let lp: Vec<f64> = logits.iter().map(|&x| f64::from(x) - lse).collect();
    let entropy: f64 = -lp.iter().map(|&l| l.exp() * l).sum::<f64>();
    let distance: Vec<f64> = lp.iter().map(|&l| (-l - entropy).abs()).collect();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| distance[a].total_cmp(&distance[b]).then(a.cmp(&b)));
    let mut cumulative = 0.0;
    let mut kept = Vec::new();
    for id in order {
        kept.push(id);
        cumulative += lp[id].exp();
        if cumulative >= mass {
            break;
        }
    }
    kept.sort_unstable();
    kept
}

#[test]
fn filters_on_a_large_vocabulary_match_a_full_sort() {
    // Large enough that top-p and typical sort in several rounds rather than all at once.
    const SEED: u64 = 0x6EED_0008;
    let mut rng = ChaCha20Rng::seed_from_u64(SEED);
    let vocab = 5000;
    for round in 0..60 {
        // Alternately peaked (a few large logits) and flat (small spread, many ties).
        let logits: Vec<f32> = if round % 2 == 0 {
            (0..vocab)
                .map(|_| {
                    12.0 * rng.random_range(0.0..1.0f32).powi(12) + rng.random_range(-2.0..2.0)
                })
                .collect()
        } else {
            (0..vocab)
                .map(|_| f32::from(rng.random_range(0..20u8)) * 0.1)
                .collect()
        };
        let mass = [0.05, 0.3, 0.6, 0.9, 0.99][round % 5];
        let p = SamplingParams {
            top_p: mass,
            ..seeded(1)
        };
        assert_eq!(
            survivors(&processed(&p, &logits, &[], &[])),
            reference_top_p(&logits, f64::from(mass)),
            "seed {SEED:#x} round {round}: top_p {mass}"
        );
        let p = SamplingParams {
            typical_p: mass,
            ..seeded(1)
        };
        assert_eq!(
            survivors(&processed(&p, &logits, &[], &[])),
            reference_typical(&logits, f64::from(mass)),
            "seed {SEED:#x} round {round}: typical_p {mass}"
        );
        // top_k with ties at the cut: the lower ids win.
        let k = [1, 7, 300, 2500][round % 4];
        let p = SamplingParams {
            top_k: k,
            ..seeded(1)
        };
        let mut order: Vec<usize> = (0..vocab).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        let mut want = order[..k].to_vec();
        want.sort_unstable();
        assert_eq!(
            survivors(&processed(&p, &logits, &[], &[])),
            want,
            "seed {SEED:#x} round {round}: top_k {k}"
        );
    }
}

#[test]
fn every_filter_keeps_at_least_one_token() {
    let logits = [0.0f32; 6];
    let strict = [
        SamplingParams {
            top_p: 1e-9,
            ..seeded(1)
        },
        SamplingParams {
            typical_p: 1e-9,
            ..seeded(1)
        },
        SamplingParams {
            min_p: 1.0,
            ..seeded(1)
        },
        SamplingParams {
            top_k: 1,
            top_p: 1e-9,
            typical_p: 1e-9,
            min_p: 1.0,
            ..seeded(1)
        },
    ];
    for p in &strict {
        let kept = survivors(&processed(p, &logits, &[], &[]));
        assert!(!kept.is_empty(), "{p:?} kept nothing");
        let d = distribution(p, &logits);
        assert!((d.iter().sum::<f64>() - 1.0).abs() < 1e-12, "{p:?}: {d:?}");
    }
}

// ----------------------------------------------------------------------------------------------
// Greedy

#[test]
fn greedy_variants_all_pick_the_argmax() {
    const SEED: u64 = 0x6EED_0001;
    let mut rng = ChaCha20Rng::seed_from_u64(SEED);
    let greedy = [
        SamplingParams {
            temperature: 0.0,
            ..seeded(11)
        },
        SamplingParams {
            top_k: 1,
            ..seeded(12)
        },
        SamplingParams {
            top_p: 1e-6,
            ..seeded(13)
        },
        SamplingParams {
            top_k: 1,
            temperature: 5.0,
            ..seeded(14)
        },
    ];
    let vocab = 1000;
    let mut samplers: Vec<Sampler> = greedy.iter().map(|p| sampler(p, vocab)).collect();
    for round in 0..50 {
        let logits: Vec<f32> = (0..vocab)
            .map(|_| rng.random_range(-10.0..10.0f32))
            .collect();
        let want = argmax(&logits);
        for (s, p) in samplers.iter_mut().zip(&greedy) {
            let got = draw(s, &logits, &[], &[]);
            assert_eq!(got, want, "seed {SEED:#x}, round {round}, {p:?}");
        }
    }
}

#[test]
fn greedy_ties_go_to_the_lowest_id() {
    let logits = [1.0, 5.0, 2.0, 5.0, 5.0];
    for p in [
        SamplingParams::greedy(),
        SamplingParams {
            top_k: 1,
            ..seeded(1)
        },
        SamplingParams {
            top_p: 1e-6,
            ..seeded(1)
        },
    ] {
        let mut s = sampler(&p, logits.len());
        assert_eq!(draw(&mut s, &logits, &[], &[]), 1, "{p:?}");
    }
    // Greedy keeps exactly one token in `process`.
    let out = processed(&SamplingParams::greedy(), &logits, &[], &[]);
    assert_eq!(out, [NEG_INF, 5.0, NEG_INF, NEG_INF, NEG_INF]);
}

#[test]
fn greedy_still_applies_bias_and_penalties() {
    let logits = [3.0, 2.0, 1.0];
    let p = SamplingParams {
        logit_bias: BTreeMap::from([(2, 5.0)]),
        ..SamplingParams::greedy()
    };
    assert_eq!(draw(&mut sampler(&p, 3), &logits, &[], &[]), 2);
    let p = SamplingParams {
        repetition_penalty: 2.0,
        ..SamplingParams::greedy()
    };
    // 3 / 2 = 1.5 < 2: token 1 wins once token 0 is in the history.
    assert_eq!(draw(&mut sampler(&p, 3), &logits, &[0], &[]), 1);
}

// ----------------------------------------------------------------------------------------------
// Random draws

/// Chi-square critical values at p = 0.001 for 1..=10 degrees of freedom.
const CHI2_CRITICAL_P001: [f64; 10] = [
    10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322, 26.124, 27.877, 29.588,
];

fn chi_square_check(params: &SamplingParams, logits: &[f32], prompt: &[u32], generated: &[u32]) {
    const DRAWS: usize = 40_000;
    let seed = params.seed.unwrap_or_default();
    let mut s = sampler(params, logits.len());
    let want = match s.distribution(logits, prompt, generated) {
        Ok(d) => d,
        Err(e) => panic!("distribution: {e}"),
    };
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..DRAWS {
        counts[draw(&mut s, logits, prompt, generated) as usize] += 1;
    }
    let mut chi2 = 0.0;
    let mut cells = 0;
    for (i, (&c, &p)) in counts.iter().zip(&want).enumerate() {
        if p == 0.0 {
            assert_eq!(
                c, 0,
                "seed {seed:#x}: filtered token {i} was drawn {c} times"
            );
            continue;
        }
        let expected = p * DRAWS as f64;
        assert!(
            expected >= 5.0,
            "test setup: expected count {expected} for token {i}"
        );
        chi2 += (c as f64 - expected).powi(2) / expected;
        cells += 1;
    }
    let df = cells - 1;
    let critical = CHI2_CRITICAL_P001[df - 1];
    assert!(
        chi2 < critical,
        "seed {seed:#x}: chi-square {chi2:.3} >= {critical} with {df} degrees of freedom; \
         counts {counts:?}, expected probabilities {want:?}"
    );
}

#[test]
fn draw_frequencies_match_the_distribution() {
    let logits = [0.0, 1.0, 0.5, -0.5, 2.0, 1.5, -1.0, 0.2];
    // No filter: 8 cells, 7 degrees of freedom.
    chi_square_check(&seeded(0x5EED_0002), &logits, &[], &[]);
    // Temperature 0.8 and top_k 5 (keeps 4, 5, 1, 2, 7): 4 degrees of freedom.
    let p = SamplingParams {
        temperature: 0.8,
        top_k: 5,
        ..seeded(0x5EED_0003)
    };
    chi_square_check(&p, &logits, &[], &[]);
    // Every processor at once.
    let p = SamplingParams {
        temperature: 1.3,
        top_k: 7,
        top_p: 0.95,
        min_p: 0.05,
        typical_p: 0.99,
        repetition_penalty: 1.3,
        presence_penalty: 0.4,
        frequency_penalty: 0.2,
        logit_bias: BTreeMap::from([(6, 1.0)]),
        ..seeded(0x5EED_0004)
    };
    chi_square_check(&p, &logits, &[4, 4], &[5, 5, 1]);
}

fn sequence(params: &SamplingParams, logits: &[f32], n: usize) -> Vec<u32> {
    let mut s = sampler(params, logits.len());
    (0..n).map(|_| draw(&mut s, logits, &[], &[])).collect()
}

#[test]
fn same_seed_same_sequence_different_seed_different_sequence() {
    let logits = [0.1, 0.2, 0.3, 0.0, -0.1, 0.25, 0.05, 0.15];
    let a = sequence(&seeded(42), &logits, 200);
    let b = sequence(&seeded(42), &logits, 200);
    let c = sequence(&seeded(43), &logits, 200);
    assert_eq!(a, b, "seed 42 twice");
    assert_ne!(a, c, "seeds 42 and 43");

    // An unseeded sampler reports a seed that reproduces its draws.
    let mut unseeded = sampler(&SamplingParams::default(), logits.len());
    let drawn: Vec<u32> = (0..200)
        .map(|_| draw(&mut unseeded, &logits, &[], &[]))
        .collect();
    let replay = sequence(&seeded(unseeded.seed()), &logits, 200);
    assert_eq!(drawn, replay, "seed {:#x}", unseeded.seed());
    assert_eq!(sampler(&seeded(7), 4).seed(), 7);
    let other = sampler(&SamplingParams::default(), 4);
    assert_ne!(unseeded.seed(), other.seed(), "two system seeds collided");
}

#[test]
fn draws_follow_the_documented_rule() {
    // One uniform per draw, u = top 53 bits of one ChaCha20 u64 / 2^53, then inverse-CDF over
    // the softmax in token-id order: the first id whose cumulative probability exceeds u.
    // Recomputed here independently of the sampler, and pinned: a change to the rule changes
    // every seeded run users may have recorded (and native and wasm32 must agree).
    const SEED: u64 = 2024;
    let logits = [0.0f32, 1.0, 0.5, -0.5, 2.0, 1.5, -1.0, 0.2];
    let weights: Vec<f64> = logits.iter().map(|&x| f64::from(x).exp()).collect();
    let total: f64 = weights.iter().sum();
    let mut rng = ChaCha20Rng::seed_from_u64(SEED);
    let want: Vec<u32> = (0..16)
        .map(|_| {
            let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            let mut cumulative = 0.0;
            let mut chosen = logits.len() - 1;
            for (i, w) in weights.iter().enumerate() {
                cumulative += w / total;
                if cumulative > u {
                    chosen = i;
                    break;
                }
            }
            chosen as u32
        })
        .collect();
    let got = sequence(&seeded(SEED), &logits, 16);
    assert_eq!(got, want, "seed {SEED}");
    assert_eq!(
        got,
        [5, 5, 5, 1, 7, 5, 0, 4, 5, 4, 5, 3, 5, 7, 4, 5],
        "seed {SEED}"
    );
}

#[test]
fn logprob_is_the_raw_log_softmax() {
    const SEED: u64 = 0x6EED_0005;
    let mut rng = ChaCha20Rng::seed_from_u64(SEED);
    let params = SamplingParams {
        temperature: 0.7,
        top_k: 20,
        top_p: 0.9,
        repetition_penalty: 1.5,
        logit_bias: BTreeMap::from([(3, 4.0)]),
        ..seeded(SEED)
    };
    let vocab = 300;
    let mut s = sampler(&params, vocab);
    for round in 0..100 {
        let logits: Vec<f32> = (0..vocab).map(|_| rng.random_range(-8.0..8.0f32)).collect();
        let lsm = match log_softmax(&logits) {
            Ok(l) => l,
            Err(e) => panic!("log_softmax: {e}"),
        };
        let t = match s.sample(&logits, &[1, 2, 3], &[4, 5]) {
            Ok(t) => t,
            Err(e) => panic!("sample: {e}"),
        };
        let want = lsm[t.id as usize];
        assert!(
            (t.logprob - want).abs() <= 1e-6,
            "seed {SEED:#x} round {round}: token {} logprob {} != {want}",
            t.id,
            t.logprob
        );
    }
    // Greedy too.
    let mut g = sampler(&SamplingParams::greedy(), 3);
    let t = g.sample(&[1.0, 3.0, 2.0], &[], &[]).ok();
    let lse = (1f64.exp() + 3f64.exp() + 2f64.exp()).ln();
    assert_eq!(t.map(|t| t.id), Some(1));
    assert!(t.is_some_and(|t| (f64::from(t.logprob) - (3.0 - lse)).abs() < 1e-6));
}

#[test]
fn log_softmax_is_stable_and_normalised() {
    let l = log_softmax(&[1000.0, 1000.0, -1000.0])
        .ok()
        .unwrap_or_default();
    assert_eq!(l.len(), 3);
    assert!((l[0] - (-std::f32::consts::LN_2)).abs() < 1e-6, "{l:?}");
    assert!((l[1] - l[0]).abs() == 0.0);
    assert!(l[2] < -1999.0 && l[2].is_finite());
    let l = log_softmax(&[0.5, -0.25, 2.0, 0.0])
        .ok()
        .unwrap_or_default();
    let total: f64 = l.iter().map(|&x| f64::from(x).exp()).sum();
    assert!((total - 1.0).abs() < 1e-6);
    assert!(log_softmax(&[]).is_err());
}

// ----------------------------------------------------------------------------------------------
// Bad inputs

fn invalid_name(e: &Error) -> Option<&'static str> {
    match e {
        Error::InvalidArgument { name, .. } => Some(name),
        _ => None,
    }
}

#[test]
fn non_finite_logits_are_rejected() {
    let mut s = sampler(&seeded(1), 4);
    for (bad, index) in [
        ([0.0, f32::NAN, 1.0, 2.0], 1),
        ([0.0, 1.0, f32::INFINITY, 2.0], 2),
        ([f32::NEG_INFINITY, 1.0, 2.0, 3.0], 0),
        ([0.0, 1.0, 2.0, f32::NAN], 3),
    ] {
        let needle = format!("index {index}");
        let errors = [
            s.sample(&bad, &[], &[]).err(),
            s.distribution(&bad, &[], &[]).err(),
            s.process(&mut bad.clone(), &[], &[]).err(),
            log_softmax(&bad).err(),
        ];
        for e in errors {
            let msg = e.map(|e| e.to_string()).unwrap_or_default();
            assert!(
                msg.contains(&needle),
                "{bad:?}: `{msg}` does not name {needle}"
            );
        }
    }
    // Greedy too: NaN must never be argmax'ed.
    let mut g = sampler(&SamplingParams::greedy(), 3);
    assert!(g.sample(&[f32::NAN, 0.0, 1.0], &[], &[]).is_err());
}

#[test]
fn wrong_lengths_and_out_of_range_history_are_rejected() {
    let mut s = sampler(&seeded(1), 4);
    let e = s.sample(&[0.0; 3], &[], &[]).err();
    assert_eq!(e.as_ref().and_then(invalid_name), Some("logits"), "{e:?}");
    let e = s.sample(&[0.0; 4], &[4], &[]).err();
    assert_eq!(e.as_ref().and_then(invalid_name), Some("prompt"), "{e:?}");
    let e = s.sample(&[0.0; 4], &[], &[0, 9]).err();
    assert_eq!(
        e.as_ref().and_then(invalid_name),
        Some("generated"),
        "{e:?}"
    );
    let e = Sampler::new(&seeded(1), 0).err();
    assert_eq!(
        e.as_ref().and_then(invalid_name),
        Some("vocab_size"),
        "{e:?}"
    );
}

type Mutation = fn(&mut SamplingParams);

#[test]
fn every_invalid_parameter_is_rejected_by_name() {
    let bad: &[(&str, Mutation)] = &[
        ("temperature", |p| p.temperature = -0.1),
        ("temperature", |p| p.temperature = f32::NAN),
        ("temperature", |p| p.temperature = f32::INFINITY),
        ("top_p", |p| p.top_p = 0.0),
        ("top_p", |p| p.top_p = -0.5),
        ("top_p", |p| p.top_p = 1.01),
        ("top_p", |p| p.top_p = f32::NAN),
        ("min_p", |p| p.min_p = -0.01),
        ("min_p", |p| p.min_p = 1.5),
        ("min_p", |p| p.min_p = f32::NAN),
        ("typical_p", |p| p.typical_p = 0.0),
        ("typical_p", |p| p.typical_p = 2.0),
        ("typical_p", |p| p.typical_p = f32::NAN),
        ("repetition_penalty", |p| p.repetition_penalty = 0.0),
        ("repetition_penalty", |p| p.repetition_penalty = -1.0),
        ("repetition_penalty", |p| p.repetition_penalty = f32::NAN),
        ("repetition_penalty", |p| {
            p.repetition_penalty = f32::INFINITY
        }),
        ("presence_penalty", |p| p.presence_penalty = 2.01),
        ("presence_penalty", |p| p.presence_penalty = -2.5),
        ("presence_penalty", |p| p.presence_penalty = f32::NAN),
        ("frequency_penalty", |p| p.frequency_penalty = 3.0),
        ("frequency_penalty", |p| p.frequency_penalty = -2.01),
        ("frequency_penalty", |p| p.frequency_penalty = f32::NAN),
        ("logit_bias", |p| {
            p.logit_bias = BTreeMap::from([(1, 100.5)])
        }),
        ("logit_bias", |p| {
            p.logit_bias = BTreeMap::from([(1, -101.0)])
        }),
        ("logit_bias", |p| {
            p.logit_bias = BTreeMap::from([(1, f32::NAN)])
        }),
        ("logit_bias", |p| {
            p.logit_bias = BTreeMap::from([(1, f32::NEG_INFINITY)])
        }),
        ("stop", |p| p.stop = vec![String::new()]),
        ("stop", |p| p.stop = vec!["a".into(), String::new()]),
        ("stop", |p| {
            p.stop = (0..17).map(|i| i.to_string()).collect()
        }),
        ("num_beams", |p| p.num_beams = 0),
        ("num_beams", |p| p.num_beams = 17),
        ("length_penalty", |p| p.length_penalty = f32::NAN),
        ("length_penalty", |p| p.length_penalty = f32::NEG_INFINITY),
        ("num_return_sequences", |p| p.num_return_sequences = 0),
        ("num_return_sequences", |p| p.num_return_sequences = 65),
        ("num_return_sequences", |p| {
            p.num_beams = 4;
            p.num_return_sequences = 5;
        }),
    ];
    for (name, mutate) in bad {
        let mut p = seeded(1);
        mutate(&mut p);
        let e = p.validate().err();
        let msg = e.as_ref().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(
            e.as_ref().and_then(invalid_name),
            Some(*name),
            "{p:?}: {e:?}"
        );
        assert!(msg.contains(name), "`{msg}` does not name {name}");
        assert!(msg.contains("got"), "`{msg}` does not give the value");
        assert!(
            Sampler::new(&p, 100).is_err(),
            "Sampler::new accepted {p:?}"
        );
    }

    // Ids checked against the vocabulary.
    let vocab_bad: &[(&str, Mutation)] = &[
        ("logit_bias", |p| p.logit_bias = BTreeMap::from([(10, 1.0)])),
        ("logit_bias", |p| {
            p.logit_bias = BTreeMap::from([(u32::MAX, 1.0)])
        }),
        ("stop_token_ids", |p| p.stop_token_ids = vec![3, 10]),
    ];
    for (name, mutate) in vocab_bad {
        let mut p = seeded(1);
        mutate(&mut p);
        assert!(p.validate().is_ok(), "{p:?}");
        let e = p.validate_for_vocab(10).err();
        assert_eq!(
            e.as_ref().and_then(invalid_name),
            Some(*name),
            "{p:?}: {e:?}"
        );
        let msg = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains(name) && msg.contains("10"), "{msg}");
        assert!(Sampler::new(&p, 10).is_err());
    }
}

#[test]
fn boundary_values_are_accepted() {
    let good: &[Mutation] = &[
        |p| p.temperature = 0.0,
        |p| p.temperature = 100.0,
        |p| p.top_p = 1.0,
        |p| p.top_p = 1e-9,
        |p| p.min_p = 0.0,
        |p| p.min_p = 1.0,
        |p| p.typical_p = 1.0,
        |p| p.repetition_penalty = 1e-3,
        |p| p.presence_penalty = -2.0,
        |p| p.frequency_penalty = 2.0,
        |p| p.logit_bias = BTreeMap::from([(0, -100.0), (9, 100.0)]),
        |p| p.stop = (0..16).map(|i| i.to_string()).collect(),
        |p| p.stop_token_ids = vec![0, 9],
        |p| p.num_beams = 16,
        |p| p.length_penalty = -3.0,
        |p| p.num_return_sequences = 64,
        |p| {
            p.num_beams = 4;
            p.num_return_sequences = 4;
        },
        |p| p.max_new_tokens = 0,
        |p| p.top_k = usize::MAX,
    ];
    for mutate in good {
        let mut p = seeded(1);
        mutate(&mut p);
        assert!(
            p.validate_for_vocab(10).is_ok(),
            "{p:?}: {:?}",
            p.validate_for_vocab(10)
        );
        assert!(Sampler::new(&p, 10).is_ok());
    }
    assert!(SamplingParams::default().validate().is_ok());
    assert!(SamplingParams::greedy().validate().is_ok());
}

// ----------------------------------------------------------------------------------------------
// JSON

fn parse(json: &str) -> SamplingParams {
    match SamplingParams::from_json(json) {
        Ok(p) => p,
        Err(e) => panic!("from_json({json}): {e}"),
    }
}

#[test]
fn from_json_accepts_snake_and_camel_case() {
    let want = SamplingParams {
        temperature: 0.7,
        top_k: 40,
        top_p: 0.9,
        min_p: 0.05,
        typical_p: 0.95,
        repetition_penalty: 1.1,
        presence_penalty: 0.5,
        frequency_penalty: -0.5,
        penalty_last_n: 64,
        logit_bias: BTreeMap::from([(42, -5.0), (7, 2.5)]),
        seed: Some(1234),
        max_new_tokens: 100,
        stop: vec!["\n\n".into(), "User:".into()],
        stop_token_ids: vec![2, 3],
        num_beams: 4,
        length_penalty: 0.8,
        early_stopping: true,
        num_return_sequences: 2,
    };
    let snake = r#"{
        "temperature": 0.7, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "typical_p": 0.95,
        "repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": -0.5,
        "penalty_last_n": 64, "logit_bias": {"42": -5.0, "7": 2.5}, "seed": 1234,
        "max_new_tokens": 100, "stop": ["\n\n", "User:"], "stop_token_ids": [2, 3],
        "num_beams": 4, "length_penalty": 0.8, "early_stopping": true,
        "num_return_sequences": 2
    }"#;
    let camel = r#"{
        "temperature": 0.7, "topK": 40, "topP": 0.9, "minP": 0.05, "typicalP": 0.95,
        "repetitionPenalty": 1.1, "presencePenalty": 0.5, "frequencyPenalty": -0.5,
        "penaltyLastN": 64, "logitBias": {"42": -5.0, "7": 2.5}, "seed": 1234,
        "maxNewTokens": 100, "stop": ["\n\n", "User:"], "stopTokenIds": [2, 3],
        "numBeams": 4, "lengthPenalty": 0.8, "earlyStopping": true,
        "numReturnSequences": 2
    }"#;
    assert_eq!(parse(snake), want);
    assert_eq!(parse(camel), want);
    // Missing fields take their defaults; round trip through serde.
    assert_eq!(parse("{}"), SamplingParams::default());
    assert_eq!(parse(r#"{"topK": 5}"#).top_k, 5);
    assert_eq!(parse(r#"{"seed": null}"#).seed, None);
    let text = serde_json::to_string(&want).unwrap_or_default();
    assert_eq!(parse(&text), want, "{text}");
}

#[test]
fn from_json_rejects_unknown_fields_wrong_types_and_bad_values() {
    let cases: &[(&str, &str, &str)] = &[
        // (json, error name, text the message must contain)
        (r#"{"top_q": 0.5}"#, "sampling_params", "top_q"),
        (
            r#"{"temperature": 1, "TopK": 5}"#,
            "sampling_params",
            "TopK",
        ),
        (r#"{"top_k": "5"}"#, "top_k", "top_k"),
        (r#"{"topK": -1}"#, "top_k", "topK"),
        (r#"{"temperature": "hot"}"#, "temperature", "temperature"),
        (r#"{"temperature": 1e999}"#, "sampling_params", ""),
        (r#"{"temperature": 1e300}"#, "temperature", "temperature"),
        (r#"{"stop": "END"}"#, "stop", "stop"),
        (r#"{"stop": [1]}"#, "stop", "stop"),
        (r#"{"seed": -1}"#, "seed", "seed"),
        (r#"{"seed": 18446744073709551616}"#, "seed", "seed"),
        (
            r#"{"early_stopping": 1}"#,
            "early_stopping",
            "early_stopping",
        ),
        (
            r#"{"logit_bias": {"abc": 1.0}}"#,
            "logit_bias",
            "logit_bias",
        ),
        (r#"{"logitBias": {"-3": 1.0}}"#, "logit_bias", "logitBias"),
        (r#"{"logit_bias": [1, 2]}"#, "logit_bias", "logit_bias"),
        (r#"{"logit_bias": {"1": 200}}"#, "logit_bias", "logit_bias"),
        (r#"{"top_p": 2}"#, "top_p", "top_p"),
        (r#"{"numBeams": 0}"#, "num_beams", "num_beams"),
        (r#"{"top_k": null}"#, "top_k", "top_k"),
        (r#"{"top_k": 1, "topK": 2}"#, "sampling_params", "top_k"),
        (r#"[]"#, "sampling_params", "object"),
        (r#"null"#, "sampling_params", "object"),
        (r#"{"top_k": 1"#, "sampling_params", "JSON"),
    ];
    for &(json, name, needle) in cases {
        let e = SamplingParams::from_json(json).err();
        assert_eq!(
            e.as_ref().and_then(invalid_name),
            Some(name),
            "{json}: {e:?}"
        );
        let msg = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            msg.contains(needle),
            "{json}: `{msg}` does not contain `{needle}`"
        );
    }
}

#[test]
fn from_json_never_panics() {
    let garbage = [
        "",
        " ",
        "{",
        "}",
        "{}}",
        "\"",
        "nul",
        "true",
        "0",
        "-0",
        "1e99999",
        "\"{}\"",
        "{\"\": 1}",
        "{\"top_k\":}",
        "{\"top_k\": 1,}",
        "{top_k: 1}",
        "{'top_k': 1}",
        "{\"top_k\": 1.5}",
        "{\"top_k\": 1e30}",
        "{\"top_k\": 99999999999999999999999}",
        "{\"max_new_tokens\": -0}",
        "{\"temperature\": NaN}",
        "{\"temperature\": Infinity}",
        "{\"temperature\": -0.0}",
        "{\"logit_bias\": {\"4294967296\": 1}}",
        "{\"logit_bias\": {\"\": 1}}",
        "{\"logit_bias\": {\"1\": null}}",
        "{\"stop\": [\"\\ud800\"]}",
        "{\"stop\": [\"\\u0000\"]}",
        "{\"stop\": [[[[[[]]]]]]}",
        "\u{feff}{}",
        "{\"seed\": 1.0}",
        "\0",
        "{\"top_k\": 1} trailing",
        "{\"top_k\": 1}{\"top_k\": 2}",
    ];
    for g in garbage {
        if let Ok(p) = SamplingParams::from_json(g) {
            assert!(p.validate().is_ok(), "{g:?} parsed into invalid {p:?}");
        }
    }
    let deep = "[".repeat(100_000);
    assert!(SamplingParams::from_json(&deep).is_err());
    let deep = format!("{{\"stop\": {}", "[".repeat(100_000));
    assert!(SamplingParams::from_json(&deep).is_err());

    // Random mutations of a valid document.
    const SEED: u64 = 0x6EED_0006;
    let mut rng = ChaCha20Rng::seed_from_u64(SEED);
    let valid: Vec<char> = r#"{"temperature": 0.7, "topK": 40, "top_p": 0.9, "logitBias": {"42": -5.0}, "stop": ["a", "b"], "seed": 3, "numBeams": 2, "early_stopping": true}"#
        .chars()
        .collect();
    let alphabet: Vec<char> = "{}[]\":,0123456789.-eE+ abtnul\\_pPkK\u{e9}\u{1F600}"
        .chars()
        .collect();
    for round in 0..5000 {
        let mut doc = valid.clone();
        for _ in 0..rng.random_range(1..=4) {
            let at = rng.random_range(0..doc.len());
            match rng.random_range(0..3) {
                0 => doc[at] = alphabet[rng.random_range(0..alphabet.len())],
                1 => {
                    doc.remove(at);
                }
                _ => doc.insert(at, alphabet[rng.random_range(0..alphabet.len())]),
            }
        }
        let text: String = doc.into_iter().collect();
        let result = std::panic::catch_unwind(|| SamplingParams::from_json(&text));
        match result {
            Ok(Ok(p)) => assert!(p.validate().is_ok(), "seed {SEED:#x} round {round}: {text}"),
            Ok(Err(_)) => {}
            Err(_) => panic!("seed {SEED:#x} round {round}: from_json panicked on {text}"),
        }
    }
}

// ----------------------------------------------------------------------------------------------
// Stop strings

fn stops(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn out(text: &str, stopped: bool) -> StopOutput {
    StopOutput {
        text: text.to_string(),
        stopped,
    }
}

#[test]
fn stop_split_across_two_pieces() {
    let mut m = StopMatcher::new(&stops(&["</s>"]));
    assert_eq!(m.push("Hello </"), out("Hello ", false));
    assert_eq!(m.push("s> world"), out("", true));
    assert!(m.stopped());
    assert_eq!(m.push("more"), out("", true));
    assert_eq!(m.finish(), "");
}

#[test]
fn stop_split_across_three_pieces() {
    let mut m = StopMatcher::new(&stops(&["STOP"]));
    assert_eq!(m.push("aS"), out("a", false));
    assert_eq!(m.push("T"), out("", false));
    assert_eq!(m.push("OPb"), out("", true));
    assert_eq!(m.finish(), "");
}

#[test]
fn partial_match_is_released_when_it_breaks() {
    let mut m = StopMatcher::new(&stops(&["</s>"]));
    assert_eq!(m.push("a</"), out("a", false));
    assert_eq!(m.push("b"), out("</b", false));
    // A partial that restarts inside itself: "<</s" holds "</s" only.
    assert_eq!(m.push("<</s"), out("<", false));
    assert_eq!(m.push("!"), out("</s!", false));
    assert!(!m.stopped());
    assert_eq!(m.finish(), "");
}

#[test]
fn stop_at_the_very_start() {
    let mut m = StopMatcher::new(&stops(&["</s>"]));
    assert_eq!(m.push("</s>hello"), out("", true));
    assert_eq!(m.finish(), "");
    let mut m = StopMatcher::new(&stops(&["x"]));
    assert_eq!(m.push("x"), out("", true));
}

#[test]
fn multiple_stop_strings() {
    let mut m = StopMatcher::new(&stops(&["\n\n", "User:"]));
    assert_eq!(m.push("Hi"), out("Hi", false));
    assert_eq!(m.push(" there"), out(" there", false));
    // "\nUs" could start "User:" at "Us" (and "\n" cannot start "\n\n" followed by "U").
    assert_eq!(m.push("\nUs"), out("\n", false));
    assert_eq!(m.push("er: more"), out("", true));

    // Both complete in one piece: the one that starts first wins.
    let mut m = StopMatcher::new(&stops(&["b", "abc"]));
    assert_eq!(m.push("xabcd"), out("x", true));
    // Held back for the longer of two partial matches.
    let mut m = StopMatcher::new(&stops(&["cd", "bcde"]));
    assert_eq!(m.push("abc"), out("a", false));
    assert_eq!(m.push("x"), out("bcx", false));
}

#[test]
fn multibyte_pieces_are_never_split() {
    let mut m = StopMatcher::new(&stops(&["😀!"]));
    assert_eq!(m.push("hi 😀"), out("hi ", false));
    assert_eq!(m.push("?"), out("😀?", false));
    assert_eq!(m.push(" 😀"), out(" ", false));
    assert_eq!(m.push("!"), out("", true));

    // 😁 shares its first three bytes with 😀: not a partial match.
    let mut m = StopMatcher::new(&stops(&["😀😀"]));
    assert_eq!(m.push("a😁"), out("a😁", false));
    assert_eq!(m.push("x😀"), out("x", false));
    assert_eq!(m.push("😁"), out("😀😁", false));
    assert_eq!(m.push("é😀"), out("é", false));
    assert_eq!(m.push("😀"), out("", true));

    // A stop string that starts with a multibyte character inside a longer piece.
    let mut m = StopMatcher::new(&stops(&["éé"]));
    assert_eq!(m.push("caféé au lait"), out("caf", true));
}

#[test]
fn finish_releases_held_text() {
    let mut m = StopMatcher::new(&stops(&["END"]));
    assert_eq!(m.push("the EN"), out("the ", false));
    assert_eq!(m.finish(), "EN");
    assert!(!m.stopped());

    let mut none = StopMatcher::new(&[]);
    assert_eq!(none.push("anything </s>"), out("anything </s>", false));
    assert_eq!(none.finish(), "");
}

/// Streams `text` split at random char boundaries and compares with matching the whole text at
/// once. With stop strings none of which contains another, the first stop string to complete
/// is the one that ends first, wherever the pieces are split.
#[test]
fn stop_matcher_matches_a_whole_text_search() {
    const SEED: u64 = 0x6EED_0007;
    let mut rng = ChaCha20Rng::seed_from_u64(SEED);
    let alphabet = ['a', 'b', 'c', 'é', '😀', '\n'];
    let stop_sets = [
        stops(&["ab"]),
        stops(&["abc", "ca"]),
        stops(&["😀a", "é\n"]),
        stops(&["aab", "bb", "c😀é"]),
        stops(&["\n\n", "éé"]),
    ];
    for round in 0..3000 {
        let set = &stop_sets[round % stop_sets.len()];
        let len = rng.random_range(0..30);
        let text: String = (0..len)
            .map(|_| alphabet[rng.random_range(0..alphabet.len())])
            .collect();
        // Expected: text before the match that ends first.
        let first_end = set
            .iter()
            .filter_map(|s| text.find(s.as_str()).map(|at| (at + s.len(), at)))
            .min();
        let want = first_end.map_or(text.as_str(), |(_, at)| &text[..at]);

        let mut m = StopMatcher::new(set);
        let mut got = String::new();
        let chars: Vec<char> = text.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let n = rng.random_range(1..=4).min(chars.len() - i);
            let piece: String = chars[i..i + n].iter().collect();
            let o = m.push(&piece);
            got.push_str(&o.text);
            assert_eq!(o.stopped, m.stopped());
            i += n;
        }
        got.push_str(&m.finish());
        assert_eq!(
            got, want,
            "seed {SEED:#x} round {round}: text {text:?}, stops {set:?}"
        );
        assert_eq!(
            m.stopped(),
            first_end.is_some(),
            "seed {SEED:#x} round {round}"
        );
    }
}
