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

/// A request of `method` on `path` with the extra header lines `headers` (each ending in CRLF)
/// and `body`.
fn with_headers(
    server: &serve::Server,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> serve::Reply {
    let text = format!(
        "{method} {path} HTTP/1.1\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    serve::exchange_raw(&server.address, &text)
}

const PROMPT: &str = r#"{"prompt": "The", "max_tokens": 2}"#;

/// With keys, every endpoint needs `Authorization: Bearer KEY` with one of them (from
/// `--api-key`, repeated, or `--api-key-file`); 401 in OpenAI's error shape otherwise.
#[test]
fn api_keys_are_required_once_given() {
    let dir = std::env::temp_dir().join(format!("emberlm-api-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("keys");
    std::fs::write(&file, "# the team's key\n\nfrom-file\n").unwrap();
    let server = start(&[
        "--api-key",
        "first",
        "--api-key",
        "second",
        "--api-key-file",
        file.to_str().unwrap(),
    ]);
    let host = format!("Host: {}\r\n", server.address);
    for (auth, want) in [
        ("", 401),
        ("Authorization: Bearer wrong\r\n", 401),
        ("Authorization: Basic first\r\n", 401),
        ("Authorization: Bearer first\r\n", 200),
        ("Authorization: Bearer second\r\n", 200),
        ("Authorization: Bearer from-file\r\n", 200),
    ] {
        let reply = with_headers(&server, "GET", "/v1/models", &format!("{host}{auth}"), "");
        assert_eq!(reply.status, want, "{auth:?}: {}", reply.body);
        if want == 401 {
            let error = &json_body(&reply.body)["error"];
            assert_eq!(error["code"], "invalid_api_key", "{error}");
            assert_eq!(error["type"], "invalid_request_error", "{error}");
            assert!(
                reply.head.contains("www-authenticate: bearer"),
                "{}",
                reply.head
            );
        }
    }
    let reply = with_headers(&server, "POST", "/v1/completions", &host, PROMPT);
    assert_eq!(reply.status, 401, "{}", reply.body);
    assert!(
        reply.body.contains("Authorization: Bearer KEY"),
        "{}",
        reply.body
    );
    let auth = format!("{host}Authorization: Bearer second\r\n");
    let reply = with_headers(&server, "POST", "/v1/completions", &auth, PROMPT);
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(json_body(&reply.body)["object"], "text_completion");
    drop(server);
    std::fs::remove_dir_all(&dir).ok();
}

/// Requests must name the server by an IP address, `localhost` or an `--allowed-host` (421
/// otherwise, against DNS rebinding); browser requests from pages not allowed with
/// `--cors-origin` are refused before they run (403), allowed ones get CORS answers and
/// preflights.
#[test]
fn hosts_and_page_origins_are_checked() {
    let server = start(&[
        "--allowed-host",
        "llm.lan",
        "--cors-origin",
        "http://app.example:5173",
    ]);
    for (host, want) in [
        ("Host: evil.example\r\n", 421),
        ("Host: evil.example:8080\r\n", 421),
        ("", 400),
        ("Host: localhost:8080\r\n", 200),
        ("Host: LLM.lan:8080\r\n", 200),
        ("Host: [::1]:8080\r\n", 200),
        ("Host: 127.0.0.1\r\n", 200),
    ] {
        let reply = with_headers(&server, "GET", "/v1/models", host, "");
        assert_eq!(reply.status, want, "{host:?}: {}", reply.body);
    }
    // a rebinding page's completion is refused, not run
    let reply = with_headers(
        &server,
        "POST",
        "/v1/completions",
        "Host: evil.example\r\n",
        PROMPT,
    );
    assert_eq!(reply.status, 421, "{}", reply.body);
    assert!(
        reply.body.contains("--allowed-host evil.example"),
        "{}",
        reply.body
    );

    let host = format!("Host: {}\r\n", server.address);
    // a page the server does not know: refused before it runs, with how to allow it
    let evil = format!("{host}Origin: https://evil.example\r\n");
    let reply = with_headers(&server, "POST", "/v1/completions", &evil, PROMPT);
    assert_eq!(reply.status, 403, "{}", reply.body);
    assert!(
        reply.body.contains("--cors-origin https://evil.example"),
        "{}",
        reply.body
    );
    assert!(
        !reply.head.contains("access-control-allow-origin"),
        "{}",
        reply.head
    );
    let preflight = format!("{evil}Access-Control-Request-Method: POST\r\n");
    assert_eq!(
        with_headers(&server, "OPTIONS", "/v1/completions", &preflight, "").status,
        403
    );
    // the allowed page: a preflight, then its request with the CORS answer
    let app = format!("{host}Origin: http://app.example:5173\r\n");
    let preflight = format!(
        "{app}Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: content-type\r\n"
    );
    let reply = with_headers(&server, "OPTIONS", "/v1/chat/completions", &preflight, "");
    assert_eq!(reply.status, 204, "{}", reply.body);
    for header in [
        "access-control-allow-origin: http://app.example:5173",
        "access-control-allow-methods: get, post, options",
        "access-control-allow-headers: authorization, content-type",
        "vary: origin",
    ] {
        assert!(reply.head.contains(header), "{header}: {}", reply.head);
    }
    let reply = with_headers(&server, "POST", "/v1/completions", &app, PROMPT);
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(
        reply
            .head
            .contains("access-control-allow-origin: http://app.example:5173"),
        "{}",
        reply.head
    );
    // streamed answers carry it too
    let stream = r#"{"prompt": "The", "max_tokens": 2, "stream": true}"#;
    let reply = with_headers(&server, "POST", "/v1/completions", &app, stream);
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(
        reply.head.contains("access-control-allow-origin"),
        "{}",
        reply.head
    );
    assert!(reply.body.ends_with("data: [DONE]\n\n"), "{}", reply.body);
}

/// Listening beyond loopback without a key says what that exposes; bad access settings are
/// refused by name before the model loads.
#[test]
fn an_open_address_without_a_key_is_warned_about_and_bad_settings_are_named() {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_emberlm"))
        .args([
            "serve-api",
            "--device",
            "cpu",
            "--port",
            "0",
            "--host",
            "0.0.0.0",
        ])
        .arg("--model")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/tiny-llama-f32.gguf"
        ))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert!(line.contains("http://0.0.0.0:"), "{line}");
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .contains("without an API key: anyone who can reach this address can run completions"),
        "{stderr}"
    );
    for (args, named) in [
        (vec!["--cors-origin", "app.example"], "cors-origin"),
        (vec!["--api-key", " "], "api-key"),
        (
            vec!["--api-key-file", "/nonexistent/keys"],
            "--api-key-file /nonexistent/keys",
        ),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_emberlm"))
            .args(["serve-api", "--device", "cpu", "--port", "0"])
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(named),
            "{args:?}: {stderr}"
        );
    }
}

/// `GET /health` until `abandoned` reaches `want` (failing after a minute): the server's
/// count of completions stopped because their client went away.
fn wait_abandoned(server: &serve::Server, want: u64) -> Value {
    let start = std::time::Instant::now();
    loop {
        let (status, body) = http(server, "GET", "/health", "");
        assert_eq!(status, 200, "{body}");
        let health = json_body(&body);
        if health["abandoned"].as_u64() >= Some(want) {
            return health;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "the generation went on after its client left: {health}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// A completion whose client goes away stops at the next token, streamed or not (SmolLM2 asked
/// for 1,500 tokens with its end-of-text tokens banned, so that it is still running when the
/// client leaves); `/health` counts them, needs no key, and the server goes on answering.
#[test]
fn a_completion_stops_when_its_client_goes() {
    use std::io::{Read, Write};
    let Some(model) = crate::common::require::smollm2() else {
        return;
    };
    let server = serve::start_model(model.to_str().unwrap(), &["--api-key", "k"]);
    let health = wait_abandoned(&server, 0);
    assert_eq!(
        (health["status"].as_str(), health["requests"].as_u64()),
        (Some("ok"), Some(0))
    );
    let long = |stream: bool| {
        json!({
            "prompt": "Once upon a time",
            "max_tokens": 1500,
            "logit_bias": {"0": -100, "1": -100, "2": -100},
            "stream": stream,
        })
        .to_string()
    };
    for (stream, want) in [(false, 1), (true, 2)] {
        let body = long(stream);
        let text = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer k\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            server.address,
            body.len()
        );
        let mut tcp = std::net::TcpStream::connect(&server.address).expect("connect");
        tcp.write_all(text.as_bytes()).expect("send");
        if stream {
            // the first event has come: the generation runs
            let mut first = [0u8; 256];
            let n = tcp.read(&mut first).expect("the stream starts");
            assert!(String::from_utf8_lossy(&first[..n]).contains("200 OK"));
        } else {
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
        drop(tcp);
        wait_abandoned(&server, want);
    }
    // the engine is free again
    let reply = with_headers(
        &server,
        "POST",
        "/v1/completions",
        &format!("Host: {}\r\nAuthorization: Bearer k\r\n", server.address),
        PROMPT,
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
}
