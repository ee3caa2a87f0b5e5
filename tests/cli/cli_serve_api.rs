//! `emberlm serve-api` over HTTP on loopback, on a tiny fixture and the CPU backend: the models
//! list, chat and plain completions (whole and streamed as server-sent events), a response
//! format, and the errors (bad JSON, unknown fields, a body over the limit, unknown paths).
//! The queue, load and hostile requests are in tests/cli/cli_serve_load.rs.

#![cfg(not(target_arch = "wasm32"))]

use crate::serve;

use serde_json::{json, Value};
use serve::{http, json_body, start};

#[test]
fn completions_answer_in_the_openai_shape() {
    let server = start(&[]);
    let (status, body) = http(&server, "GET", "/v1/models", "");
    assert_eq!(status, 200, "{body}");
    assert_eq!(json_body(&body)["data"][0]["object"], "model");

    let request = json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": "Give a number"}],
        "max_tokens": 40,
        "seed": 3,
        "n": 2,
        "logprobs": true,
        "top_logprobs": 2,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {
            "type": "object",
            "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999}},
            "required": ["n"], "additionalProperties": false
        }}}
    });
    let (status, body) = http(
        &server,
        "POST",
        "/v1/chat/completions",
        &request.to_string(),
    );
    assert_eq!(status, 200, "{body}");
    let r = json_body(&body);
    assert_eq!(r["object"], "chat.completion");
    assert_eq!(r["model"], "tiny");
    assert!(r["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("chatcmpl-")));
    assert_eq!(r["choices"].as_array().map(Vec::len), Some(2));
    for choice in r["choices"].as_array().into_iter().flatten() {
        assert_eq!(choice["message"]["role"], "assistant");
        assert_eq!(choice["finish_reason"], "stop", "{choice}");
        let content = choice["message"]["content"].as_str().expect("content");
        let value = json_body(content);
        assert!(value["n"].as_u64().is_some_and(|n| n <= 999), "{content}");
        let tokens = choice["logprobs"]["content"].as_array().expect("logprobs");
        assert!(!tokens.is_empty());
        assert!(tokens
            .iter()
            .all(|t| t["logprob"].as_f64().is_some_and(|l| l <= 0.0)));
        for t in tokens {
            // the model's two likeliest tokens, whatever the format allowed
            let top = t["top_logprobs"].as_array().expect("top_logprobs");
            let lp: Vec<f64> = top.iter().filter_map(|a| a["logprob"].as_f64()).collect();
            assert!(lp.len() == 2 && lp[0] >= lp[1] && lp[0] <= 0.0, "{t}");
            assert!(top
                .iter()
                .all(|a| a["token"].is_string() && a["bytes"].is_array()));
        }
    }
    let usage = &r["usage"];
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(
            usage["prompt_tokens"].as_u64().unwrap_or(0)
                + usage["completion_tokens"].as_u64().unwrap_or(0)
        )
    );

    let request = json!({"prompt": "Once", "max_tokens": 5, "temperature": 0, "logprobs": 3});
    let (status, body) = http(&server, "POST", "/v1/completions", &request.to_string());
    assert_eq!(status, 200, "{body}");
    let r = json_body(&body);
    assert_eq!(r["object"], "text_completion");
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    assert_eq!(r["usage"]["completion_tokens"], 5);
    let lp = &r["choices"][0]["logprobs"];
    let top = lp["top_logprobs"].as_array().expect("top_logprobs");
    assert_eq!(top.len(), 5, "{lp}");
    for (i, alternatives) in top.iter().enumerate() {
        let m = alternatives.as_object().expect("an object per position");
        assert!((1..=3).contains(&m.len()), "{lp}");
        // greedy: the drawn token is the likeliest
        let best = m
            .values()
            .filter_map(Value::as_f64)
            .fold(f64::MIN, f64::max);
        let own = lp["token_logprobs"][i].as_f64().unwrap_or(0.0);
        assert!((best - own).abs() < 1e-5, "{lp}");
    }
}

#[test]
fn streams_are_server_sent_events_ending_with_done() {
    let server = start(&[]);
    let request = json!({
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 6,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true}
    });
    let (status, body) = http(
        &server,
        "POST",
        "/v1/chat/completions",
        &request.to_string(),
    );
    assert_eq!(status, 200, "{body}");
    let frames: Vec<&str> = body
        .split("\n\n")
        .filter_map(|f| f.strip_prefix("data: "))
        .collect();
    assert_eq!(frames.last(), Some(&"[DONE]"), "{body}");
    let chunks: Vec<Value> = frames[..frames.len() - 1]
        .iter()
        .map(|f| json_body(f))
        .collect();
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    let finish = &chunks[chunks.len() - 2]["choices"][0]["finish_reason"];
    assert_eq!(finish, "length", "{body}");
    assert_eq!(chunks[chunks.len() - 1]["usage"]["completion_tokens"], 6);
    // the same request unstreamed gives the same text
    let mut whole = request.clone();
    whole["stream"] = json!(false);
    whole.as_object_mut().map(|m| m.remove("stream_options"));
    let (_, body) = http(&server, "POST", "/v1/chat/completions", &whole.to_string());
    assert_eq!(
        json_body(&body)["choices"][0]["message"]["content"],
        text.as_str()
    );
}

#[test]
fn bad_requests_get_errors_that_name_the_problem() {
    let server = start(&["--max-body", "2000"]);
    let cases = [
        ("POST", "/v1/chat/completions", "{".to_string(), 400, "not valid JSON"),
        (
            "POST",
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "temprature": 1}).to_string(),
            400,
            "unknown field `temprature`",
        ),
        (
            "POST",
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "regex", "regex": "[0-"}}).to_string(),
            400,
            "regex",
        ),
        ("POST", "/v1/completions", format!("{{\"prompt\": \"{}\"}}", "a".repeat(3000)), 413, "limit of 2000 bytes"),
        ("GET", "/v1/engines", String::new(), 404, "no endpoint /v1/engines"),
        ("GET", "/v1/chat/completions", String::new(), 405, "not allowed"),
    ];
    for (method, path, body, want_status, want) in cases {
        let (status, answer) = http(&server, method, path, &body);
        assert_eq!(status, want_status, "{method} {path}: {answer}");
        let message = json_body(&answer)["error"]["message"]
            .as_str()
            .unwrap_or("")
            .to_string();
        assert!(message.contains(want), "{method} {path}: {message}");
    }
}
