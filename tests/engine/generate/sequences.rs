//! Seeded sequences sharing one prefill, and beam search against greedy and teacher forcing.

use emberlm::sampling::SamplingParams;
use emberlm::session::Prompt;

use super::support::{assert_same, greedy, run, session, streamed};

#[test]
fn seeds_repeat_and_sequences_share_one_prefill() {
    let Some(mut s) = session("tiny-gpt2-f32.gguf", None) else {
        return;
    };
    let prompt = Prompt::Text("Licensed under the".into());
    let params = SamplingParams {
        temperature: 1.0,
        top_k: 40,
        seed: Some(1234),
        max_new_tokens: 12,
        num_return_sequences: 3,
        ..SamplingParams::unfiltered()
    };
    let (a, events) = run(&mut s, &prompt, params.clone());
    assert_eq!(a.seed, Some(1234));
    assert_eq!(a.sequences.len(), 3);
    for (i, seq) in a.sequences.iter().enumerate() {
        assert_eq!(streamed(&events, i), seq.text);
        assert!(!seq.tokens.is_empty());
    }
    let (b, _) = run(&mut s, &prompt, params.clone());
    assert_same(&a.sequences, &b.sequences, "same seed, same sequences");
    let distinct: std::collections::HashSet<_> =
        a.sequences.iter().map(|q| q.tokens.clone()).collect();
    assert!(distinct.len() > 1, "three samples are not all identical");
    let one = SamplingParams {
        num_return_sequences: 1,
        ..params.clone()
    };
    let (c, _) = run(&mut s, &prompt, one);
    assert_same(
        &c.sequences,
        &a.sequences[..1],
        "the first sample does not depend on n",
    );
    let other = SamplingParams {
        seed: Some(99),
        ..params
    };
    let (d, _) = run(&mut s, &prompt, other);
    assert_ne!(d.sequences, a.sequences);
}

#[test]
fn beam_search_scores_at_least_greedy() {
    for model in ["tiny-llama-q4_1.gguf", "tiny-gpt2-f16.gguf"] {
        let Some(mut s) = session(model, None) else {
            return;
        };
        for text in ["The software is provided", "Copyright holders"] {
            let prompt = Prompt::Text(text.into());
            let (g, _) = run(&mut s, &prompt, greedy(10));
            let mut beam = greedy(10);
            beam.num_beams = 4;
            beam.num_return_sequences = 2;
            beam.length_penalty = 0.0;
            let (b, events) = run(&mut s, &prompt, beam);
            assert_eq!(b.sequences.len(), 2);
            let (best, greedy_seq) = (&b.sequences[0], &g.sequences[0]);
            eprintln!(
                "{model} {text:?}: beam logprob {:.4} ({} tokens), greedy {:.4} ({} tokens)",
                best.logprob,
                best.tokens.len(),
                greedy_seq.logprob,
                greedy_seq.tokens.len()
            );
            assert!(
                best.logprob >= greedy_seq.logprob - 1e-4,
                "{model} {text:?}: beam {} < greedy {}",
                best.logprob,
                greedy_seq.logprob
            );
            assert!(b.sequences[0].logprob >= b.sequences[1].logprob - 1e-9);
            assert_eq!(streamed(&events, 0), best.text);
            // One beam is greedy.
            let mut one = greedy(10);
            one.num_beams = 1;
            let (o, _) = run(&mut s, &prompt, one);
            assert_eq!(o.sequences[0].tokens, greedy_seq.tokens);
            // The session still works normally afterwards.
            let (again, _) = run(&mut s, &prompt, greedy(10));
            assert_eq!(again.sequences[0].tokens, greedy_seq.tokens);
        }
    }
}

#[test]
fn beam_logprobs_are_the_sums_of_teacher_forced_log_softmax() {
    let Some(mut s) = session("tiny-llama-f32.gguf", None) else {
        return;
    };
    let prompt = Prompt::Text("Redistribution and use".into());
    let mut beam = greedy(6);
    beam.num_beams = 3;
    let (b, _) = run(&mut s, &prompt, beam);
    let best = &b.sequences[0];
    // Score the same continuation by teacher forcing, one token at a time.
    let mut sum = 0.0f64;
    let mut ids = b.prompt_tokens.clone();
    for &t in &best.tokens {
        let (g, _) = run(&mut s, &Prompt::Tokens(ids.clone()), {
            let mut p = greedy(1);
            p.logit_bias.insert(t, 100.0);
            p
        });
        assert_eq!(g.sequences[0].tokens, vec![t]);
        sum += g.sequences[0].logprob;
        ids.push(t);
    }
    assert!(
        (sum - best.logprob).abs() < 1e-3,
        "teacher-forced {sum} vs beam {}",
        best.logprob
    );
}
