//! `emberlm serve-api` under load and hostile requests, on a tiny fixture and the CPU backend:
//! 32 clients at once, a full queue refusing with 503 and `Retry-After`, a body declared far
//! past the limit, heads that are not HTTP or too large, chunked bodies.

#![cfg(not(target_arch = "wasm32"))]

use crate::serve;

use std::io::{Read, Write};
use std::net::TcpStream;

use serde_json::json;
use serve::{exchange, exchange_raw, http, json_body, read_reply, request_text, start};

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

/// With every place taken (two slow clients still sending their bodies, `--max-queue 1` and
/// one running at a time), a request is refused at once with 503 and a `Retry-After`; the slow
/// ones are answered once their bodies arrive.
#[test]
fn a_full_queue_refuses_with_retry_after() {
    let server = start(&["--max-queue", "1", "--parallel", "1"]);
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
    let head = "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100000000000\r\n\r\n{\"prompt\": \"a\"}";
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
    let chunked =
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    assert_eq!(exchange_raw(&server.address, chunked).status, 411);
}
