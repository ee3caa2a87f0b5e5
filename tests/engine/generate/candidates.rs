//! The candidate path against the full logits row: the same sequences, served as expected.

use std::collections::BTreeMap;

use emberlm::sampling::SamplingParams;
use emberlm::session::Prompt;

use super::support::{assert_same, run, session};

/// Parameter sets for comparing the candidate path with the full row, with what the
/// candidates are expected to serve: every step, none, or some with fallbacks allowed.
fn select_cases(eos: &[u32]) -> Vec<(&'static str, SamplingParams, &'static str)> {
    let mut never_stop = BTreeMap::new();
    for &id in eos {
        never_stop.insert(id, -100.0);
    }
    let base = SamplingParams {
        max_new_tokens: 20,
        seed: Some(1234),
        logit_bias: never_stop.clone(),
        ..SamplingParams::unfiltered()
    };
    let default_sampling = SamplingParams {
        temperature: 0.7,
        top_k: 40,
        top_p: 0.9,
        ..base.clone()
    };
    let mut bias = never_stop;
    bias.insert(511, 3.0);
    bias.insert(7, 1.5);
    vec![
        (
            "greedy",
            SamplingParams {
                temperature: 0.0,
                ..base.clone()
            },
            "all",
        ),
        ("default sampling", default_sampling.clone(), "all"),
        (
            "penalties and bias",
            SamplingParams {
                repetition_penalty: 1.3,
                presence_penalty: 0.4,
                frequency_penalty: 0.2,
                logit_bias: bias,
                ..default_sampling
            },
            "all",
        ),
        (
            "top_p only",
            SamplingParams {
                top_p: 0.9,
                ..base.clone()
            },
            "some",
        ),
        // Flattened: the nucleus spreads past the 256 candidates, so steps fall back.
        (
            "top_p hot",
            SamplingParams {
                temperature: 4.0,
                top_p: 0.995,
                ..base.clone()
            },
            "fallback",
        ),
        ("min_p only", SamplingParams { min_p: 0.1, ..base }, "none"),
    ]
}

#[test]
fn candidates_and_full_rows_give_the_same_sequences() {
    for model in ["tiny-llama-q4_1.gguf", "tiny-gpt2-f32.gguf"] {
        let Some(mut s) = session(model, None) else {
            return;
        };
        let prompt = Prompt::Text("Permission is hereby granted, free of charge".into());
        let mut fallbacks = 0;
        for (name, params, served) in select_cases(s.eos_ids()) {
            let what = format!("{model} {name}");
            s.set_full_row_readback(true);
            let (full, _) = run(&mut s, &prompt, params.clone());
            s.set_full_row_readback(false);
            let (cand, _) = run(&mut s, &prompt, params.clone());
            assert_eq!(full.sequences[0].tokens.len(), 20, "{what}");
            assert_same(&full.sequences, &cand.sequences, &what);
            let (f, c) = (&full.stats, &cand.stats);
            eprintln!(
                "{what}: candidates {} full rows {} fallbacks {}",
                c.candidate_steps, c.full_row_steps, c.select_fallbacks
            );
            assert_eq!(f.candidate_steps, 0, "{what}: forced full rows");
            assert_eq!(f.full_row_steps, 20, "{what}");
            assert_eq!(c.candidate_steps + c.full_row_steps, 20, "{what}");
            match served {
                // The first token comes from the prompt's row.
                "all" => assert_eq!(c.candidate_steps, 19, "{what}"),
                "none" => assert_eq!((c.candidate_steps, c.select_fallbacks), (0, 0), "{what}"),
                "fallback" => fallbacks += c.select_fallbacks,
                _ => {}
            }
        }
        assert!(fallbacks > 0, "{model}: top_p never fell back to the row");
    }
}

/// `top_logprobs`: the alternatives served from the candidates equal the whole row's (ids in
/// order, log-probabilities to rounding); greedy's token leads them; a logit bias, which
/// reorders the candidates, makes every step read the row; batched lanes report them too.
#[test]
fn top_logprobs_from_candidates_equal_the_whole_rows() {
    for model in ["tiny-llama-q4_1.gguf", "tiny-gpt2-f32.gguf"] {
        let Some(mut s) = session(model, None) else {
            return;
        };
        let prompt = Prompt::Text("Permission is hereby granted".into());
        let go = |s: &mut emberlm::session::Session, params: SamplingParams, full: bool| {
            let mut events = Vec::new();
            let options = emberlm::session::GenerateOptions {
                top_logprobs: 5,
                ..super::support::options(params)
            };
            s.set_full_row_readback(full);
            let g = pollster::block_on(s.generate(&prompt, &options, &mut |e| {
                if e.id.is_some() {
                    events.push(e.clone());
                }
            }))
            .unwrap();
            (g, events)
        };
        let greedy = SamplingParams {
            max_new_tokens: 12,
            ignore_eos: true,
            ..SamplingParams::greedy()
        };
        let (full, full_events) = go(&mut s, greedy.clone(), true);
        let (cand, cand_events) = go(&mut s, greedy.clone(), false);
        assert_same(&full.sequences, &cand.sequences, model);
        assert_eq!(cand.stats.candidate_steps, 11, "{model}: {:?}", cand.stats);
        assert_eq!(full_events.len(), 12);
        for (f, c) in full_events.iter().zip(&cand_events) {
            let (ft, ct) = (
                f.top_logprobs.as_ref().unwrap(),
                c.top_logprobs.as_ref().unwrap(),
            );
            assert_eq!(ft.len(), 5, "{model}");
            assert_eq!(
                ft[0].id,
                f.id.unwrap(),
                "{model}: greedy leads the alternatives"
            );
            assert_eq!(ft[0].logprob, f.logprob.unwrap(), "{model}");
            assert!(
                ft.windows(2).all(|w| w[0].logprob >= w[1].logprob),
                "{ft:?}"
            );
            let ids =
                |t: &[emberlm::sampling::TopLogprob]| t.iter().map(|x| x.id).collect::<Vec<_>>();
            assert_eq!(ids(ft), ids(ct), "{model}");
            for (a, b) in ft.iter().zip(ct) {
                assert!(
                    (a.logprob - b.logprob).abs() < 1e-3,
                    "{model}: {a:?} vs {b:?}"
                );
            }
        }
        // a bias reorders the adjusted candidates: the alternatives come from the row
        let mut biased = greedy.clone();
        biased.logit_bias.insert(7, 2.0);
        let (g, events) = go(&mut s, biased, false);
        assert_eq!(g.stats.candidate_steps, 0, "{model}: {:?}", g.stats);
        assert!(events
            .iter()
            .all(|e| e.top_logprobs.as_ref().is_some_and(|t| t.len() == 5)));
        // batched lanes report them as a single sequence does
        let items: Vec<emberlm::session::BatchItem> = (0..2)
            .map(|_| emberlm::session::BatchItem {
                prompt: prompt.clone(),
                options: emberlm::session::GenerateOptions {
                    top_logprobs: 5,
                    ..super::support::options(greedy.clone())
                },
            })
            .collect();
        let mut batched = Vec::new();
        pollster::block_on(s.generate_items(&items, Some(2), &mut |e| {
            if e.prompt == 1 && e.id.is_some() {
                batched.push(e.top_logprobs.clone().unwrap());
            }
        }))
        .unwrap();
        assert_eq!(batched.len(), 12, "{model}");
        for (b, c) in batched.iter().zip(&cand_events) {
            let ct = c.top_logprobs.as_ref().unwrap();
            assert_eq!(
                b.iter().map(|x| x.id).collect::<Vec<_>>(),
                ct.iter().map(|x| x.id).collect::<Vec<_>>(),
                "{model}"
            );
        }
    }
}
