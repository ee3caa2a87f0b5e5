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

/// The tool definitions of the tool-calling tests: a city's weather and a sum.
fn two_tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 16},
                "unit": {"enum": ["celsius", "fahrenheit"]}
            }, "required": ["city", "unit"], "additionalProperties": false}
        }},
        {"type": "function", "function": {
            "name": "add",
            "parameters": {"type": "object", "properties": {
                "a": {"type": "integer", "minimum": -99, "maximum": 99},
                "b": {"type": "integer", "minimum": -99, "maximum": 99}
            }, "required": ["a", "b"], "additionalProperties": false}
        }}
    ])
}

/// `arguments` (JSON text) satisfies the parameters of `name` in [`two_tools`].
fn assert_arguments(name: &str, arguments: &str) {
    let tools = two_tools();
    let schema = tools
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["function"]["name"] == name)
        .map(|t| t["function"]["parameters"].clone())
        .unwrap_or_else(|| panic!("a call to an unknown tool `{name}`"));
    let value = json_body(arguments);
    let validator = jsonschema::validator_for(&schema).expect("a schema");
    assert!(validator.is_valid(&value), "{name}({arguments})");
}

/// A Hermes-style template that reads `tools` (short enough for a tiny model's context).
const TOOLS_TEMPLATE: &str = "{% if tools %}Tools:{% for t in tools %} {{ t.function.name }}{% endfor %}\n{% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }}{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }}</tool_call>{% endfor %}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";

/// A call, its results and the final answer, whole and streamed, batched (the default) and
/// one request at a time: the calls are OpenAI-shaped, their arguments satisfy their
/// schemas, and the stream gives the calls the whole answer gives. On the tiny model with a
/// template that reads the tools, and on SmolLM2, whose template does not (the generic form).
#[test]
fn tool_calls_round_trip_whole_and_streamed() {
    let template = std::env::temp_dir().join(format!("emberlm-tools-{}.jinja", std::process::id()));
    std::fs::write(&template, TOOLS_TEMPLATE).expect("a temporary file");
    let template = template.to_string_lossy().to_string();
    // the tiny Qwen 2: 256 positions, room for calls and their answer
    let model = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/tiny-qwen2-f32.gguf"
    );
    for extra in [&[][..], &["--parallel", "1"][..]] {
        let mut args = vec!["--chat-template", template.as_str()];
        args.extend(extra);
        round_trip(&serve::start_model(model, &args), 180);
    }
    if let Some(model) = crate::common::require::smollm2() {
        round_trip(
            &serve::start_model(model.to_str().unwrap_or_default(), &[]),
            200,
        );
    }
}

/// Asks for calls (`required`, then a named function), streamed and whole, and sends results
/// back; each answer at most `max_tokens`.
fn round_trip(server: &serve::Server, max_tokens: u32) {
    let mut messages = vec![json!({"role": "user", "content": "Weather in Oslo, and 2+3?"})];
    let request = json!({
        "messages": messages, "tools": two_tools(), "tool_choice": "required",
        "seed": 11, "max_tokens": max_tokens
    });
    let (status, body) = http(server, "POST", "/v1/chat/completions", &request.to_string());
    assert_eq!(status, 200, "{body}");
    let r = json_body(&body);
    let choice = &r["choices"][0];
    let calls = choice["message"]["tool_calls"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(!calls.is_empty(), "{body}");
    if choice["finish_reason"] != "length" {
        assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
    }
    for call in &calls {
        assert_eq!(call["type"], "function");
        assert!(call["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("call_")));
        let f = &call["function"];
        assert_arguments(
            f["name"].as_str().unwrap_or(""),
            f["arguments"].as_str().unwrap_or(""),
        );
    }

    // the same request streamed: the same calls, as delta.tool_calls items
    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let (status, body) = http(
        server,
        "POST",
        "/v1/chat/completions",
        &streamed.to_string(),
    );
    assert_eq!(status, 200, "{body}");
    let chunks: Vec<Value> = body
        .split("\n\n")
        .filter_map(|f| f.strip_prefix("data: "))
        .filter(|f| *f != "[DONE]")
        .map(json_body)
        .collect();
    let items: Vec<Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .cloned()
        .collect();
    assert_eq!(items.len(), calls.len(), "{body}");
    for (k, (item, call)) in items.iter().zip(&calls).enumerate() {
        assert_eq!(item["index"], k);
        assert_eq!(item["function"], call["function"]);
    }
    let last = chunks
        .iter()
        .rev()
        .find_map(|c| c["choices"][0]["finish_reason"].as_str());
    assert_eq!(last, choice["finish_reason"].as_str(), "{body}");

    // the results go back and the model answers in text
    messages.push(json!({"role": "assistant", "content": null, "tool_calls": calls}));
    for call in &calls {
        messages.push(json!({"role": "tool", "tool_call_id": call["id"], "content": "42"}));
    }
    let request = json!({
        "messages": messages, "tools": two_tools(), "tool_choice": "none",
        "seed": 11, "max_tokens": 8
    });
    let (status, body) = http(server, "POST", "/v1/chat/completions", &request.to_string());
    assert_eq!(status, 200, "{body}");
    let answer = &json_body(&body)["choices"][0];
    assert!(answer["message"]["content"].is_string(), "{body}");
    assert!(answer["message"].get("tool_calls").is_none(), "{body}");

    // a named function is called once
    let request = json!({
        "messages": [{"role": "user", "content": "Sum"}], "tools": two_tools(),
        "tool_choice": {"type": "function", "function": {"name": "add"}},
        "max_tokens": max_tokens, "temperature": 0
    });
    let (status, body) = http(server, "POST", "/v1/chat/completions", &request.to_string());
    assert_eq!(status, 200, "{body}");
    let calls = &json_body(&body)["choices"][0]["message"]["tool_calls"];
    assert_eq!(calls.as_array().map(Vec::len), Some(1), "{body}");
    assert_eq!(calls[0]["function"]["name"], "add");
}

#[test]
fn bad_tool_definitions_get_400_naming_the_tool() {
    let server = start(&[]);
    let tool = |name: &str, parameters: Value| json!({"type": "function", "function": {"name": name, "parameters": parameters}});
    let object = json!({"type": "object"});
    let broken = json!({"type": "object", "properties": {"x": {"$ref": "#/missing"}}});
    let cases = [
        (
            json!([tool("f", object.clone()), tool("f", object.clone())]),
            "`f`",
        ),
        (
            json!([tool("ok", object.clone()), tool("broken", broken)]),
            "tools[1] (`broken`)",
        ),
        (json!([tool("f g", object)]), "`f g`"),
    ];
    for (tools, want) in cases {
        let request = json!({"messages": [{"role": "user", "content": "x"}], "tools": tools, "max_tokens": 4});
        let (status, body) = http(
            &server,
            "POST",
            "/v1/chat/completions",
            &request.to_string(),
        );
        assert_eq!(status, 400, "{body}");
        let message = json_body(&body)["error"]["message"]
            .as_str()
            .unwrap_or("")
            .to_string();
        assert!(message.contains(want), "{want}: {body}");
    }
}
