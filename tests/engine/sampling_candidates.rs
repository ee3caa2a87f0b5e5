//! The sampler's candidate path against the full row, without a GPU: candidates come from the
//! CPU reference of the selection kernel. Whenever `sample_candidates` answers, it must give
//! the token `sample` gives on the full row, and seeded runs must stay identical step after
//! step (the same use of the random generator); when it declines, the full row is used.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use std::collections::BTreeMap;

use common::select_ref;
use emberlm::sampling::{Sampler, SamplingParams, TokenMask};
use rand::Rng;

const VOCAB: usize = 2000;

fn params(name: &str) -> SamplingParams {
    let base = SamplingParams {
        seed: Some(11),
        ..SamplingParams::unfiltered()
    };
    let default_sampling = SamplingParams {
        temperature: 0.7,
        top_k: 40,
        top_p: 0.9,
        ..base.clone()
    };
    match name {
        "greedy" => SamplingParams {
            temperature: 0.0,
            ..base
        },
        "greedy penalties" => SamplingParams {
            temperature: 0.0,
            repetition_penalty: 1.3,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            logit_bias: BTreeMap::from([(0, 8.0), (VOCAB as u32 - 1, 12.0), (5, -100.0)]),
            ..base
        },
        "default" => default_sampling,
        "penalties and bias" => SamplingParams {
            repetition_penalty: 1.3,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            penalty_last_n: 24,
            logit_bias: BTreeMap::from([(0, 8.0), (VOCAB as u32 - 1, 12.0), (5, -100.0)]),
            ..default_sampling
        },
        "top_k typical min_p" => SamplingParams {
            temperature: 1.3,
            top_k: 200,
            typical_p: 0.8,
            min_p: 0.05,
            ..base
        },
        "top_p only" => SamplingParams { top_p: 0.9, ..base },
        "top_p cold" => SamplingParams {
            temperature: 0.6,
            top_p: 0.5,
            min_p: 0.02,
            ..base
        },
        "min_p only" => SamplingParams { min_p: 0.1, ..base },
        "top_k too large" => SamplingParams { top_k: 300, ..base },
        _ => unreachable!("{name}"),
    }
}

/// Generates `steps` tokens twice from the same random rows: once from the full row, once
/// from the candidates (falling back to the row when they decline). Returns how many steps the
/// candidates served.
fn compare(name: &str, rng: &mut impl Rng, steps: usize) -> usize {
    compare_masked(name, rng, steps, None)
}

/// [`compare`] with a fresh random mask at every step allowing each token with probability
/// `density` (at least one token), set on both samplers.
fn compare_masked(name: &str, rng: &mut impl Rng, steps: usize, density: Option<f64>) -> usize {
    let p = params(name);
    let mut full = Sampler::new(&p, VOCAB).unwrap();
    let mut cand = Sampler::new(&p, VOCAB).unwrap();
    let prompt: Vec<u32> = (0..30).map(|_| rng.random_range(0..VOCAB as u32)).collect();
    let mut generated = Vec::new();
    let mut served = 0;
    for step in 0..steps {
        let row = select_ref::random_row(rng, VOCAB);
        if let Some(density) = density {
            let mut mask = TokenMask::none(VOCAB);
            for id in 0..VOCAB as u32 {
                mask.set(id, rng.random_bool(density));
            }
            mask.set(rng.random_range(0..VOCAB as u32), true);
            full.set_mask(Some(mask.clone())).unwrap();
            cand.set_mask(Some(mask)).unwrap();
        }
        let want = full.sample(&row, &prompt, &generated).unwrap();
        if let Some(mask) = full.mask() {
            assert!(
                mask.allows(want.id),
                "{name}: step {step}: a forbidden token"
            );
        }
        let got = match cand.select_request(&prompt, &generated).unwrap() {
            Some(request) => {
                let c = select_ref::select(&row, &request);
                // the distribution speculative decoding verifies against: the full row's,
                // bit for bit, whenever the candidates decide it (and they decide it exactly
                // when they decide the sample)
                let p = cand
                    .distribution_candidates(&c, &request, &prompt, &generated)
                    .unwrap();
                if let Some(p) = &p {
                    let want = full.distribution(&row, &prompt, &generated).unwrap();
                    let same = p.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{name}: step {step}: the distributions differ");
                }
                let sampled = cand
                    .sample_candidates(&c, &request, &prompt, &generated)
                    .unwrap();
                assert_eq!(p.is_some(), sampled.is_some(), "{name}: step {step}");
                match sampled {
                    Some(s) => {
                        served += 1;
                        s
                    }
                    None => cand.sample(&row, &prompt, &generated).unwrap(),
                }
            }
            None => cand.sample(&row, &prompt, &generated).unwrap(),
        };
        assert_eq!(got.id, want.id, "{name}: step {step}");
        assert!(
            (got.logprob - want.logprob).abs() < 1e-4,
            "{name}: step {step}: logprob {} vs {}",
            got.logprob,
            want.logprob
        );
        generated.push(want.id);
    }
    served
}

#[test]
fn candidates_give_the_full_rows_tokens() {
    let mut rng = common::rng("candidates_give_the_full_rows_tokens", &|m| {
        eprintln!("{m}")
    });
    let steps = 150;
    for (name, must_serve) in [
        ("greedy", true),
        ("greedy penalties", true),
        ("default", true),
        ("penalties and bias", true),
        ("top_k typical min_p", true),
        ("top_p only", false),
        ("top_p cold", false),
        ("min_p only", false),
        ("top_k too large", false),
    ] {
        let served = compare(name, &mut rng, steps);
        eprintln!("{name}: {served}/{steps} steps from the candidates");
        if must_serve {
            assert!(served * 10 >= steps * 9, "{name}: only {served}/{steps}");
        }
        if name == "min_p only" || name == "top_k too large" {
            assert_eq!(served, 0, "{name}: the candidates cannot serve it");
        }
        if name.starts_with("top_p") {
            assert!(served > 0, "{name}: the nucleus never fit the candidates");
        }
    }
}

/// With a constraint's mask (sent with the request, so the selection ranks and sums the
/// allowed tokens only) the candidates still give exactly the full row's token, and serve what
/// they serve without a mask: greedy, top-k (all allowed tokens when fewer than k are) and the
/// nucleus; min-p alone never.
#[test]
fn masked_candidates_give_the_masked_full_rows_tokens() {
    let mut rng = common::rng("masked_candidates_give_the_masked_full_rows_tokens", &|m| {
        eprintln!("{m}")
    });
    let steps = 100;
    for density in [0.5, 0.05, 0.002] {
        for (name, must_serve) in [
            ("greedy", true),
            ("greedy penalties", true),
            ("default", true),
            ("penalties and bias", true),
            ("top_k typical min_p", true),
            ("top_p only", false),
            ("min_p only", false),
        ] {
            let served = compare_masked(name, &mut rng, steps, Some(density));
            eprintln!("{name}, density {density}: {served}/{steps} from the candidates");
            if must_serve {
                assert!(served * 10 >= steps * 9, "{name}: only {served}/{steps}");
            }
            if name == "top_p only" {
                assert!(
                    served > 0,
                    "{name}: the masked nucleus never fit the candidates"
                );
            }
            if name == "min_p only" {
                assert_eq!(served, 0, "{name}: the candidates cannot serve it");
            }
        }
    }
}

#[test]
fn a_small_vocabulary_is_served_whole() {
    let p = SamplingParams {
        min_p: 0.2,
        typical_p: 0.7,
        seed: Some(3),
        ..SamplingParams::unfiltered()
    };
    let mut rng = common::rng("a_small_vocabulary_is_served_whole", &|m| eprintln!("{m}"));
    let mut full = Sampler::new(&p, 200).unwrap();
    let mut cand = Sampler::new(&p, 200).unwrap();
    for _ in 0..50 {
        let row = select_ref::random_row(&mut rng, 200);
        let request = cand.select_request(&[1, 2], &[]).unwrap().unwrap();
        assert_eq!(request.k, 200);
        let c = select_ref::select(&row, &request);
        let got = cand.sample_candidates(&c, &request, &[1, 2], &[]).unwrap();
        assert_eq!(got, Some(full.sample(&row, &[1, 2], &[]).unwrap()));
    }
}

#[test]
fn non_finite_rows_decline_and_the_full_path_reports_them() {
    let p = SamplingParams {
        temperature: 0.0,
        ..SamplingParams::unfiltered()
    };
    let mut s = Sampler::new(&p, 1000).unwrap();
    let mut row = vec![0.5f32; 1000];
    row[10] = f32::NAN;
    let request = s.select_request(&[], &[]).unwrap().unwrap();
    let c = select_ref::select(&row, &request);
    assert!(c.non_finite);
    assert_eq!(s.sample_candidates(&c, &request, &[], &[]).unwrap(), None);
    let err = s.sample(&row, &[], &[]).unwrap_err();
    assert!(err.to_string().contains("index 10"), "{err}");
}

#[test]
fn too_many_adjustments_read_the_row() {
    let mut p = SamplingParams {
        temperature: 0.0,
        repetition_penalty: 1.1,
        ..SamplingParams::unfiltered()
    };
    let s = Sampler::new(&p, 1000).unwrap();
    let history: Vec<u32> = (0..300).collect();
    assert!(s.select_request(&history, &[]).unwrap().is_none());
    p.repetition_penalty = 1.0;
    let s = Sampler::new(&p, 1000).unwrap();
    assert!(s.select_request(&history, &[]).unwrap().is_some());
    assert!(s.select_request(&[1000], &[]).is_err(), "ids are checked");
}
