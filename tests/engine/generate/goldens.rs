//! Greedy generation against the f64 goldens, scoring, KV reuse and the sliding context.

use emberlm::session::{FinishReason, GenerateOptions, Prompt};

use super::support::{golden, greedy, run, session, streamed};

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
