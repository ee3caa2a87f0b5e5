//! `emberlm serve-api --parallel N`: completions of several clients decoded together, each
//! answer exactly what the request gets alone (`--parallel 1`, which runs one request at a time
//! through the single-sequence path); `/health` reports the sequences decoding together; bad
//! and oversized `--parallel` values are named.

#![cfg(not(target_arch = "wasm32"))]

use crate::serve;

use std::io::Read;
use std::process::Stdio;
use std::sync::{Arc, Barrier};

use serde_json::{json, Value};
use serve::{http, json_body};

const MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/tiny-llama-256-f32.gguf"
);

/// The requests: greedy ones of different lengths (one streamed, one chat), a seeded sample
/// with two choices, and one with a stop string; end-of-text banned so that each runs its
/// length and they overlap.
fn requests() -> Vec<(&'static str, Value)> {
    let no_eos = json!({"0": -100});
    vec![
        (
            "/v1/completions",
            json!({"prompt": "The license", "max_tokens": 90, "temperature": 0, "logit_bias": no_eos}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "Permission is hereby granted, free of charge, to any person", "max_tokens": 60,
                   "temperature": 0, "logit_bias": no_eos, "stream": true}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Redistribution"}], "max_tokens": 70,
                   "temperature": 0, "logit_bias": no_eos}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "THE SOFTWARE IS PROVIDED", "max_tokens": 80, "temperature": 0.9,
                   "seed": 7, "n": 2, "logit_bias": no_eos}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "Copyright", "max_tokens": 90, "temperature": 0, "stop": ["e"],
                   "logit_bias": no_eos}),
        ),
    ]
}

/// What an answer says, without its ids and times: each choice's text and finish reason, and
/// the token counts.
fn essence(body: &str, streamed: bool) -> Value {
    if !streamed {
        let v = json_body(body);
        let choices: Vec<Value> = v["choices"]
            .as_array()
            .unwrap_or_else(|| panic!("no choices in {body}"))
            .iter()
            .map(|c| {
                let text = c["text"].as_str().or(c["message"]["content"].as_str());
                json!({"text": text, "finish": c["finish_reason"]})
            })
            .collect();
        return json!({"choices": choices, "completion_tokens": v["usage"]["completion_tokens"]});
    }
    let frames: Vec<&str> = body
        .split("\n\n")
        .filter_map(|f| f.strip_prefix("data: "))
        .collect();
    assert_eq!(frames.last(), Some(&"[DONE]"), "{body}");
    let mut text = String::new();
    let mut finish = Value::Null;
    for f in &frames[..frames.len() - 1] {
        let c = &json_body(f)["choices"][0];
        text.push_str(c["text"].as_str().unwrap_or(""));
        if !c["finish_reason"].is_null() {
            finish = c["finish_reason"].clone();
        }
    }
    json!({"choices": [{"text": text, "finish": finish}]})
}

fn ask(server: &serve::Server, path: &str, body: &Value) -> Value {
    let (status, reply) = http(server, "POST", path, &body.to_string());
    assert_eq!(status, 200, "{reply}");
    essence(&reply, body["stream"] == json!(true))
}

/// Every request of [`requests`] sent at once, each from its own thread released by one
/// barrier; the answers' essences in the requests' order.
fn all_at_once(server: &serve::Server) -> Vec<Value> {
    let address = Arc::new(server.address.clone());
    let start = Arc::new(Barrier::new(requests().len()));
    let clients: Vec<_> = requests()
        .into_iter()
        .map(|(path, body)| {
            let (start, address) = (Arc::clone(&start), Arc::clone(&address));
            std::thread::spawn(move || {
                start.wait();
                let reply = serve::exchange(&address, "POST", path, &body.to_string());
                assert_eq!(reply.status, 200, "{}", reply.body);
                essence(&reply.body, body["stream"] == json!(true))
            })
        })
        .collect();
    clients
        .into_iter()
        .map(|c| c.join().expect("a client"))
        .collect()
}

/// Five clients at once on `--parallel 3`: every answer is the one `--parallel 1` gives the
/// request alone (greedy and seeded sampling alike), the engine decoded more than one sequence
/// in a step (`/health`), and the server is idle and answering afterwards.
#[test]
fn parallel_answers_are_each_what_the_request_gets_alone() {
    let alone = serve::start_model(MODEL, &["--parallel", "1"]);
    let want: Vec<Value> = requests()
        .iter()
        .map(|(path, body)| ask(&alone, path, body))
        .collect();
    drop(alone);
    for w in &want {
        assert!(
            w["choices"][0]["text"]
                .as_str()
                .is_some_and(|t| !t.is_empty()),
            "{w}"
        );
    }

    let server = serve::start_model(MODEL, &["--parallel", "3"]);
    let health = json_body(&http(&server, "GET", "/health", "").1);
    assert_eq!(health["parallel"], json!(3), "{health}");
    // Whether the clients overlap in the engine depends on the machine's scheduling (a tiny
    // model answers in milliseconds): each round checks every answer, and rounds repeat, a few
    // at most, until the engine has decoded more than one sequence in a step.
    let mut health = Value::Null;
    for _round in 0..6 {
        for (i, got) in all_at_once(&server).into_iter().enumerate() {
            assert_eq!(&got, &want[i], "request {i}: not the answer it gets alone");
        }
        health = json_body(&http(&server, "GET", "/health", "").1);
        if health["decoding_peak"].as_u64() >= Some(2) {
            break;
        }
    }
    assert!(
        health["decoding_peak"].as_u64() >= Some(2),
        "the requests were not decoded together in six rounds: {health}"
    );
    assert!(health["decoding_peak"].as_u64() <= Some(3), "{health}");
    // the last answer is written just before its place frees: idle within moments
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while (health["decoding"].as_u64(), health["requests"].as_u64()) != (Some(0), Some(0))
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
        health = json_body(&http(&server, "GET", "/health", "").1);
    }
    assert_eq!(
        (health["decoding"].as_u64(), health["requests"].as_u64()),
        (Some(0), Some(0)),
        "{health}"
    );
    // one more, alone in the batch, is still its own answer
    assert_eq!(ask(&server, requests()[0].0, &requests()[0].1), want[0]);
}

/// `--parallel 0` is refused naming the option; a `--parallel` larger than the KV cache holds
/// is lowered to what fits, with a warning that says so.
#[test]
fn parallel_values_are_checked() {
    let out = serve::command(MODEL, &["--parallel", "0"])
        .output()
        .expect("the binary runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--parallel must be at least 1"), "{stderr}");

    let mut server = serve::start_with(MODEL, &["--parallel", "100000"], Stdio::piped());
    let health = json_body(&http(&server, "GET", "/health", "").1);
    let fitted = health["parallel"].as_u64().expect("a number");
    assert!((1..100_000).contains(&fitted), "{health}");
    let mut stderr = server.child.stderr.take().expect("stderr");
    let _ = server.child.kill();
    let mut text = String::new();
    stderr.read_to_string(&mut text).expect("stderr");
    assert!(
        text.contains(&format!(
            "--parallel 100000: the KV cache holds {fitted} sequences"
        )),
        "{text}"
    );
}
