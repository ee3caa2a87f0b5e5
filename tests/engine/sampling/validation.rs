//! Bad inputs: non-finite logits, wrong lengths, out-of-range history and every invalid
//! parameter, each refused by name; boundary values accepted.

use std::collections::BTreeMap;

use emberlm::sampling::{log_softmax, Sampler, SamplingParams};
use emberlm::Error;

use super::support::{sampler, seeded};

pub fn invalid_name(e: &Error) -> Option<&'static str> {
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
    assert!(SamplingParams::unfiltered().validate().is_ok());
    assert!(SamplingParams::greedy().validate().is_ok());
}
