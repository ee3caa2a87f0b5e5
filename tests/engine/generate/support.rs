//! Sessions on the tiny fixtures, their goldens, greedy parameters, and comparisons of
//! sequences and streamed events.

use std::path::Path;

use emberlm::loader::ModelFiles;
use emberlm::sampling::SamplingParams;
use emberlm::session::{GenerateOptions, Generation, Prompt, Sequence, Session, TokenEvent};
use emberlm::GpuOptions;

use crate::common;
use crate::common::golden::Golden;

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

pub fn session(model: &str, context: Option<usize>) -> Option<Session> {
    let ctx = common::native_gpu(GpuOptions::default())?;
    let files = ModelFiles::open(Path::new(&fixture(model))).unwrap();
    Some(pollster::block_on(Session::new(ctx, &files, context)).unwrap())
}

pub fn golden(model: &str) -> Golden {
    let path = fixture(&format!("golden/{model}.golden.json"));
    Golden::parse(&std::fs::read_to_string(path).unwrap())
}

pub fn options(params: SamplingParams) -> GenerateOptions {
    GenerateOptions {
        sampling: params,
        ..GenerateOptions::default()
    }
}

pub fn greedy(max_new_tokens: usize) -> SamplingParams {
    SamplingParams {
        max_new_tokens,
        ..SamplingParams::greedy()
    }
}

pub fn run(
    s: &mut Session,
    prompt: &Prompt,
    params: SamplingParams,
) -> (Generation, Vec<TokenEvent>) {
    let mut events = Vec::new();
    let g =
        pollster::block_on(s.generate(prompt, &options(params), &mut |e| events.push(e.clone())))
            .unwrap();
    (g, events)
}

/// Same tokens, text and finish reason; log-probabilities equal up to the small difference
/// between a prefill and a decode step computing the same logits.
pub fn assert_same(a: &[Sequence], b: &[Sequence], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (x, y) in a.iter().zip(b) {
        assert_eq!(
            (&x.tokens, &x.text, x.finish_reason),
            (&y.tokens, &y.text, y.finish_reason),
            "{what}"
        );
        assert!(
            (x.logprob - y.logprob).abs() < 1e-3,
            "{what}: {} vs {}",
            x.logprob,
            y.logprob
        );
    }
}

/// Events of one sequence concatenated.
pub fn streamed(events: &[TokenEvent], sequence: usize) -> String {
    events
        .iter()
        .filter(|e| e.sequence == sequence)
        .map(|e| e.text.as_str())
        .collect()
}
