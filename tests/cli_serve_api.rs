//! `emberlm serve-api` over HTTP on loopback, on a tiny fixture and the CPU backend: the models
//! list, chat and plain completions (whole and streamed as server-sent events), a response
//! format, and the errors (bad JSON, unknown fields, a body over the limit, unknown paths).

#![cfg(not(target_arch = "wasm32"))]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};

/// The server process, killed when dropped.
struct Server {
    child: Child,
    address: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the server on the tiny Llama, or on `EMBERLM_SERVE_TEST_MODEL` when set (the load
/// figures in bench/NOTES.md use SmolLM2 that way).
fn start(extra: &[&str]) -> Server {
    let model = std::env::var("EMBERLM_SERVE_TEST_MODEL").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/tiny-llama-f32.gguf"
        )
        .to_string()
    });
    let mut child = Command::new(env!("CARGO_BIN_EXE_emberlm"))
        .args([
            "serve-api",
            "--device",
            "cpu",
            "--port",
            "0",
            "--model",
            &model,
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the binary runs");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("a line");
    let address = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    Server { child, address }
}

/// One HTTP/1.1 exchange: (status, body).
fn http(server: &Server, method: &str, path: &str, body: &str) -> (u16, String) {
    let reply = exchange(&server.address, method, path, body);
    (reply.status, reply.body)
}

/// A whole answer: its status, head (lowercased) and body (dechunked).
struct Reply {
    status: u16,
    head: String,
    body: String,
}

fn request_text(address: &str, method: &str, path: &str, body: &str) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn exchange(address: &str, method: &str, path: &str, body: &str) -> Reply {
    let mut stream = TcpStream::connect(address).expect("connect");
    stream
        .write_all(request_text(address, method, path, body).as_bytes())
        .expect("send");
    read_reply(stream)
}

fn read_reply(mut stream: TcpStream) -> Reply {
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("receive");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let head = head.to_ascii_lowercase();
    let body = match head.contains("transfer-encoding: chunked") {
        true => dechunk(body),
        false => body.to_string(),
    };
    Reply { status, head, body }
}

/// The payload of a chunked body; it must end with the empty chunk.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").expect("a chunk size line");
        let size = usize::from_str_radix(size.trim(), 16).expect("a hex chunk size");
        if size == 0 {
            return out;
        }
        out.push_str(&rest[..size]);
        body = rest[size..]
            .strip_prefix("\r\n")
            .expect("CRLF after a chunk");
    }
}

fn json_body(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{body:?}: {e}"))
}

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

/// The `text` of a completion: the whole answer's, or a stream's pieces when it ended with
/// `[DONE]` (`None` otherwise).
fn completion_text(body: &str, streamed: bool) -> Option<String> {
    if !streamed {
        return json_body(body)["choices"][0]["text"]
            .as_str()
            .map(str::to_string);
    }
    let frames: Vec<&str> = body
        .split("\n\n")
        .filter_map(|f| f.strip_prefix("data: "))
        .collect();
    let (last, chunks) = frames.split_last()?;
    (*last == "[DONE]").then(|| {
        chunks
            .iter()
            .filter_map(|f| {
                json_body(f)["choices"][0]["text"]
                    .as_str()
                    .map(str::to_string)
            })
            .collect()
    })
}

/// A greedy plain completion's body, padded with JSON whitespace to `pad_to` bytes.
fn completion_body(prompt: &str, stream: bool, pad_to: usize) -> String {
    let mut body =
        json!({"prompt": prompt, "max_tokens": 12, "temperature": 0, "stream": stream}).to_string();
    while body.len() < pad_to {
        body.push(' ');
    }
    body
}

/// Resident and peak resident memory of a process, KiB (Linux).
fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// How one request of the load test ended.
enum Outcome {
    /// 200 and the whole text, after so many milliseconds.
    Answered(String, f64),
    /// 503 with a `Retry-After` of so many seconds.
    Busy(u64),
    /// The client closed its stream after the first event.
    Closed,
}

const LOAD_PROMPTS: [&str; 4] = [
    "The software is provided",
    "Permission is hereby granted",
    "you may not use this file",
    "Redistribution and use",
];

/// One request, retried after each 503 as its `Retry-After` says, at most `tries` times: the
/// outcome and how many 503s it met.
fn load_with_retries(
    address: &str,
    prompt: &str,
    stream: bool,
    close_early: bool,
    tries: usize,
) -> (Outcome, usize) {
    let mut refusals = 0;
    loop {
        match load_request(address, prompt, stream, close_early) {
            Outcome::Busy(wait) if refusals + 1 < tries => {
                refusals += 1;
                std::thread::sleep(std::time::Duration::from_secs(wait));
            }
            Outcome::Busy(wait) => return (Outcome::Busy(wait), refusals + 1),
            outcome => return (outcome, refusals),
        }
    }
}

/// One request: plain or streamed, closed after the first event or read whole.
fn load_request(address: &str, prompt: &str, stream: bool, close_early: bool) -> Outcome {
    let started = std::time::Instant::now();
    let body = completion_body(prompt, stream, 0);
    let mut tcp = TcpStream::connect(address).expect("connect");
    tcp.write_all(request_text(address, "POST", "/v1/completions", &body).as_bytes())
        .expect("send");
    if close_early {
        let mut seen = Vec::new();
        let mut buf = [0u8; 512];
        while !String::from_utf8_lossy(&seen).contains("data: ") {
            match tcp.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
        let text = String::from_utf8_lossy(&seen);
        if text.starts_with("HTTP/1.1 503") {
            return Outcome::Busy(1);
        }
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        return Outcome::Closed;
    }
    let reply = read_reply(tcp);
    match reply.status {
        200 => {
            let text = completion_text(&reply.body, stream)
                .unwrap_or_else(|| panic!("an incomplete answer: {}", reply.body));
            Outcome::Answered(text, started.elapsed().as_secs_f64() * 1e3)
        }
        503 => {
            let wait = reply
                .head
                .lines()
                .find_map(|l| l.strip_prefix("retry-after: "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("503 without Retry-After: {}", reply.head));
            let message = json_body(&reply.body)["error"]["message"]
                .as_str()
                .unwrap_or("")
                .to_string();
            assert!(message.contains("--max-queue 8"), "{message}");
            Outcome::Busy(wait)
        }
        s => panic!("status {s}: {}", reply.body),
    }
}

/// 32 clients × 4 requests at once, half streamed and a quarter of the streams closed after
/// their first event, with bodies at the limit and one past it: every request gets its whole,
/// uninterleaved answer (the greedy text of its prompt alone) or a 503 with `Retry-After`
/// (after which the client waits as told and tries again, up to 4 times); the server answers
/// afterwards, and its memory stays within a margin of what it was.
#[test]
fn holds_32_clients_under_load() {
    let limit = 16 << 10;
    let server = start(&["--max-queue", "8", "--max-body", &limit.to_string()]);
    let address = server.address.clone();
    let want: Vec<String> = LOAD_PROMPTS
        .iter()
        .map(|p| {
            let (status, body) = http(
                &server,
                "POST",
                "/v1/completions",
                &completion_body(p, false, 0),
            );
            assert_eq!(status, 200, "{body}");
            completion_text(&body, false).expect("a text")
        })
        .collect();
    // a body of exactly the limit is answered, one byte more is refused
    let at_limit = completion_body(LOAD_PROMPTS[0], false, limit);
    let (status, body) = http(&server, "POST", "/v1/completions", &at_limit);
    assert_eq!(
        (status, completion_text(&body, false)),
        (200, Some(want[0].clone()))
    );
    let over = completion_body(LOAD_PROMPTS[0], false, limit + 1);
    let (status, body) = http(&server, "POST", "/v1/completions", &over);
    assert_eq!(status, 413, "{body}");
    let (rss_before, _) = memory_kib(server.child.id());

    let clients: Vec<_> = (0..32)
        .map(|c| {
            let address = address.clone();
            std::thread::spawn(move || {
                (0..4)
                    .map(|j| {
                        let p = (c + j) % LOAD_PROMPTS.len();
                        let stream = (c + j) % 2 == 1;
                        let close_early = stream && c % 4 == 1;
                        let (outcome, refusals) =
                            load_with_retries(&address, LOAD_PROMPTS[p], stream, close_early, 4);
                        (p, outcome, refusals)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let outcomes: Vec<(usize, Outcome, usize)> = clients
        .into_iter()
        .flat_map(|c| c.join().expect("a client"))
        .collect();
    let mut latencies = Vec::new();
    let (mut busy, mut closed) = (0, 0);
    let refusals: usize = outcomes.iter().map(|o| o.2).sum();
    for (p, outcome, _) in &outcomes {
        match outcome {
            Outcome::Answered(text, ms) => {
                assert_eq!(text, &want[*p], "prompt {p}: an answer not its own");
                latencies.push(*ms);
            }
            Outcome::Busy(wait) => {
                assert!(*wait >= 1);
                busy += 1;
            }
            Outcome::Closed => closed += 1,
        }
    }
    assert_eq!(outcomes.len(), 128);
    assert!(!latencies.is_empty(), "nothing was answered");
    // afterwards the server answers, and has not kept what the load brought
    let (status, body) = http(
        &server,
        "POST",
        "/v1/completions",
        &completion_body(LOAD_PROMPTS[1], true, 0),
    );
    assert_eq!(
        (status, completion_text(&body, true)),
        (200, Some(want[1].clone()))
    );
    let (rss_after, peak) = memory_kib(server.child.id());
    assert!(
        rss_after <= rss_before + (64 << 10),
        "resident memory grew from {rss_before} KiB to {rss_after} KiB"
    );
    latencies.sort_by(f64::total_cmp);
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
    eprintln!(
        "serve-api load: 128 requests: {} answered, {closed} closed by the client, {busy} still refused \
         after 4 tries ({refusals} 503s met in all); latency p50 {:.0} ms, p95 {:.0} ms (the last try); \
         resident {rss_before} KiB before, {rss_after} KiB after, peak {peak} KiB",
        latencies.len(),
        at(0.5),
        at(0.95)
    );
}

/// With every place taken (two slow clients still sending their bodies, `--max-queue 1`), a
/// request is refused at once with 503 and a `Retry-After`; the slow ones are answered once
/// their bodies arrive.
#[test]
fn a_full_queue_refuses_with_retry_after() {
    let server = start(&["--max-queue", "1"]);
    // large enough to be sent in two parts
    let body = completion_body(LOAD_PROMPTS[2], false, 8 << 10);
    let text = request_text(&server.address, "POST", "/v1/completions", &body);
    let (first, rest) = text.split_at(text.len() - body.len() / 2);
    let mut slow: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut tcp = TcpStream::connect(&server.address).expect("connect");
            tcp.write_all(first.as_bytes()).expect("send");
            tcp
        })
        .collect();
    // give the server time to read both heads and admit them
    std::thread::sleep(std::time::Duration::from_millis(500));
    let reply = exchange(&server.address, "POST", "/v1/completions", &body);
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert!(reply.head.contains("retry-after: "), "{}", reply.head);
    let message = json_body(&reply.body)["error"]["message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(message.contains("--max-queue 1"), "{message}");
    for tcp in &mut slow {
        tcp.write_all(rest.as_bytes()).expect("send the rest");
    }
    for tcp in slow {
        let reply = read_reply(tcp);
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
}

/// A request that declares a body far past the limit (and past any memory) is refused with
/// 413 without the server reading or reserving it, and the server goes on answering.
#[test]
fn a_huge_declared_body_is_refused_without_reading_it() {
    let server = start(&["--max-body", "1000"]);
    let mut tcp = TcpStream::connect(&server.address).expect("connect");
    let head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000000\r\n\r\n{\"prompt\": \"a\"}";
    tcp.write_all(head.as_bytes()).expect("send");
    let reply = read_reply(tcp);
    assert_eq!(reply.status, 413, "{}", reply.body);
    assert!(reply.body.contains("limit of 1000 bytes"), "{}", reply.body);
    let (status, body) = http(&server, "GET", "/v1/models", "");
    assert_eq!(status, 200, "the server stopped answering: {body}");
    // a head that is not HTTP gets 400, one past the head limit 431
    let reply = exchange_raw(&server.address, "HELLO\r\n\r\n");
    assert_eq!(reply.status, 400, "{}", reply.body);
    let long = format!(
        "GET /v1/models HTTP/1.1\r\nX-Long: {}\r\n\r\n",
        "a".repeat(20 << 10)
    );
    assert_eq!(exchange_raw(&server.address, &long).status, 431);
    // a body without a length is refused with 411
    let chunked = "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    assert_eq!(exchange_raw(&server.address, chunked).status, 411);
}

fn exchange_raw(address: &str, text: &str) -> Reply {
    let mut tcp = TcpStream::connect(address).expect("connect");
    tcp.write_all(text.as_bytes()).expect("send");
    read_reply(tcp)
}
