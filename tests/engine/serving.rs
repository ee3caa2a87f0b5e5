//! `Session::serve`: requests arriving while others decode join the running batch; each
//! answer is what `Session::generate` gives the request alone (greedy and seeded sampling),
//! a cancelled request ends with `Abort`, a request's own error fails it alone, a request that
//! cannot be batched (beam search) runs alone, and the session generates normally afterwards.

#![cfg(not(target_arch = "wasm32"))]

use std::collections::{HashMap, VecDeque};

use emberlm::loader::ModelFiles;
use emberlm::sampling::SamplingParams;
use emberlm::session::{
    BatchItem, FinishReason, GenerateOptions, Generation, ItemFeed, Prompt, Session, TokenEvent,
};

/// Requests given out once the batch has taken `at` steps (or when the engine is idle), some
/// cancelled after a number of their events.
#[derive(Default)]
struct ScriptedFeed {
    arrivals: VecDeque<(usize, u64, BatchItem)>,
    cancel_after: HashMap<u64, usize>,
    events: HashMap<u64, usize>,
    results: HashMap<u64, emberlm::Result<Generation>>,
    finished_order: Vec<u64>,
    steps: usize,
    peak: usize,
}

impl ItemFeed for ScriptedFeed {
    fn next(&mut self, wait: bool) -> Option<(u64, BatchItem)> {
        let due = self
            .arrivals
            .front()
            .is_some_and(|(at, _, _)| *at <= self.steps || wait);
        if !due {
            return None;
        }
        self.arrivals.pop_front().map(|(_, t, item)| (t, item))
    }

    fn cancelled(&mut self, ticket: u64) -> bool {
        let seen = self.events.get(&ticket).copied().unwrap_or(0);
        self.cancel_after.get(&ticket).is_some_and(|&n| seen >= n)
    }

    fn event(&mut self, ticket: u64, event: &TokenEvent) {
        assert_eq!(event.prompt, 0, "a request sees its own events as prompt 0");
        assert!(
            !self.results.contains_key(&ticket),
            "an event after the answer"
        );
        *self.events.entry(ticket).or_default() += 1;
    }

    fn finished(&mut self, ticket: u64, result: emberlm::Result<Generation>) {
        assert!(
            self.results.insert(ticket, result).is_none(),
            "answered twice"
        );
        self.finished_order.push(ticket);
    }

    fn step(&mut self, sequences: usize) {
        self.steps += 1;
        self.peak = self.peak.max(sequences);
    }
}

fn item(prompt: &str, sampling: SamplingParams) -> BatchItem {
    BatchItem {
        prompt: Prompt::Text(prompt.into()),
        options: GenerateOptions {
            sampling,
            ..GenerateOptions::default()
        },
    }
}

fn greedy(max_new_tokens: usize) -> SamplingParams {
    SamplingParams {
        max_new_tokens,
        ..SamplingParams::greedy()
    }
}

#[test]
fn requests_join_the_running_batch_and_get_their_answers_alone() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tiny-llama-q8_0.gguf");
    let files = ModelFiles::open(&path).unwrap();
    let mut s = Session::new_cpu(&files, None).unwrap();
    let sampled = SamplingParams {
        temperature: 0.9,
        top_k: 40,
        seed: Some(11),
        num_return_sequences: 2,
        max_new_tokens: 20,
        ..SamplingParams::unfiltered()
    };
    let beam = SamplingParams {
        num_beams: 2,
        max_new_tokens: 8,
        ..SamplingParams::greedy()
    };
    let bad = SamplingParams {
        top_p: 1.5,
        ..greedy(5)
    };
    // (arrives after this many steps, ticket, request)
    let script = vec![
        (0, 1, item("The license", greedy(24))),
        (0, 2, item("Permission is hereby granted", greedy(9))),
        (2, 3, item("Copyright", sampled.clone())),
        (3, 4, item("THE SOFTWARE", greedy(30))),
        (3, 5, item("bad", bad)),
        (5, 6, item("Redistribution and use", greedy(40))),
        (6, 7, item("in source and binary forms", beam)),
        (7, 8, item("with or without", greedy(12))),
        (7, 9, item("modification", greedy(0))),
    ];
    let mut feed = ScriptedFeed {
        arrivals: script.iter().cloned().collect(),
        cancel_after: HashMap::from([(6, 4)]),
        ..ScriptedFeed::default()
    };
    pollster::block_on(s.serve(&mut feed, 3)).unwrap();

    assert!(
        (2..=3).contains(&feed.peak),
        "peak {} sequences in a step",
        feed.peak
    );
    assert_eq!(
        feed.results.len(),
        script.len(),
        "every request is answered"
    );
    // the short request that arrived with a long one is answered before it
    let position = |t: u64| feed.finished_order.iter().position(|&x| x == t).unwrap();
    assert!(position(2) < position(1), "{:?}", feed.finished_order);
    for (_, ticket, request) in &script {
        let got = &feed.results[ticket];
        match ticket {
            5 => {
                let e = got.as_ref().expect_err("top_p 1.5 is refused");
                assert!(e.to_string().contains("top_p"), "{e}");
            }
            6 => {
                let g = got.as_ref().unwrap();
                let seq = &g.sequences[0];
                assert_eq!(seq.finish_reason, FinishReason::Abort, "{seq:?}");
                assert!(seq.tokens.len() < 40, "{seq:?}");
            }
            _ => {
                let g = got.as_ref().unwrap();
                let alone =
                    pollster::block_on(s.generate(&request.prompt, &request.options, &mut |_| {}))
                        .unwrap();
                s.reset();
                let tokens = |g: &Generation| -> Vec<(Vec<u32>, FinishReason)> {
                    g.sequences
                        .iter()
                        .map(|q| (q.tokens.clone(), q.finish_reason))
                        .collect()
                };
                assert_eq!(tokens(g), tokens(&alone), "request {ticket}");
                assert_eq!(
                    g.sequences.len(),
                    request.options.sampling.num_return_sequences
                );
                assert_eq!(g.prompt_tokens, alone.prompt_tokens, "request {ticket}");
            }
        }
    }
    // events came for the answered requests; none for the refused one
    assert!(feed.events.get(&1).copied().unwrap_or(0) >= 24);
    assert_eq!(feed.events.get(&5), None);
}
