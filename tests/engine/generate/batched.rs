//! Batched generation: prompts of mixed lengths decoded together give every sequence the
//! tokens it gets alone (greedy, and seeded sampling with each sequence's own stream), at
//! batch sizes 1, 3, 8 and 17, with sequences ending at different steps and slots reused by
//! waiting prompts; per-prompt options, stop strings, echo and several samples per prompt.

use emberlm::sampling::SamplingParams;
use emberlm::session::{BatchItem, Generation, Prompt, Session, TokenEvent};

use super::support::{assert_same, options, run, session};

const TEXTS: [&str; 6] = [
    "A",
    "The license terms and conditions",
    "Copyright (c) 2024, all rights reserved. Redistribution and use in source",
    "Hello",
    "Permission is hereby granted, free of charge",
    "x y z",
];

/// `n` prompts of mixed lengths, each with its own token limit (so they end at different
/// steps) and `params` otherwise.
fn items(n: usize, params: &SamplingParams) -> Vec<BatchItem> {
    (0..n)
        .map(|i| {
            let mut sampling = params.clone();
            sampling.max_new_tokens = 2 + (i * 5) % 11;
            if sampling.seed.is_some() {
                sampling.seed = Some(1000 + i as u64);
            }
            BatchItem {
                prompt: Prompt::Text(format!("{} {i}", TEXTS[i % TEXTS.len()])),
                options: options(sampling),
            }
        })
        .collect()
}

fn batch(
    s: &mut Session,
    items: &[BatchItem],
    max_batch: Option<usize>,
) -> (Vec<Generation>, Vec<TokenEvent>) {
    let mut events = Vec::new();
    let out =
        pollster::block_on(s.generate_items(items, max_batch, &mut |e| events.push(e.clone())))
            .unwrap();
    (out, events)
}

/// Each item alone, from an empty cache.
fn alone(s: &mut Session, items: &[BatchItem]) -> Vec<Generation> {
    items
        .iter()
        .map(|it| {
            s.reset();
            pollster::block_on(s.generate(&it.prompt, &it.options, &mut |_| {})).unwrap()
        })
        .collect()
}

fn assert_all_same(got: &[Generation], want: &[Generation], events: &[TokenEvent], what: &str) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.prompt_tokens, w.prompt_tokens, "{what}: prompt {i}");
        assert_same(&g.sequences, &w.sequences, &format!("{what}: prompt {i}"));
        for (k, seq) in g.sequences.iter().enumerate() {
            let text: String = events
                .iter()
                .filter(|e| e.prompt == i && e.sequence == k)
                .map(|e| e.text.as_str())
                .collect();
            assert_eq!(
                text, seq.text,
                "{what}: prompt {i}, sequence {k} as streamed"
            );
        }
    }
}

#[test]
fn greedy_batches_give_every_prompt_its_tokens_alone() {
    let Some(mut s) = session("tiny-llama-q4_1.gguf", None) else {
        return;
    };
    let params = SamplingParams::greedy();
    let all = items(17, &params);
    let want = alone(&mut s, &all);
    for (n, max_batch) in [(1, None), (3, None), (8, None), (17, None), (17, Some(5))] {
        let (got, events) = batch(&mut s, &all[..n], max_batch);
        assert_all_same(
            &got,
            &want[..n],
            &events,
            &format!("B = {n}, max {max_batch:?}"),
        );
        let lengths: Vec<usize> = got.iter().map(|g| g.sequences[0].tokens.len()).collect();
        if n >= 8 {
            assert!(lengths.iter().min() < lengths.iter().max(), "{lengths:?}");
        }
    }
    // the session is usable alone afterwards
    s.reset();
    let (g, _) = run(&mut s, &all[2].prompt, all[2].options.sampling.clone());
    assert_same(&g.sequences, &want[2].sequences, "alone after a batch");
}

#[test]
fn seeded_sampling_in_a_batch_draws_what_each_prompt_draws_alone() {
    let Some(mut s) = session("tiny-gpt2-f16.gguf", None) else {
        return;
    };
    let params = SamplingParams {
        temperature: 0.9,
        top_k: 40,
        top_p: 0.95,
        repetition_penalty: 1.1,
        seed: Some(1),
        ..SamplingParams::unfiltered()
    };
    let mut all = items(7, &params);
    all[1].options.sampling.num_return_sequences = 3;
    all[4].options.sampling.num_return_sequences = 2;
    all[3].options.sampling.stop = vec!["e".to_string()];
    all[5].options.echo = true;
    let want = alone(&mut s, &all);
    for max_batch in [None, Some(4)] {
        let (got, events) = batch(&mut s, &all, max_batch);
        assert_all_same(
            &got,
            &want,
            &events,
            &format!("sampling, max {max_batch:?}"),
        );
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.seed, w.seed);
        }
    }
    // the samples of one prompt differ from each other
    let seqs = &want[1].sequences;
    assert!(seqs.iter().any(|x| x.tokens != seqs[0].tokens), "{seqs:?}");
}

#[test]
fn a_batch_refuses_zero_sequences_per_step() {
    let Some(mut s) = session("tiny-llama-q4_1.gguf", None) else {
        return;
    };
    let all = items(2, &SamplingParams::greedy());
    let err = pollster::block_on(s.generate_items(&all, Some(0), &mut |_| {})).unwrap_err();
    assert!(err.to_string().contains("max_batch"), "{err}");
}
