//! Every logit processor and filter on hand-computed vectors, and the filters against a full
//! sort on a large vocabulary.

use std::collections::BTreeMap;

use emberlm::sampling::SamplingParams;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use super::support::{
    assert_close, distribution, logits_of, processed, seeded, survivors, NEG_INF,
};

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
