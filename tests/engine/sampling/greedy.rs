//! Greedy selection: every greedy setting picks the argmax, ties go to the lowest id, and bias
//! and penalties still apply.

use std::collections::BTreeMap;

use emberlm::sampling::{Sampler, SamplingParams};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use super::support::{argmax, draw, processed, sampler, seeded, NEG_INF};

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
