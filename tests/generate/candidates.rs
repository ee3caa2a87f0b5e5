//! The candidate path against the full logits row: the same sequences, served as expected.

use std::collections::BTreeMap;

use emberlm::sampling::SamplingParams;
use emberlm::session::Prompt;

use crate::support::{assert_same, run, session};

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
