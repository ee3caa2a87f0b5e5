//! Speculative decoding under a response format (CPU backend): greedy output token for token
//! that of plain constrained decoding, with a draft model and with prompt lookup, and the
//! sampled joint distribution of the first two tokens equal to the constrained model's own
//! (chi-square, p > 0.001).

use std::collections::BTreeMap;
use std::sync::Arc;

use emberlm::backend::cpu::CpuForward;
use emberlm::backend::Backend;
use emberlm::constrain::{Constraint, Grammars, ResponseFormat};
use emberlm::loader::ModelFiles;
use emberlm::sampling::{Sampler, SamplingParams};
use emberlm::session::{
    FinishReason, GenerateOptions, Generation, Prompt, Session, SpecOptions, SpecSource,
};

use super::distribution::{critical_value, pooled_chi_square};
use super::schemas::schemas;
use super::support::{assert_valid, cpu_session, fixture, greedy, schema_format};
use crate::common::spec;

const TARGET: &str = "tiny-llama-f32.gguf";

/// The target on the CPU with `draft` loaded beside it.
fn with_draft(draft: &str) -> Session {
    let mut s = cpu_session(&fixture(TARGET));
    let files = ModelFiles::open(&fixture(draft)).unwrap();
    pollster::block_on(s.load_draft(&files)).unwrap();
    s
}

fn run(
    s: &mut Session,
    prompt: &Prompt,
    format: &ResponseFormat,
    sampling: SamplingParams,
    speculative: Option<SpecOptions>,
) -> Generation {
    let options = GenerateOptions {
        sampling,
        response_format: format.clone(),
        speculative,
        ..GenerateOptions::default()
    };
    pollster::block_on(s.generate(prompt, &options, &mut |_| {}))
        .unwrap_or_else(|e| panic!("{format:?}: {e}"))
}

#[test]
fn greedy_speculation_under_a_format_matches_plain_constrained_decoding() {
    let mut s = with_draft("tiny-llama-q8_0.gguf");
    let (name, schema) = schemas().remove(1);
    let formats = [
        ResponseFormat::Regex("(ab|cd|the )+[0-9]{2,6}".into()),
        ResponseFormat::JsonObject,
        schema_format(&schema),
    ];
    // a prompt that repeats itself, so lookup finds drafts too
    let prompt =
        Prompt::Text(r#"{"a": 1, "b": 2} {"a": 1, "b": 2} the cat the cat ab ab 1234"#.into());
    let settings = [
        spec(SpecSource::Draft, 1, false),
        spec(SpecSource::Draft, 3, false),
        spec(SpecSource::Draft, 4, true),
        spec(SpecSource::Lookup, 4, false),
        SpecOptions {
            extra_token: false,
            ..spec(SpecSource::Draft, 2, false)
        },
    ];
    let (mut drafted, mut accepted, mut rejected_somewhere) = (0, 0, false);
    let mut lookup_drafted = 0;
    for format in &formats {
        let plain = run(&mut s, &prompt, format, greedy(40), None);
        for o in &settings {
            let g = run(&mut s, &prompt, format, greedy(40), Some(o.clone()));
            assert_eq!(
                g.sequences[0].tokens, plain.sequences[0].tokens,
                "{format:?} with {o:?}: {:?} vs {:?}",
                g.sequences[0].text, plain.sequences[0].text
            );
            assert_eq!(
                g.sequences[0].finish_reason,
                plain.sequences[0].finish_reason
            );
            assert_eq!(g.warnings, plain.warnings, "{format:?} with {o:?}");
            let st = g.stats.speculative.clone().expect("speculative stats");
            drafted += st.drafted;
            accepted += st.accepted;
            rejected_somewhere |= st.accepted < st.drafted;
            if o.source == Some(SpecSource::Lookup) {
                lookup_drafted += st.drafted;
            }
            assert!(g.stats.constrained_steps > 0);
        }
        if let ResponseFormat::JsonSchema { .. } = format {
            if plain.sequences[0].finish_reason == FinishReason::Stop {
                assert_valid(&schema, &plain.sequences[0].text, &name);
            }
        }
    }
    assert!(
        accepted > 0 && rejected_somewhere,
        "{accepted} of {drafted} accepted"
    );
    assert!(lookup_drafted > 0, "prompt lookup drafted nothing");
}

/// A format's grammar and the rows the f32 target gives, for the exact distribution.
struct Exact {
    constraint: Constraint,
    eos: u32,
    forward: Box<dyn Backend>,
    vocab: usize,
}

impl Exact {
    fn new(format: &ResponseFormat) -> Self {
        let files = ModelFiles::open(&fixture(TARGET)).unwrap();
        let tokenizer = Arc::new(files.tokenizer().unwrap());
        let weights = files.weights().unwrap();
        let vocab = weights.config.vocab_size.min(tokenizer.vocab_size());
        let eos = tokenizer.eos_ids().first().copied().unwrap_or(0);
        let grammars = Grammars::new(&tokenizer, vocab, eos).unwrap();
        Self {
            constraint: grammars.compile(format).unwrap().unwrap(),
            eos,
            forward: CpuForward::backend(&weights, 64).unwrap(),
            vocab,
        }
    }

    /// The model's last row after `ids`, run from an empty cache.
    fn row(&mut self, ids: &[u32]) -> Vec<f32> {
        self.forward.truncate(0).unwrap();
        let logits = pollster::block_on(self.forward.forward(ids, false)).unwrap();
        logits[..self.vocab].to_vec()
    }

    /// The distribution after `prompt ++ generated` under the grammar and `params`'
    /// processors, as plain decoding draws from it.
    fn distribution(
        &mut self,
        params: &SamplingParams,
        prompt: &[u32],
        generated: &[u32],
    ) -> Vec<f64> {
        let mut grammar = self.constraint.start();
        for &t in generated {
            grammar.accept(t).unwrap();
        }
        let mut sampler = Sampler::new(params, self.vocab).unwrap();
        sampler
            .set_mask(Some(grammar.mask(&[self.eos]).unwrap()))
            .unwrap();
        let mut ids = prompt.to_vec();
        ids.extend_from_slice(generated);
        let row = self.row(&ids);
        sampler.distribution(&row, prompt, generated).unwrap()
    }

    /// Whether the grammar can only end after `generated`.
    fn must_end(&self, generated: &[u32]) -> bool {
        let mut grammar = self.constraint.start();
        for &t in generated {
            grammar.accept(t).unwrap();
        }
        grammar.must_end()
    }
}

/// The first two tokens under a grammar with a deliberately bad draft (the Q4_0 twin) at
/// temperature 1.5 and top-k 3: their joint distribution (`None` where the text ended) must
/// be p(t1) · p(t2 | t1), each restricted by the grammar where it stands, as plain
/// constrained decoding draws them.
#[test]
fn sampled_speculation_under_a_format_keeps_the_constrained_distribution() {
    let format = ResponseFormat::Regex("[a-z]{1,6}( [a-z]{1,6})?".into());
    let base = SamplingParams {
        temperature: 1.5,
        top_k: 3,
        max_new_tokens: 3,
        ..SamplingParams::unfiltered()
    };
    let prompt_ids = vec![1u32, 17, 300, 4];
    let mut exact_model = Exact::new(&format);
    let eos = exact_model.eos;
    let p1 = exact_model.distribution(&base, &prompt_ids, &[]);
    let mut exact: BTreeMap<(u32, Option<u32>), f64> = BTreeMap::new();
    for (t1, &a) in p1.iter().enumerate().filter(|(_, &a)| a > 0.0) {
        let t1 = t1 as u32;
        if t1 == eos || exact_model.must_end(&[t1]) {
            *exact.entry((t1, None)).or_default() += a;
            continue;
        }
        let p2 = exact_model.distribution(&base, &prompt_ids, &[t1]);
        for (t2, &b) in p2.iter().enumerate().filter(|(_, &b)| b > 0.0) {
            let t2 = (t2 as u32 != eos).then_some(t2 as u32);
            *exact.entry((t1, t2)).or_default() += a * b;
        }
    }
    assert!(exact.len() >= 4, "{exact:?}");

    let mut s = with_draft("tiny-llama-q4_0.gguf");
    let prompt = Prompt::Tokens(prompt_ids.clone());
    let n = 2000u64;
    let mut counts: BTreeMap<(u32, Option<u32>), u64> = BTreeMap::new();
    let (mut drafted, mut accepted) = (0, 0);
    for seed in 0..n {
        let params = SamplingParams {
            seed: Some(7_000 + seed),
            ..base.clone()
        };
        let g = run(
            &mut s,
            &prompt,
            &format,
            params,
            Some(spec(SpecSource::Draft, 1, false)),
        );
        let t = &g.sequences[0].tokens;
        let key = match t.as_slice() {
            [t1] => (*t1, None),
            [t1, t2, ..] => (*t1, Some(*t2)),
            [] => (eos, None),
        };
        *counts.entry(key).or_default() += 1;
        let st = g.stats.speculative.clone().expect("speculative stats");
        drafted += st.drafted;
        accepted += st.accepted;
    }
    assert!(accepted > 0 && accepted < drafted, "{accepted}/{drafted}");
    let outside: u64 = counts
        .iter()
        .filter(|(k, _)| !exact.contains_key(k))
        .map(|(_, &c)| c)
        .sum();
    assert_eq!(
        outside, 0,
        "pairs the constrained model excludes: {counts:?}"
    );
    let cells = exact.iter().map(|(pair, &p)| {
        let observed = counts.get(pair).copied().unwrap_or(0) as f64;
        (observed, p * n as f64)
    });
    let (chi, df) = pooled_chi_square(cells);
    assert!(df >= 2.0, "too few cells: {exact:?}");
    let limit = critical_value(df);
    eprintln!("chi-square {chi:.2} over {df} df (limit {limit:.2}); {accepted}/{drafted} accepted");
    assert!(
        chi < limit,
        "chi-square {chi:.2} >= {limit:.2}: {counts:?} vs {exact:?}"
    );
}
