//! Generation sessions on the GPU: greedy against the f64 goldens, KV reuse, context sliding,
//! several sequences, beam search, stop strings, abort, scoring.

#![cfg(not(target_arch = "wasm32"))]

#[path = "../common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::golden::Golden;
use emberlm::loader::ModelFiles;
use emberlm::sampling::SamplingParams;
use emberlm::session::{
    FinishReason, GenerateOptions, Generation, Prompt, Sequence, Session, TokenEvent,
};
use emberlm::GpuOptions;

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn session(model: &str, context: Option<usize>) -> Option<Session> {
    let ctx = common::native_gpu(GpuOptions::default())?;
    let files = ModelFiles::open(Path::new(&fixture(model))).unwrap();
    Some(pollster::block_on(Session::new(ctx, &files, context)).unwrap())
}

fn golden(model: &str) -> Golden {
    let path = fixture(&format!("golden/{model}.golden.json"));
    Golden::parse(&std::fs::read_to_string(path).unwrap())
}

fn options(params: SamplingParams) -> GenerateOptions {
    GenerateOptions {
        sampling: params,
        ..GenerateOptions::default()
    }
}

fn greedy(max_new_tokens: usize) -> SamplingParams {
    SamplingParams {
        max_new_tokens,
        ..SamplingParams::greedy()
    }
}

fn run(s: &mut Session, prompt: &Prompt, params: SamplingParams) -> (Generation, Vec<TokenEvent>) {
    let mut events = Vec::new();
    let g =
        pollster::block_on(s.generate(prompt, &options(params), &mut |e| events.push(e.clone())))
            .unwrap();
    (g, events)
}

/// Same tokens, text and finish reason; log-probabilities equal up to the small difference
/// between a prefill and a decode step computing the same logits.
fn assert_same(a: &[Sequence], b: &[Sequence], what: &str) {
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
fn streamed(events: &[TokenEvent], sequence: usize) -> String {
    events
        .iter()
        .filter(|e| e.sequence == sequence)
        .map(|e| e.text.as_str())
        .collect()
}

#[test]
fn greedy_reproduces_the_f64_goldens() {
    for model in ["tiny-llama-q4_1", "tiny-gpt2-f16", "tiny-llama-spm-f32"] {
        let Some(mut s) = session(&format!("{model}.gguf"), None) else {
            return;
        };
        let eos = s.eos_ids().to_vec();
        for r in golden(model).results {
            let want: Vec<u32> = r
                .f64_greedy_tokens
                .iter()
                .copied()
                .take_while(|t| !eos.contains(t))
                .collect();
            let prompt = Prompt::Tokens(r.prompt_tokens.clone());
            let (g, events) = run(&mut s, &prompt, greedy(r.f64_greedy_tokens.len()));
            let seq = &g.sequences[0];
            assert_eq!(seq.tokens, want, "{model} {:?}", r.prompt);
            assert_eq!(g.prompt_tokens, r.prompt_tokens);
            let reason = if want.len() < r.f64_greedy_tokens.len() {
                FinishReason::Stop
            } else {
                FinishReason::Length
            };
            assert_eq!(seq.finish_reason, reason);
            assert_eq!(streamed(&events, 0), seq.text, "events add up to the text");
            assert_eq!(seq.text, s.tokenizer().decode(&seq.tokens, true).unwrap());
            let ids: Vec<u32> = events.iter().filter_map(|e| e.id).collect();
            assert_eq!(ids, seq.tokens);
            assert_eq!(g.stats.prompt_tokens, r.prompt_tokens.len());
            assert_eq!(g.stats.generated_tokens, want.len());
            assert!(g.seed.is_none(), "greedy reports no seed");
        }
    }
}

#[test]
fn text_prompts_tokenize_like_the_goldens_and_score_matches_f64_nll() {
    let Some(mut s) = session("tiny-llama-q8_0.gguf", None) else {
        return;
    };
    for r in golden("tiny-llama-q8_0").results {
        let ids = s
            .tokenize_prompt(&Prompt::Text(r.prompt.clone()), false)
            .unwrap();
        assert_eq!(ids, r.prompt_tokens, "{:?}", r.prompt);
        let score = pollster::block_on(s.score(&ids)).unwrap();
        assert_eq!(score.tokens, ids.len() - 1);
        assert!(
            (score.nll - r.f64_prompt_nll).abs() < 2e-3,
            "{:?}: nll {} vs f64 {}",
            r.prompt,
            score.nll,
            r.f64_prompt_nll
        );
        assert!((score.ppl - score.nll.exp()).abs() < 1e-9);
    }
    let err = pollster::block_on(s.score(&[5])).unwrap_err();
    assert!(err.to_string().contains("at least 2 tokens"), "{err}");
}

#[test]
fn a_reused_prefix_gives_the_same_tokens_as_a_fresh_session() {
    let Some(mut warm) = session("tiny-llama-q4_1.gguf", None) else {
        return;
    };
    let mut fresh = session("tiny-llama-q4_1.gguf", None).unwrap();
    let first = Prompt::Text("The licensor grants you".into());
    let (g1, _) = run(&mut warm, &first, greedy(10));
    assert_eq!(g1.stats.cached_tokens, 0);
    // The next turn extends the first prompt and its reply.
    let mut ids = g1.prompt_tokens.clone();
    ids.extend(&g1.sequences[0].tokens);
    ids.extend(
        warm.tokenize_prompt(&Prompt::Text(" and the".into()), false)
            .unwrap(),
    );
    let second = Prompt::Tokens(ids.clone());
    let (g2, _) = run(&mut warm, &second, greedy(12));
    assert!(
        g2.stats.cached_tokens >= g1.prompt_tokens.len() + g1.sequences[0].tokens.len() - 1,
        "{} cached tokens reused",
        g2.stats.cached_tokens
    );
    let (g3, _) = run(&mut fresh, &second, greedy(12));
    assert_eq!(g3.stats.cached_tokens, 0);
    assert_eq!(g2.sequences[0].tokens, g3.sequences[0].tokens);
    // The same prompt again reuses all but its last token.
    let (g4, _) = run(&mut warm, &second, greedy(12));
    assert_eq!(g4.stats.cached_tokens, ids.len() - 1);
    assert_eq!(g4.sequences[0].tokens, g3.sequences[0].tokens);
    // reset forgets everything
    warm.reset();
    let (g5, _) = run(&mut warm, &second, greedy(12));
    assert_eq!(g5.stats.cached_tokens, 0);
    assert_eq!(g5.sequences[0].tokens, g3.sequences[0].tokens);
}

#[test]
fn the_context_slides_so_generation_goes_on() {
    let context = 24;
    let Some(mut s) = session("tiny-llama-q4_1.gguf", Some(context)) else {
        return;
    };
    // Never stop on EOS: generation must outlive the context several times.
    let mut params = greedy(100);
    params.temperature = 0.8;
    params.seed = Some(7);
    for &id in s.eos_ids() {
        params.logit_bias.insert(id, -100.0);
    }
    let prompt = Prompt::Text("Permission is hereby granted".into());
    let (g, events) = run(&mut s, &prompt, params.clone());
    let seq = &g.sequences[0];
    assert_eq!(seq.tokens.len(), 100);
    assert_eq!(seq.finish_reason, FinishReason::Length);
    assert!(
        g.warnings.iter().any(|w| w.contains("slid")),
        "{:?}",
        g.warnings
    );
    assert!(s.cached_tokens().len() <= context);
    assert_eq!(streamed(&events, 0), seq.text);
    // After a slide the cache holds exactly what a fresh run of the same tokens would.
    let kept = s.cached_tokens().to_vec();
    let mut fresh = session("tiny-llama-q4_1.gguf", Some(context)).unwrap();
    let (a, _) = run(&mut s, &Prompt::Tokens(kept.clone()), greedy(3));
    assert_eq!(a.stats.cached_tokens, kept.len() - 1);
    let (b, _) = run(&mut fresh, &Prompt::Tokens(kept), greedy(3));
    assert_eq!(a.sequences[0].tokens, b.sequences[0].tokens);

    // A prompt longer than the context is cut from the left, or refused in strict mode.
    let long: Vec<u32> = (0..40).map(|i| 3 + (i * 7) % 200).collect();
    let (g, _) = run(&mut s, &Prompt::Tokens(long.clone()), greedy(4));
    assert!(g.prompt_tokens.len() < context);
    assert_eq!(g.prompt_tokens.last(), long.last());
    assert!(
        g.warnings.iter().any(|w| w.contains("cut")),
        "{:?}",
        g.warnings
    );
    let strict = GenerateOptions {
        sampling: greedy(4),
        strict: true,
        ..GenerateOptions::default()
    };
    let err =
        pollster::block_on(s.generate(&Prompt::Tokens(long), &strict, &mut |_| {})).unwrap_err();
    assert!(err.to_string().contains("strict"), "{err}");
}

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
        ..SamplingParams::default()
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

#[test]
fn stop_strings_end_the_text_before_the_match() {
    let Some(mut s) = session("tiny-llama-q4_1.gguf", None) else {
        return;
    };
    let prompt = Prompt::Text("THE SOFTWARE IS PROVIDED".into());
    let (full, _) = run(&mut s, &prompt, greedy(24));
    let text = full.sequences[0].text.clone();
    assert!(text.chars().count() > 12, "{text:?}");
    // A stop string from the middle of the greedy text, likely spanning tokens.
    let chars: Vec<char> = text.chars().collect();
    let start = chars.len() / 2;
    let stop: String = chars[start..start + 4].iter().collect();
    let before = &text[..text.find(&stop).unwrap()];
    let mut params = greedy(24);
    params.stop = vec![stop.clone()];
    let (g, events) = run(&mut s, &prompt, params);
    let seq = &g.sequences[0];
    assert_eq!(seq.text, before, "stop {stop:?}");
    assert_eq!(seq.finish_reason, FinishReason::Stop);
    assert_eq!(streamed(&events, 0), before);
    assert!(seq.tokens.len() < full.sequences[0].tokens.len());
    // A stop token id ends generation too, and is not part of the output.
    let tokens = &full.sequences[0].tokens;
    let at = (1..tokens.len())
        .find(|&i| !tokens[..i].contains(&tokens[i]))
        .unwrap();
    let mut params = greedy(24);
    params.stop_token_ids = vec![tokens[at]];
    let (g, _) = run(&mut s, &prompt, params);
    assert_eq!(g.sequences[0].tokens, tokens[..at]);
    assert_eq!(g.sequences[0].finish_reason, FinishReason::Stop);
}

#[test]
fn abort_stops_within_one_token_and_leaves_the_session_usable() {
    let Some(mut s) = session("tiny-llama-q4_1.gguf", None) else {
        return;
    };
    let prompt = Prompt::Text("You may not use this file".into());
    let handle = s.abort_handle();
    let mut params = greedy(50);
    for &id in s.eos_ids() {
        params.logit_bias.insert(id, -100.0);
    }
    let mut seen = 0;
    let g = pollster::block_on(s.generate(&prompt, &options(params.clone()), &mut |e| {
        if e.id.is_some() {
            seen += 1;
            if seen == 3 {
                handle.abort();
            }
        }
    }))
    .unwrap();
    assert_eq!(g.sequences[0].finish_reason, FinishReason::Abort);
    assert_eq!(g.sequences[0].tokens.len(), 3);
    // The abort does not leak into the next call.
    let (next, _) = run(&mut s, &prompt, params.clone());
    assert_eq!(next.sequences[0].tokens.len(), 50);
    assert_eq!(next.sequences[0].tokens[..3], g.sequences[0].tokens[..]);
}

#[test]
fn zero_new_tokens_and_invalid_parameters() {
    let Some(mut s) = session("tiny-gpt2-f32.gguf", None) else {
        return;
    };
    let prompt = Prompt::Text("Hello".into());
    let (g, events) = run(&mut s, &prompt, greedy(0));
    assert!(events.is_empty());
    assert!(g.sequences[0].tokens.is_empty());
    assert_eq!(g.sequences[0].finish_reason, FinishReason::Length);
    let vocab = s.config().vocab_size as u32;
    let bad: Vec<(&str, SamplingParams)> = vec![
        (
            "top_p",
            SamplingParams {
                top_p: 1.5,
                ..SamplingParams::default()
            },
        ),
        (
            "temperature",
            SamplingParams {
                temperature: -1.0,
                ..SamplingParams::default()
            },
        ),
        (
            "num_beams",
            SamplingParams {
                num_beams: 0,
                ..SamplingParams::default()
            },
        ),
        (
            "logit_bias",
            SamplingParams {
                logit_bias: [(vocab + 5, 1.0)].into_iter().collect(),
                ..SamplingParams::default()
            },
        ),
    ];
    for (name, params) in bad {
        let err =
            pollster::block_on(s.generate(&prompt, &options(params), &mut |_| {})).unwrap_err();
        assert!(err.to_string().contains(name), "{name}: {err}");
    }
    let err = pollster::block_on(s.generate(
        &Prompt::Tokens(vec![vocab + 1]),
        &options(greedy(2)),
        &mut |_| {},
    ))
    .unwrap_err();
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
    // Still usable.
    let (g, _) = run(&mut s, &prompt, greedy(3));
    assert_eq!(g.sequences[0].tokens.len(), 3);
}

#[test]
fn a_batch_keeps_input_order_and_stops_each_prompt_on_its_own() {
    let Some(mut s) = session("tiny-llama-q4_1.gguf", None) else {
        return;
    };
    let prompts: Vec<Prompt> = ["A", "The license terms and conditions", "Copyright (c)"]
        .iter()
        .map(|t| Prompt::Text(t.to_string()))
        .collect();
    let mut events = Vec::new();
    let batch = pollster::block_on(s.generate_batch(&prompts, &options(greedy(8)), &mut |e| {
        events.push(e.clone())
    }))
    .unwrap();
    assert_eq!(batch.len(), 3);
    for (i, p) in prompts.iter().enumerate() {
        s.reset();
        let (alone, _) = run(&mut s, p, greedy(8));
        assert_same(
            &batch[i].sequences,
            &alone.sequences,
            &format!("prompt {i}"),
        );
        let text: String = events
            .iter()
            .filter(|e| e.prompt == i)
            .map(|e| e.text.as_str())
            .collect();
        assert_eq!(text, alone.sequences[0].text);
    }
}

/// The real model in chat form stops at its end-of-turn token.
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
        ..SamplingParams::default()
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

#[test]
fn smollm2_chat_stops_at_the_end_of_its_turn() {
    let Some(path) = common::require::smollm2() else {
        return;
    };
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let files = ModelFiles::open(&path).unwrap();
    let mut s = pollster::block_on(Session::new(ctx, &files, Some(256))).unwrap();
    assert!(s.has_chat_template());
    let prompt = Prompt::Chat(vec![emberlm::chat::ChatMessage::new(
        "user",
        "What is the capital of France? Answer in one word.",
    )]);
    let (g, events) = run(&mut s, &prompt, greedy(24));
    let seq = &g.sequences[0];
    eprintln!("SmolLM2: {:?} ({:?})", seq.text, seq.finish_reason);
    assert_eq!(seq.finish_reason, FinishReason::Stop);
    assert!(seq.text.contains("Paris"), "{:?}", seq.text);
    assert!(!seq.text.contains("<|im_end|>"));
    assert_eq!(streamed(&events, 0), seq.text);
}
