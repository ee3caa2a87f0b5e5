use serde_json::json;

use super::*;
use crate::session::{FinishReason, Generation, Sequence, Stats, TokenEvent};

fn chat(body: serde_json::Value) -> Result<Request> {
    Request::from_value(CompletionKind::Chat, &body)
}

#[test]
fn chat_fields_map_to_generation_options() {
    let r = chat(json!({
        "model": "smollm2",
        "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}]}
        ],
        "temperature": 0.5, "top_p": 0.9, "max_tokens": 12, "stop": "\n", "seed": 7, "n": 3,
        "frequency_penalty": 0.5, "presence_penalty": 0.25, "logit_bias": {"5": -100},
        "response_format": {"type": "json_object"}, "logprobs": true, "top_logprobs": 3,
        "stream": true, "stream_options": {"include_usage": true}, "user": "u1"
    }))
    .expect("valid request");
    let p = &r.options.sampling;
    assert_eq!((p.temperature, p.top_p, p.max_new_tokens), (0.5, 0.9, 12));
    assert_eq!(p.stop, vec!["\n".to_string()]);
    assert_eq!((p.seed, p.num_return_sequences), (Some(7), 3));
    assert_eq!((p.frequency_penalty, p.presence_penalty), (0.5, 0.25));
    assert_eq!(p.logit_bias.get(&5), Some(&-100.0));
    assert_eq!(r.options.response_format, ResponseFormat::JsonObject);
    assert!(r.stream && r.include_usage && r.logprobs);
    assert_eq!(r.options.top_logprobs, 3);
    let t = Request::from_value(CompletionKind::Text, &json!({"prompt": "x", "logprobs": 5}))
        .expect("valid");
    assert!(t.logprobs);
    assert_eq!(t.options.top_logprobs, 5);
    assert_eq!(r.model.as_deref(), Some("smollm2"));
    let Prompt::Chat(messages) = &r.prompt else {
        panic!("{:?}", r.prompt)
    };
    assert_eq!(messages[0].role, "system");
    assert_eq!(messages[1].content, "Hi!");
}

#[test]
fn defaults_are_openais() {
    let r = chat(json!({"messages": [{"role": "user", "content": "x"}]})).expect("valid");
    let p = &r.options.sampling;
    // the whole distribution, not the library's `balanced` default
    assert_eq!((p.temperature, p.top_k, p.top_p), (1.0, 0, 1.0));
    assert_eq!(p.max_new_tokens, 256);
    assert!(!r.stream && !r.logprobs);
    let t = Request::from_value(CompletionKind::Text, &json!({"prompt": "x", "echo": true}))
        .expect("valid");
    assert_eq!(t.options.sampling.max_new_tokens, 16);
    assert!(t.options.echo);
    assert_eq!(t.prompt, Prompt::Text("x".into()));
}

#[test]
fn bad_requests_name_the_field() {
    let cases = [
        (
            json!({"messages": [{"role": "user", "content": "x"}], "temprature": 1}),
            "unknown field `temprature`",
        ),
        (json!({"messages": []}), "at least one message"),
        (
            json!({"messages": [{"role": "user", "content": "x", "audio": []}]}),
            "unknown field `audio`",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "n": 0}),
            "`n` must be in 1..=64",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "temperature": 3}),
            "`temperature` must be in [0, 2]",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}),
            "needs `logprobs: true`",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}),
            "`top_logprobs` must be in 0..=20",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "stop": 5}),
            "`stop` must be",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}}),
            "unknown type \"yaml\"",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "max_completion_tokens": 2}),
            "not both",
        ),
        (json!([1, 2]), "must be a JSON object"),
    ];
    for (body, want) in cases {
        let e = chat(body.clone()).expect_err(&body.to_string()).to_string();
        assert!(e.contains(want), "{body}: {e}");
    }
    let e = Request::from_json(CompletionKind::Chat, "{")
        .unwrap_err()
        .to_string();
    assert!(e.contains("not valid JSON"), "{e}");
}

fn generation() -> Generation {
    let seq = |text: &str, finish| Sequence {
        tokens: vec![1, 2],
        text: text.into(),
        finish_reason: finish,
        logprob: -1.0,
    };
    Generation {
        prompt_tokens: vec![9, 9, 9],
        sequences: vec![
            seq("{}", FinishReason::Stop),
            seq("{\"a", FinishReason::Length),
        ],
        stats: Stats {
            generated_tokens: 4,
            ..Stats::default()
        },
        seed: Some(1),
        warnings: vec!["sequence 1 reached its token limit".into()],
    }
}

#[test]
fn responses_have_the_documented_shape() {
    let g = generation();
    let lp = vec![
        vec![
            response::TokenLogprob {
                token: "{".into(),
                logprob: -0.5,
                top: vec![("{".into(), -0.5), ("[".into(), -1.5)],
            },
            response::TokenLogprob {
                token: "}".into(),
                logprob: -0.25,
                top: vec![("}".into(), -0.25), ("}".into(), -2.0)],
            },
        ],
        vec![],
    ];
    let r = response::response(CompletionKind::Chat, "chatcmpl-1", "m", &g, Some(&lp));
    assert_eq!(r["object"], "chat.completion");
    assert_eq!(
        r["choices"][0]["message"],
        json!({"role": "assistant", "content": "{}", "refusal": null})
    );
    assert_eq!(r["choices"][1]["finish_reason"], "length");
    assert_eq!(r["choices"][0]["logprobs"]["content"][1]["logprob"], -0.25);
    assert_eq!(
        r["choices"][0]["logprobs"]["content"][0]["top_logprobs"][1],
        json!({"token": "[", "logprob": -1.5, "bytes": [91]})
    );
    // completions: one object per position; the likelier of two same-text tokens stays
    let t = response::response(CompletionKind::Text, "cmpl-1", "m", &g, Some(&lp));
    assert_eq!(
        t["choices"][0]["logprobs"]["top_logprobs"],
        json!([{"{": -0.5, "[": -1.5}, {"}": -0.25}])
    );
    assert_eq!(
        r["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7})
    );
    assert_eq!(r["warnings"][0], "sequence 1 reached its token limit");
    let t = response::response(CompletionKind::Text, "cmpl-1", "m", &g, None);
    assert_eq!(t["object"], "text_completion");
    assert_eq!(t["choices"][0]["text"], "{}");
    assert!(t["choices"][0]["logprobs"].is_null());
}

#[test]
fn chunks_start_with_the_role_and_end_with_reasons_and_usage() {
    let g = generation();
    let mut w = ChunkWriter::new(CompletionKind::Chat, "chatcmpl-1", "m", false);
    let event = |sequence, text: &str| TokenEvent {
        prompt: 0,
        sequence,
        id: Some(1),
        logprob: Some(-0.1),
        text: text.into(),
        beam: None,
        drafted: None,
        top_logprobs: None,
    };
    let first = w.event(&event(0, "{"), None).expect("a chunk");
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(
        first["choices"][0]["delta"],
        json!({"role": "assistant", "content": "{"})
    );
    let next = w.event(&event(0, "}"), None).expect("a chunk");
    assert_eq!(next["choices"][0]["delta"], json!({"content": "}"}));
    assert!(w.event(&event(0, ""), None).is_none());
    let end = w.finish(&g, true);
    assert_eq!(end.len(), 3);
    assert_eq!(end[0]["choices"][0]["finish_reason"], "stop");
    // choice 1 never sent a token: its closing chunk carries the role
    assert_eq!(end[1]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(end[2]["choices"], json!([]));
    assert_eq!(end[2]["usage"]["total_tokens"], 7);
}

#[test]
fn tools_and_their_history_are_read() {
    let r = chat(json!({
        "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": "{\"city\": \"Oslo\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
        ],
        "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}],
        "tool_choice": "required",
        "parallel_tool_calls": false
    }))
    .expect("valid request");
    let tools = r.options.tools.as_ref().expect("tools");
    assert_eq!(tools.choice, crate::chat::tools::ToolChoice::Required);
    assert!(!tools.parallel);
    let Prompt::Chat(messages) = &r.prompt else {
        panic!("{:?}", r.prompt)
    };
    assert_eq!(messages[1].content, "");
    assert_eq!(messages[1].tool_calls[0].name, "w");
    assert_eq!(messages[1].tool_calls[0].arguments, "{\"city\": \"Oslo\"}");
    assert_eq!(messages[2].tool_call_id.as_deref(), Some("call_1"));

    let refused = |body: serde_json::Value| chat(body).unwrap_err().to_string();
    let user_calls = refused(json!({"messages": [
        {"role": "user", "content": "x", "tool_calls": []}
    ]}));
    assert!(
        user_calls.contains("only assistant messages"),
        "{user_calls}"
    );
    let bad_call = refused(json!({"messages": [
        {"role": "assistant", "content": "x", "tool_calls": [{"id": "1", "function": {"arguments": "{}"}}]}
    ]}));
    assert!(
        bad_call.contains("messages[0].tool_calls[0]: function.name"),
        "{bad_call}"
    );
    let no_tools =
        refused(json!({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}));
    assert!(no_tools.contains("tool_choice"), "{no_tools}");
    // completions have no tools
    let text = Request::from_value(CompletionKind::Text, &json!({"prompt": "x", "tools": []}))
        .unwrap_err()
        .to_string();
    assert!(text.contains("unknown field `tools`"), "{text}");
}

#[test]
fn calls_become_tool_calls_whole_and_streamed() {
    use super::tool_reply::ToolReply;
    use crate::chat::tools::ToolSyntax;

    let text = "Checking.\n<tool_call>\n{\"name\": \"w\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"t\", \"arguments\": {}}\n</tool_call>";
    let mut g = generation();
    g.sequences[0].text = text.into();
    g.sequences[1].text = "<tool_call>\n{\"name\": \"w\", \"argu".into();
    let reply = ToolReply::new(ToolSyntax::Hermes, "chatcmpl-00ab", 2);
    let mut whole = response::response(CompletionKind::Chat, "chatcmpl-00ab", "m", &g, None);
    reply.rewrite(&mut whole, &g);
    let first = &whole["choices"][0];
    assert_eq!(first["finish_reason"], "tool_calls");
    assert_eq!(first["message"]["content"], "Checking.");
    assert_eq!(
        first["message"]["tool_calls"],
        json!([
            {"id": "call_00ab_0_0", "type": "function", "function": {"name": "w", "arguments": "{\"city\": \"Oslo\"}"}},
            {"id": "call_00ab_0_1", "type": "function", "function": {"name": "t", "arguments": "{}"}}
        ])
    );
    // cut off inside its only call: text, and the limit as the reason
    let second = &whole["choices"][1];
    assert_eq!(second["finish_reason"], "length");
    assert!(second["message"].get("tool_calls").is_none());

    // streamed a few bytes at a time: the same content and calls, with the same ids
    let mut reply = ToolReply::new(ToolSyntax::Hermes, "chatcmpl-00ab", 2);
    let mut content = String::new();
    let mut items = Vec::new();
    let bytes: Vec<char> = text.chars().collect();
    for piece in bytes.chunks(3) {
        let (c, i) = reply.push(0, &piece.iter().collect::<String>());
        content.push_str(&c);
        items.extend(i);
    }
    let (c, i) = reply.finish(0);
    content.push_str(&c);
    items.extend(i);
    assert_eq!(content, "Checking.");
    assert_eq!(items.len(), 2);
    assert_eq!(items[1]["index"], 1);
    assert_eq!(items[1]["id"], first["message"]["tool_calls"][1]["id"]);
    assert_eq!(
        items[0]["function"],
        first["message"]["tool_calls"][0]["function"]
    );
    assert!(reply.called(0) && !reply.called(1));
}

#[test]
fn mistral_calls_get_the_nine_character_ids_its_templates_ask_for() {
    use super::tool_reply::ToolReply;
    use crate::chat::tools::ToolSyntax;

    let text = "[TOOL_CALLS] [{\"name\": \"w\", \"arguments\": {\"city\": \"Oslo\"}}, {\"name\": \"t\", \"arguments\": {}}]";
    let mut g = generation();
    g.sequences[0].text = text.into();
    g.sequences[1].text = "It is noon.".into();
    for stem in ["chatcmpl-00ab", "chatcmpl-0123456789abcdef"] {
        let reply = ToolReply::new(ToolSyntax::Mistral, stem, 2);
        let mut whole = response::response(CompletionKind::Chat, stem, "m", &g, None);
        reply.rewrite(&mut whole, &g);
        let calls = whole["choices"][0]["message"]["tool_calls"].clone();
        assert_eq!(whole["choices"][0]["finish_reason"], "tool_calls");
        assert!(whole["choices"][0]["message"]["content"].is_null());
        let ids: Vec<&str> = calls
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids.len(), 2);
        assert_ne!(ids[0], ids[1]);
        for id in &ids {
            assert!(
                id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()),
                "{id}"
            );
        }
        assert_eq!(calls[1]["function"]["name"], "t");
        assert_eq!(whole["choices"][1]["message"]["content"], "It is noon.");
    }
}
