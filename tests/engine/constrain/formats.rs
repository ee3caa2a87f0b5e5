//! Each kind of response format on the tiny fixtures: the text obeys it, greedy and sampled,
//! alone, with several sequences and in batches.

use emberlm::constrain::ResponseFormat;
use emberlm::session::{BatchItem, FinishReason, Prompt};
use serde_json::json;

use super::support::*;

/// `ddd-l{2,4}`: three digits, a dash, two to four lower-case letters.
fn is_code(text: &str) -> bool {
    let b = text.as_bytes();
    b.len() >= 6
        && b.len() <= 8
        && b[..3].iter().all(u8::is_ascii_digit)
        && b[3] == b'-'
        && b[4..].iter().all(u8::is_ascii_lowercase)
}

#[test]
fn regex_outputs_match_on_every_tokenizer_kind() {
    let format = ResponseFormat::Regex("[0-9]{3}-[a-z]{2,4}".into());
    for model in TOKENIZER_KINDS {
        let mut s = cpu_session(&fixture(model));
        let mut params = vec![greedy(40)];
        params.extend((0..12).map(|seed| sampled(seed, 40)));
        for p in params {
            let g = generate(&mut s, "The code is", &format, p.clone());
            assert_complete(&g, model);
            let text = &g.sequences[0].text;
            assert!(is_code(text), "{model} seed {:?}: {text:?}", p.seed);
        }
    }
}

/// A small arithmetic language, as GBNF and as Lark; both give texts the checker accepts.
fn is_sum(text: &str) -> bool {
    let terms: Vec<&str> = text.split(['+', '-']).collect();
    (1..=4).contains(&terms.len())
        && terms
            .iter()
            .all(|t| (1..=3).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_digit()))
}

#[test]
fn gbnf_and_lark_grammars_are_followed() {
    let gbnf = ResponseFormat::Gbnf(
        "# sums of small numbers\nroot ::= Term (op Term){0,3}\nop ::= \"+\" | \"-\"\nTerm ::= [0-9]{1,3}\n"
            .into(),
    );
    let lark = ResponseFormat::Lark(
        "start: term (op term){0,3}\nop: \"+\" | \"-\"\nterm: /[0-9]{1,3}/\n".into(),
    );
    for model in TOKENIZER_KINDS {
        let mut s = cpu_session(&fixture(model));
        for format in [&gbnf, &lark] {
            for seed in 0..8 {
                let g = generate(&mut s, "2+2", format, sampled(seed, 40));
                assert_complete(&g, model);
                let text = &g.sequences[0].text;
                assert!(is_sum(text), "{model} {}: {text:?}", format.kind());
            }
        }
    }
}

#[test]
fn json_object_mode_gives_an_object() {
    let schema = json!({"type": "object"});
    for model in TOKENIZER_KINDS {
        let mut s = cpu_session(&fixture(model));
        for seed in 0..6 {
            let g = generate(&mut s, "{", &ResponseFormat::JsonObject, sampled(seed, 100));
            let seq = &g.sequences[0];
            match seq.finish_reason {
                FinishReason::Stop => assert_valid(&schema, &seq.text, model),
                // an object with free keys may outgrow the limit: then it says so
                _ => assert!(
                    g.warnings.iter().any(|w| w.contains("json_object")),
                    "{g:?}"
                ),
            }
        }
    }
}

#[test]
fn a_limit_before_the_end_is_reported_not_hidden() {
    let mut s = cpu_session(&fixture("tiny-llama-f32.gguf"));
    let format = schema_format(&json!({
        "type": "object",
        "properties": {"name": {"type": "string", "minLength": 10}},
        "required": ["name"]
    }));
    let g = generate(&mut s, "x", &format, greedy(3));
    assert_eq!(g.sequences[0].finish_reason, FinishReason::Length);
    assert!(
        g.warnings
            .iter()
            .any(|w| w.contains("before its json_schema was complete")),
        "{:?}",
        g.warnings
    );
    assert!(g.stats.constrained_steps >= 3, "{:?}", g.stats);
}

#[test]
fn several_sequences_and_batches_keep_each_sequence_in_its_format() {
    let code = ResponseFormat::Regex("[0-9]{3}-[a-z]{2,4}".into());
    let schema = json!({
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["ok", "n"],
        "additionalProperties": false
    });
    let json_format = schema_format(&schema);
    let mut s = cpu_session(&fixture("tiny-gpt2-f32.gguf"));
    let mut p = sampled(5, 60);
    p.num_return_sequences = 4;
    let g = generate(&mut s, "code:", &code, p.clone());
    assert_eq!(g.sequences.len(), 4);
    assert_complete(&g, "num_return_sequences");
    for seq in &g.sequences {
        assert!(is_code(&seq.text), "{:?}", seq.text);
    }
    // two prompts with different formats decoded together draw what each draws alone
    let items = vec![
        BatchItem {
            prompt: Prompt::Text("code:".into()),
            options: options(&code, sampled(7, 60)),
        },
        BatchItem {
            prompt: Prompt::Text("json:".into()),
            options: options(&json_format, sampled(8, 60)),
        },
    ];
    let together = pollster::block_on(s.generate_items(&items, Some(4), &mut |_| {})).unwrap();
    let alone = pollster::block_on(s.generate_items(&items, Some(1), &mut |_| {})).unwrap();
    for (t, a) in together.iter().zip(&alone) {
        assert_eq!(t.sequences[0].tokens, a.sequences[0].tokens);
    }
    assert_complete(&together[0], "batched regex");
    assert!(is_code(&together[0].sequences[0].text));
    assert_complete(&together[1], "batched schema");
    assert_valid(&schema, &together[1].sequences[0].text, "batched schema");
}

#[test]
fn stop_strings_and_streaming_work_under_a_constraint() {
    let mut s = cpu_session(&fixture("tiny-llama-spm-f32.gguf"));
    let format = ResponseFormat::Regex("(ab|cd){2,6}".into());
    for seed in 0..8 {
        let mut p = sampled(seed, 40);
        p.stop = vec!["cd".into()];
        let mut streamed = String::new();
        let g = pollster::block_on(s.generate(
            &Prompt::Text("x".into()),
            &options(&format, p),
            &mut |e| streamed.push_str(&e.text),
        ))
        .unwrap();
        let seq = &g.sequences[0];
        assert_eq!(streamed, seq.text);
        assert!(!seq.text.contains("cd"), "{:?}", seq.text);
        let all = s.tokenizer().decode(&seq.tokens, true).unwrap();
        if all.contains("cd") {
            // the stop string cut the text: it is not vouched for
            assert!(
                g.warnings.iter().any(|w| w.contains("stop string")),
                "{g:?}"
            );
        } else {
            assert_complete(&g, "no stop string");
            assert!(
                seq.text.len() >= 4 && seq.text.len().is_multiple_of(2),
                "{:?}",
                seq.text
            );
        }
    }
}

/// On the GPU the mask goes to the selection kernel, so the candidates decide greedy, top-k
/// and top-p draws (the whole row is read only when they cannot); either way the text obeys
/// the format.
#[test]
fn gpu_sessions_follow_formats_from_candidates_and_rows() {
    let Some(ctx) = crate::common::native_gpu(emberlm::GpuOptions::default()) else {
        return;
    };
    let files = emberlm::loader::ModelFiles::open(&fixture("tiny-llama-f32.gguf")).unwrap();
    let mut s = pollster::block_on(emberlm::session::Session::new(ctx, &files, None)).unwrap();
    let code = ResponseFormat::Regex("[0-9]{3}-[a-z]{2,4}".into());
    // greedy, and the nucleus over the allowed tokens only (summed by the kernel under the
    // mask): after the prompt's row every step is decided by its candidates, including the
    // steps where the allowed set changes (digits, the dash, letters), whose request must carry
    // the new mask
    let nucleus = emberlm::sampling::SamplingParams {
        top_p: 0.9,
        ..sampled(3, 20)
    };
    for (what, p) in [("gpu greedy", greedy(20)), ("gpu top-p", nucleus)] {
        let g = generate(&mut s, "code", &code, p);
        assert_complete(&g, what);
        assert!(is_code(&g.sequences[0].text), "{:?}", g.sequences[0].text);
        let st = &g.stats;
        assert_eq!(st.select_fallbacks, 0, "{what}: {st:?}");
        assert_eq!(st.full_row_steps, 1, "{what}: {st:?}");
        assert_eq!(
            st.candidate_steps + 1,
            st.constrained_steps,
            "{what}: {st:?}"
        );
    }
    // batched lanes too
    let items: Vec<BatchItem> = ["code", "the code"]
        .iter()
        .map(|p| BatchItem {
            prompt: Prompt::Text((*p).into()),
            options: options(&code, greedy(20)),
        })
        .collect();
    for g in pollster::block_on(s.generate_items(&items, Some(2), &mut |_| {})).unwrap() {
        assert_complete(&g, "gpu batch");
        assert!(is_code(&g.sequences[0].text), "{:?}", g.sequences[0].text);
        assert_eq!(g.stats.select_fallbacks, 0, "gpu batch: {:?}", g.stats);
    }
    let schema = json!({
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["ok", "n"],
        "additionalProperties": false
    });
    for (i, p) in [sampled(1, 60), balanced(2, 60), greedy(60)]
        .into_iter()
        .enumerate()
    {
        let g = generate(&mut s, "json", &schema_format(&schema), p);
        assert_complete(&g, "gpu schema");
        assert_valid(&schema, &g.sequences[0].text, &format!("gpu schema {i}"));
    }
}

/// A JSON grammar written in GBNF (character classes with escapes, recursion, optional
/// groups): every finished text parses as JSON.
#[test]
fn a_json_grammar_in_gbnf_gives_json() {
    let grammar = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/json.gbnf"
    ))
    .unwrap();
    let format = ResponseFormat::Gbnf(grammar);
    let mut finished = 0;
    for model in TOKENIZER_KINDS {
        let mut s = cpu_session(&fixture(model));
        for seed in 0..6 {
            let g = generate(&mut s, "{", &format, sampled(seed, 100));
            let seq = &g.sequences[0];
            if seq.finish_reason == FinishReason::Stop {
                finished += 1;
                let v: serde_json::Value = serde_json::from_str(&seq.text)
                    .unwrap_or_else(|e| panic!("{model}: {:?}: {e}", seq.text));
                assert!(v.is_object(), "{}", seq.text);
            } else {
                assert!(!g.warnings.is_empty(), "{model}: a silent cut");
            }
        }
    }
    assert!(finished >= 6, "only {finished}/18 finished");
}

/// Beam search under a format: every returned beam obeys it and ends by its grammar; the
/// best beam is the constrained search's, not the unconstrained one's; a limit before the
/// end gives a warning per unfinished beam.
#[test]
fn beam_search_keeps_every_beam_in_the_format() {
    let code = ResponseFormat::Regex("[0-9]{3}-[a-z]{2,4}".into());
    for model in TOKENIZER_KINDS {
        let mut s = cpu_session(&fixture(model));
        let mut p = greedy(40);
        p.num_beams = 4;
        p.num_return_sequences = 3;
        let g = generate(&mut s, "The code is", &code, p.clone());
        assert_complete(&g, model);
        assert_eq!(g.sequences.len(), 3, "{model}");
        for seq in &g.sequences {
            assert!(is_code(&seq.text), "{model}: {:?}", seq.text);
            assert!(seq.logprob.is_finite() && seq.logprob < 0.0, "{seq:?}");
        }
        assert!(g.stats.constrained_steps >= 6, "{model}: {:?}", g.stats);
        // without the format the same search gives free text
        let free = pollster::block_on(s.generate(
            &Prompt::Text("The code is".into()),
            &emberlm::session::GenerateOptions {
                sampling: p.clone(),
                ..Default::default()
            },
            &mut |_| {},
        ))
        .unwrap();
        assert!(
            free.sequences.iter().all(|q| !is_code(&q.text)),
            "{model}: {:?}",
            free.sequences
        );
        // three tokens cannot finish `ddd-ll`: each returned beam says so
        p.max_new_tokens = 2;
        let g = generate(&mut s, "The code is", &code, p);
        assert!(
            g.sequences
                .iter()
                .all(|q| q.finish_reason == FinishReason::Length),
            "{g:?}"
        );
        let warned = g
            .warnings
            .iter()
            .filter(|w| w.contains("before its regex was complete"))
            .count();
        assert_eq!(warned, g.sequences.len(), "{:?}", g.warnings);
    }
}
