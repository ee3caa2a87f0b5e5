//! Speculative decoding on the GPU: greedy output token for token that of plain decoding
//! (draft models of other quantizations, prompt lookup, every draft length, adaptive or not),
//! a draft equal to the model accepting everything, the cache after rejections equal to one
//! built without speculation, the sampled distribution kept (chi-square), settings checked
//! by name, and prompt lookup on SmolLM2.

use std::collections::BTreeMap;
use std::path::Path;

use emberlm::loader::ModelFiles;
use emberlm::sampling::speculative::Verdict;
use emberlm::sampling::{Sampler, SamplingParams};
use emberlm::session::{
    GenerateOptions, Generation, Prompt, Session, SpecOptions, SpecSource, SpecStats,
};
use emberlm::Error;

use super::support::{assert_same, greedy, session};
use crate::common;
use crate::common::spec;

const TARGET: &str = "tiny-llama-f32.gguf";

fn files(name: &str) -> ModelFiles {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    ModelFiles::open(Path::new(&path)).unwrap()
}

fn with_draft(draft: &str) -> Option<Session> {
    let mut s = session(TARGET, Some(128))?;
    pollster::block_on(s.load_draft(&files(draft))).unwrap();
    Some(s)
}

fn generate(
    s: &mut Session,
    prompt: &Prompt,
    params: &SamplingParams,
    speculative: Option<SpecOptions>,
) -> emberlm::Result<Generation> {
    let options = GenerateOptions {
        sampling: params.clone(),
        speculative,
        ..GenerateOptions::default()
    };
    pollster::block_on(s.generate(prompt, &options, &mut |_| {}))
}

fn stats(g: &Generation) -> SpecStats {
    g.stats.speculative.clone().expect("speculative stats")
}

fn prompts() -> Vec<Prompt> {
    vec![
        Prompt::Text("Once upon a time".into()),
        Prompt::Text("the cat sat on the mat, the cat sat on the mat, the cat".into()),
        Prompt::Tokens(vec![1, 17, 300, 4, 17, 300, 4, 17]),
    ]
}

#[test]
fn greedy_speculation_matches_plain_decoding() {
    let Some(mut plain) = session(TARGET, Some(128)) else {
        return;
    };
    let mut stop_params = greedy(28);
    let mut want = Vec::new();
    for prompt in prompts() {
        want.push(generate(&mut plain, &prompt, &greedy(28), None).unwrap());
    }
    // a stop string inside an accepted block: nothing past it
    let cut = want[0].sequences[0]
        .text
        .chars()
        .skip(12)
        .take(3)
        .collect::<String>();
    stop_params.stop = vec![cut];
    let want_stop = generate(&mut plain, &prompts()[0], &stop_params, None).unwrap();
    assert_eq!(want_stop.sequences[0].finish_reason.as_str(), "stop");

    // every draft length with the bad draft, adaptive at one; lookup (which needs no draft
    // model) at two lengths; the good draft once. lavapipe's memory grows with every step
    // (bench/NOTES.md), so the grid is kept to what each setting needs.
    let q4: &[(SpecSource, usize, bool)] = &[
        (SpecSource::Draft, 1, false),
        (SpecSource::Draft, 2, false),
        (SpecSource::Draft, 4, false),
        (SpecSource::Draft, 8, false),
        (SpecSource::Draft, 4, true),
        (SpecSource::Lookup, 2, true),
        (SpecSource::Lookup, 8, false),
    ];
    let q8: &[(SpecSource, usize, bool)] = &[(SpecSource::Draft, 4, false)];
    for (draft, settings) in [("tiny-llama-q4_0.gguf", q4), ("tiny-llama-q8_0.gguf", q8)] {
        let mut s = with_draft(draft).unwrap();
        for &(source, k, adaptive) in settings {
            let what = format!("{draft} {source:?} k={k} adaptive={adaptive}");
            for (prompt, want) in prompts().iter().zip(&want) {
                let o = spec(source, k, adaptive);
                let g = generate(&mut s, prompt, &greedy(28), Some(o)).unwrap();
                assert_same(&want.sequences, &g.sequences, &what);
                let st = stats(&g);
                assert!(st.accepted <= st.drafted, "{what}: {st:?}");
                assert!(st.target_steps <= 27, "{what}: {st:?}");
                assert_eq!(st.method, source.as_str());
            }
            let o = spec(source, k, adaptive);
            let g = generate(&mut s, &prompts()[0], &stop_params, Some(o)).unwrap();
            assert_same(&want_stop.sequences, &g.sequences, &format!("{what} stop"));
        }
        for source in [SpecSource::Draft, SpecSource::Lookup] {
            // without the extra token, and falling back to plain decoding at once
            let o = SpecOptions {
                extra_token: false,
                disable_below_accept: 1.0,
                ..spec(source, 3, false)
            };
            let g = generate(&mut s, &prompts()[1], &greedy(28), Some(o)).unwrap();
            assert_same(
                &want[1].sequences,
                &g.sequences,
                &format!("{draft} no extra"),
            );
        }
    }
}

/// Generation past the end of the context slides (keeps the first tokens, drops the oldest
/// half of the rest, runs the tail again): speculation drafts only while there is room and
/// decodes plainly at the edge, so the tokens stay plain decoding's.
#[test]
fn speculation_slides_with_the_context_as_plain_decoding_does() {
    let Some(mut plain) = session(TARGET, Some(40)) else {
        return;
    };
    let prompt = Prompt::Tokens(vec![1, 17, 300, 4, 17, 300, 4, 17, 9, 12]);
    let want = generate(&mut plain, &prompt, &greedy(70), None).unwrap();
    assert!(
        !want.warnings.is_empty(),
        "the context slid: {:?}",
        want.warnings
    );
    let mut s = session(TARGET, Some(40)).unwrap();
    pollster::block_on(s.load_draft(&files("tiny-llama-q8_0.gguf"))).unwrap();
    for source in [SpecSource::Draft, SpecSource::Lookup] {
        let g = generate(&mut s, &prompt, &greedy(70), Some(spec(source, 5, true))).unwrap();
        assert_same(
            &want.sequences,
            &g.sequences,
            &format!("{source:?} sliding"),
        );
        assert_eq!(g.warnings, want.warnings);
    }
}

#[test]
fn a_draft_equal_to_the_model_accepts_everything() {
    let Some(mut s) = with_draft(TARGET) else {
        return;
    };
    let prompt = Prompt::Text("Once upon a time".into());
    let g = generate(
        &mut s,
        &prompt,
        &greedy(40),
        Some(spec(SpecSource::Draft, 4, false)),
    )
    .unwrap();
    let st = stats(&g);
    assert_eq!(g.sequences[0].tokens.len(), 40);
    assert_eq!(st.accepted, st.drafted, "{st:?}");
    // 4 drafts and the extra token per step after the first token
    assert!(st.target_steps <= 9, "{st:?}");
    let sampled = SamplingParams {
        temperature: 0.9,
        seed: Some(5),
        max_new_tokens: 40,
        ..SamplingParams::unfiltered()
    };
    let g = generate(
        &mut s,
        &prompt,
        &sampled,
        Some(spec(SpecSource::Draft, 4, false)),
    )
    .unwrap();
    let st = stats(&g);
    // the draft's rows come from decode steps, the model's from one multi-token step: equal
    // to rounding, so p / q is 1 to rounding
    assert!(st.acceptance_rate > 0.95, "{st:?}");
}

#[test]
fn the_cache_after_rejections_equals_one_built_without_speculation() {
    let Some(mut s) = with_draft("tiny-llama-q4_0.gguf") else {
        return;
    };
    let prompt = Prompt::Text("Once upon a time".into());
    let g = generate(
        &mut s,
        &prompt,
        &greedy(30),
        Some(spec(SpecSource::Draft, 6, false)),
    )
    .unwrap();
    let st = stats(&g);
    assert!(
        st.accepted < st.drafted,
        "the q4_0 draft should miss sometimes: {st:?}"
    );
    // continue from what the cache holds (reused) and from scratch: the same logits
    let mut held = s.cached_tokens().to_vec();
    held.push(g.sequences[0].tokens[0]);
    let next = Prompt::Tokens(held);
    let reused = generate(&mut s, &next, &greedy(12), None).unwrap();
    assert!(reused.stats.cached_tokens > 20, "{:?}", reused.stats);
    let mut fresh = session(TARGET, Some(128)).unwrap();
    let scratch = generate(&mut fresh, &next, &greedy(12), None).unwrap();
    assert_same(&scratch.sequences, &reused.sequences, "after rollback");
}

/// Chi-square of `counts` over `n` draws against `exact` (pairs of the first two tokens); no
/// draw may fall outside `exact`'s support.
fn chi_square(
    counts: &BTreeMap<(u32, u32), u64>,
    exact: &BTreeMap<(u32, u32), f64>,
    n: u64,
) -> f64 {
    let outside: u64 = counts
        .iter()
        .filter(|(k, _)| !exact.contains_key(k))
        .map(|(_, &c)| c)
        .sum();
    assert_eq!(
        outside, 0,
        "tokens the model's processors exclude were emitted"
    );
    exact
        .iter()
        .map(|(pair, &p)| {
            let e = p * n as f64;
            let o = counts.get(pair).copied().unwrap_or(0) as f64;
            (o - e).powi(2) / e
        })
        .sum()
}

/// The row after `ids` from `s`: a one-token generation runs them and leaves it on the device.
fn row_after(s: &mut Session, ids: &[u32]) -> Vec<f32> {
    generate(s, &Prompt::Tokens(ids.to_vec()), &greedy(1), None).unwrap();
    let vocab = s.config().vocab_size;
    let row = pollster::block_on(s.forward().last_logits()).unwrap();
    row[..vocab].to_vec()
}

/// The first two generated tokens with a deliberately bad draft (the Q4_0 twin, whose random
/// weights quantize far from the f32 model's) at temperature 1.5 with top-k 3 (9 pairs):
/// their joint distribution must be the model's own, p(t1) · p(t2 | t1) from the rows plain
/// decoding reads. 20,000 seeded draws run speculation's rule (draft from q, verify against
/// p) on the real rows of both models; a few hundred seeded generations run the whole session
/// (each reads the GPU: lavapipe is slow), checked the same way.
#[test]
fn sampled_speculation_keeps_the_models_distribution() {
    let Some(mut s) = with_draft("tiny-llama-q4_0.gguf") else {
        return;
    };
    let prompt_ids = vec![1u32, 17, 300, 4];
    let base = SamplingParams {
        temperature: 1.5,
        top_k: 3,
        max_new_tokens: 3,
        ..SamplingParams::unfiltered()
    };
    let vocab = s.config().vocab_size;
    let sampler = Sampler::new(&base, vocab).unwrap();
    let mut target = session(TARGET, Some(64)).unwrap();
    let mut draft = session("tiny-llama-q4_0.gguf", Some(64)).unwrap();
    let p1 = sampler
        .distribution(&row_after(&mut target, &prompt_ids), &prompt_ids, &[])
        .unwrap();
    let mut exact: BTreeMap<(u32, u32), f64> = BTreeMap::new();
    // per first token: the model's and the draft's distributions of the second
    let mut second: BTreeMap<u32, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    for (t1, &a) in p1.iter().enumerate().filter(|(_, &a)| a > 0.0) {
        let t1 = t1 as u32;
        let mut ids = prompt_ids.clone();
        ids.push(t1);
        let p2 = sampler
            .distribution(&row_after(&mut target, &ids), &prompt_ids, &[t1])
            .unwrap();
        let q2 = sampler
            .distribution(&row_after(&mut draft, &ids), &prompt_ids, &[t1])
            .unwrap();
        for (t2, &b) in p2.iter().enumerate().filter(|(_, &b)| b > 0.0) {
            exact.insert((t1, t2 as u32), a * b);
        }
        second.insert(t1, (p2, q2));
    }
    assert_eq!(exact.len(), 9);

    // the rule on the real rows, 20,000 seeded draws
    let n = 20_000u64;
    let mut counts: BTreeMap<(u32, u32), u64> = BTreeMap::new();
    let mut rejected = 0;
    for seed in 0..n {
        let mut r = Sampler::new(
            &SamplingParams {
                seed: Some(seed),
                ..base.clone()
            },
            vocab,
        )
        .unwrap();
        let t1 = r.draw_from(&p1, &p1);
        let (p2, q2) = &second[&t1];
        let d = r.draw_from(q2, q2);
        let t2 = match r.verify(p2, Some(q2), d).unwrap() {
            Verdict::Accept => d,
            Verdict::Replace(t) => {
                rejected += 1;
                t
            }
        };
        *counts.entry((t1, t2)).or_default() += 1;
    }
    assert!(rejected > 0 && rejected < n, "{rejected} of {n} rejected");
    let chi2 = chi_square(&counts, &exact, n);
    // 8 degrees of freedom: p = 0.001 at 26.12
    assert!(
        chi2 < 26.12,
        "rule: chi-square {chi2:.2}: {counts:?} vs {exact:?}"
    );

    // the session end to end
    let n = 300u64;
    let mut counts: BTreeMap<(u32, u32), u64> = BTreeMap::new();
    let (mut drafted, mut accepted) = (0, 0);
    let prompt = Prompt::Tokens(prompt_ids.clone());
    for seed in 0..n {
        let params = SamplingParams {
            seed: Some(1_000_000 + seed),
            ..base.clone()
        };
        let o = spec(SpecSource::Draft, 1, false);
        let g = generate(&mut s, &prompt, &params, Some(o)).unwrap();
        let t = &g.sequences[0].tokens;
        *counts.entry((t[0], t[1])).or_default() += 1;
        let st = stats(&g);
        drafted += st.drafted;
        accepted += st.accepted;
    }
    assert!(accepted > 0 && accepted < drafted, "{accepted}/{drafted}");
    let chi2 = chi_square(&counts, &exact, n);
    assert!(
        chi2 < 26.12,
        "session: chi-square {chi2:.2}: {counts:?} vs {exact:?}"
    );
}

#[test]
fn speculative_settings_are_checked_by_name() {
    let Some(mut s) = session(TARGET, Some(64)) else {
        return;
    };
    let prompt = Prompt::Text("Once".into());
    let name_of = |r: emberlm::Result<Generation>| match r {
        Err(Error::InvalidArgument { name, .. }) => name.to_string(),
        other => format!("{other:?}"),
    };
    let bad_k0 = SpecOptions {
        k: 0,
        ..SpecOptions::default()
    };
    assert_eq!(
        name_of(generate(&mut s, &prompt, &greedy(4), Some(bad_k0))),
        "spec_k"
    );
    let bad_k = SpecOptions {
        k: 65,
        ..SpecOptions::default()
    };
    assert_eq!(
        name_of(generate(&mut s, &prompt, &greedy(4), Some(bad_k))),
        "spec_k"
    );
    let bad_rate = SpecOptions {
        disable_below_accept: 1.5,
        ..SpecOptions::default()
    };
    assert_eq!(
        name_of(generate(&mut s, &prompt, &greedy(4), Some(bad_rate))),
        "spec_disable_below_accept"
    );
    // a draft model asked for, none loaded
    let draft = spec(SpecSource::Draft, 4, false);
    assert_eq!(
        name_of(generate(&mut s, &prompt, &greedy(4), Some(draft))),
        "draft"
    );
    let beams = SamplingParams {
        num_beams: 2,
        ..greedy(4)
    };
    let lookup = spec(SpecSource::Lookup, 4, false);
    assert_eq!(
        name_of(generate(&mut s, &prompt, &beams, Some(lookup))),
        "speculative"
    );
    // a draft with another vocabulary: refused, naming the difference
    let err = pollster::block_on(s.load_draft(&files("tiny-llama-spm-f32.gguf"))).err();
    let text = err.map(|e| e.to_string()).unwrap_or_default();
    assert!(text.contains("vocabulary differs"), "{text}");
    assert!(s.draft().is_none());
    // a refused draft leaves the one loaded before in place
    pollster::block_on(s.load_draft(&files("tiny-llama-q8_0.gguf"))).unwrap();
    assert!(pollster::block_on(s.load_draft(&files("tiny-llama-spm-f32.gguf"))).is_err());
    assert!(s.draft().is_some_and(|(name, _)| name.contains("q8_0")));
}

#[test]
fn prompt_lookup_on_smollm2_is_exact_and_accepts_quoted_text() {
    let Some(path) = common::require::smollm2() else {
        return;
    };
    let Some(ctx) = common::native_gpu(emberlm::GpuOptions::default()) else {
        return;
    };
    let files = ModelFiles::open(&path).unwrap();
    let mut s = pollster::block_on(Session::new(ctx, &files, Some(512))).unwrap();
    let prompt = Prompt::Chat(vec![emberlm::chat::ChatMessage::new(
        "user",
        "Repeat this text exactly, word for word: The quick brown fox jumps over the lazy dog while the farmer watches from the old red barn.",
    )]);
    let want = generate(&mut s, &prompt, &greedy(24), None).unwrap();
    let before = counters(&s);
    let g = generate(
        &mut s,
        &prompt,
        &greedy(24),
        Some(spec(SpecSource::Lookup, 4, false)),
    )
    .unwrap();
    let read = counters(&s).since(&before).readback_bytes;
    assert_same(&want.sequences, &g.sequences, "SmolLM2 lookup");
    let st = stats(&g);
    let n = g.sequences[0].tokens.len();
    // the answer quotes the prompt: some drafts stand, so fewer model steps than tokens
    assert!(st.accepted > 0, "{st:?}");
    assert!(st.target_steps + 1 < n, "{st:?} for {n} tokens");
    // the prompt's last row (196,608 bytes) and then candidates: a few hundred bytes per
    // verified position, where full rows would read 196,608 each
    let row = 4 * s.config().vocab_size as u64;
    eprintln!(
        "SmolLM2 lookup: {read} bytes read back for {n} tokens in {} model steps",
        st.target_steps
    );
    assert!(read < row + 8192 * n as u64, "{read} bytes for {n} tokens");
}

/// The engine counters of `s`'s device so far.
fn counters(s: &Session) -> emberlm::backend::gpu::Counters {
    s.forward().gpu().expect("a GPU session").counters()
}

/// Verification reads each row's candidates, all rows in one small readback, wherever the
/// sampler can decide from them (a draft model's distributions too), and gives exactly the
/// tokens full rows give: greedy, and seeded sampling with a repetition penalty (each row's
/// request carries the penalties of the drafts before it), whose draws match because the
/// distributions are the same bits.
#[test]
fn verification_reads_candidates_and_gives_the_full_rows_tokens() {
    let Some(mut s) = with_draft("tiny-llama-q8_0.gguf") else {
        return;
    };
    let sampled = SamplingParams {
        temperature: 0.9,
        top_k: 20,
        repetition_penalty: 1.2,
        seed: Some(7),
        max_new_tokens: 24,
        ..SamplingParams::unfiltered()
    };
    // a text that repeats itself, and 90 distinct ids in which sampled tokens often recur
    // (prompt lookup drafts their continuations)
    let many = Prompt::Tokens((0..90).map(|i| (i * 37 + 11) % 512).collect());
    for (name, params) in [("greedy", greedy(24)), ("sampled", sampled)] {
        for source in [SpecSource::Draft, SpecSource::Lookup] {
            let what = format!("{name} {source:?}");
            let (mut drafted, mut from_candidates, mut from_rows) = (0, 0, 0);
            let (mut rows_bytes, mut cand_bytes) = (0, 0);
            for prompt in [&prompts()[1], &many] {
                let o = spec(source, 4, false);
                s.set_full_row_readback(true);
                let before = counters(&s);
                let rows = generate(&mut s, prompt, &params, Some(o.clone())).unwrap();
                rows_bytes += counters(&s).since(&before).readback_bytes;
                s.set_full_row_readback(false);
                let before = counters(&s);
                let cand = generate(&mut s, prompt, &params, Some(o)).unwrap();
                cand_bytes += counters(&s).since(&before).readback_bytes;
                assert_same(&rows.sequences, &cand.sequences, &what);
                assert_eq!(rows.stats.candidate_steps, 0, "{what}: {:?}", rows.stats);
                drafted += stats(&cand).drafted;
                from_candidates += cand.stats.candidate_steps;
                from_rows += cand.stats.full_row_steps;
            }
            assert!(drafted > 0, "{what}: nothing drafted");
            // the first token comes from the prompt's row; every other decision from
            // candidates but the odd fallback
            assert!(
                from_candidates > 4 * from_rows,
                "{what}: {from_candidates} from candidates, {from_rows} from rows"
            );
            assert!(
                2 * cand_bytes < rows_bytes,
                "{what}: {cand_bytes} bytes read from candidates, {rows_bytes} from rows"
            );
        }
    }
}
