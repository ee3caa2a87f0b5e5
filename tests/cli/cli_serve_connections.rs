//! `emberlm serve-api`'s connections: a completion whose client goes away stops (streamed or
//! not), `/health` counts it; HTTP/1.1 keep-alive carries requests one after another on one
//! connection (pipelined ones too) until the client asks to close.

#![cfg(not(target_arch = "wasm32"))]

use crate::serve;

use serde_json::{json, Value};
use serve::{http, json_body, with_headers, PROMPT};

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

/// HTTP/1.1 keeps the connection: the models list, a completion, a streamed one and the health
/// check one after another on one connection, then two requests pipelined in one write,
/// answered in order; `Connection: close` ends it after its answer, and so does HTTP/1.0.
#[test]
fn a_connection_carries_requests_until_the_client_closes_it() {
    use std::io::{BufReader, Read, Write};
    let server = serve::start(&[]);
    let mut tcp = std::net::TcpStream::connect(&server.address).expect("connect");
    let mut reader = BufReader::new(tcp.try_clone().expect("a second handle"));
    let request = |method: &str, path: &str, body: &str, extra: &str| {
        format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            server.address,
            body.len()
        )
    };
    let streamed = r#"{"prompt": "The", "max_tokens": 2, "stream": true}"#;
    for (method, path, body, want) in [
        ("GET", "/v1/models", "", "\"list\""),
        ("POST", "/v1/completions", PROMPT, "text_completion"),
        ("POST", "/v1/completions", streamed, "data: [DONE]"),
        ("GET", "/health", "", "\"ok\""),
    ] {
        tcp.write_all(request(method, path, body, "").as_bytes())
            .expect("send");
        let reply = serve::read_one(&mut reader);
        assert_eq!(reply.status, 200, "{method} {path}: {}", reply.body);
        assert!(
            reply.head.contains("connection: keep-alive"),
            "{}",
            reply.head
        );
        assert!(reply.body.contains(want), "{method} {path}: {}", reply.body);
    }
    let two =
        request("GET", "/v1/models", "", "") + &request("POST", "/v1/completions", PROMPT, "");
    tcp.write_all(two.as_bytes()).expect("send");
    assert_eq!(
        json_body(&serve::read_one(&mut reader).body)["object"],
        "list"
    );
    assert_eq!(
        json_body(&serve::read_one(&mut reader).body)["object"],
        "text_completion"
    );
    tcp.write_all(request("GET", "/v1/models", "", "Connection: close\r\n").as_bytes())
        .expect("send");
    let last = serve::read_one(&mut reader);
    assert_eq!(last.status, 200, "{}", last.body);
    assert!(last.head.contains("connection: close"), "{}", last.head);
    let mut rest = Vec::new();
    reader.read_to_end(&mut rest).expect("the end");
    assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
    // HTTP/1.0 without keep-alive: the answer, then the end
    let reply = serve::exchange_raw(
        &server.address,
        "GET /v1/models HTTP/1.0\r\nHost: localhost\r\n\r\n",
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(reply.head.contains("connection: close"), "{}", reply.head);
}
