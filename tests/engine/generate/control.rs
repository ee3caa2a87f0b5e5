//! How generation ends: stop strings, abort, zero new tokens, invalid parameters, batches that
//! stop each prompt on its own, and the real model's end-of-turn token.

use emberlm::loader::ModelFiles;
use emberlm::sampling::SamplingParams;
use emberlm::session::{FinishReason, Prompt, Session};
use emberlm::GpuOptions;

use super::support::{assert_same, greedy, options, run, session, streamed};
use crate::common;

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
                ..SamplingParams::unfiltered()
            },
        ),
        (
            "temperature",
            SamplingParams {
                temperature: -1.0,
                ..SamplingParams::unfiltered()
            },
        ),
        (
            "num_beams",
            SamplingParams {
                num_beams: 0,
                ..SamplingParams::unfiltered()
            },
        ),
        (
            "logit_bias",
            SamplingParams {
                logit_bias: [(vocab + 5, 1.0)].into_iter().collect(),
                ..SamplingParams::unfiltered()
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

#[test]
fn a_chat_template_given_by_the_caller_renders_the_prompt() {
    let Some(mut s) = session("tiny-llama-f32.gguf", Some(64)) else {
        return;
    };
    let chat = Prompt::Chat(vec![emberlm::chat::ChatMessage::new("user", "hi there")]);
    let before = s.tokenize_prompt(&chat, false).unwrap();
    let source = "{% for m in messages %}Q: {{ m['content'] }}\n{% endfor %}\
                  {% if add_generation_prompt %}A:{% endif %}";
    assert!(s.set_chat_template("{% for m in messages %}").is_err());
    s.set_chat_template(source).unwrap();
    assert!(s.has_chat_template());
    let after = s.tokenize_prompt(&chat, false).unwrap();
    let want = s.tokenizer().encode("Q: hi there\nA:", true, None).unwrap();
    assert_eq!(after, want);
    assert_ne!(after, before, "the fallback format differs");
}
