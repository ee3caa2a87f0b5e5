//! `emberlm serve-api` in tests: the server process on a fixture and the CPU backend, and raw
//! HTTP/1.1 exchanges with it (shared by tests/cli/cli_serve_api.rs and tests/cli/cli_serve_load.rs).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

/// The server process, killed when dropped.
pub struct Server {
    /// The process.
    pub child: Child,
    /// `host:port`.
    pub address: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the server on the tiny Llama, or on `EMBERLM_SERVE_TEST_MODEL` when set (the load
/// figures in bench/NOTES.md use SmolLM2 that way).
pub fn start(extra: &[&str]) -> Server {
    let model = std::env::var("EMBERLM_SERVE_TEST_MODEL").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/tiny-llama-f32.gguf"
        )
        .to_string()
    });
    start_model(&model, extra)
}

/// Starts the server on the CPU backend with `model`.
pub fn start_model(model: &str, extra: &[&str]) -> Server {
    start_with(model, extra, Stdio::inherit())
}

/// Starts the server on the CPU backend with `model`, its standard error going to `stderr`
/// (`Stdio::piped()` to read it from `Server::child`).
pub fn start_with(model: &str, extra: &[&str], stderr: Stdio) -> Server {
    let mut child = command(model, extra)
        .stdout(Stdio::piped())
        .stderr(stderr)
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

/// `emberlm serve-api` on the CPU backend with `model`, a free port and `extra`, not started.
pub fn command(model: &str, extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_emberlm"));
    command
        .args([
            "serve-api",
            "--device",
            "cpu",
            "--port",
            "0",
            "--model",
            model,
        ])
        .args(extra);
    command
}

/// One HTTP/1.1 exchange: (status, body).
pub fn http(server: &Server, method: &str, path: &str, body: &str) -> (u16, String) {
    let reply = exchange(&server.address, method, path, body);
    (reply.status, reply.body)
}

/// A whole answer: its status, head (lowercased) and body (dechunked).
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// The head, lowercased.
    pub head: String,
    /// The body, dechunked.
    pub body: String,
}

pub fn request_text(address: &str, method: &str, path: &str, body: &str) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// One exchange of a well-formed request.
pub fn exchange(address: &str, method: &str, path: &str, body: &str) -> Reply {
    exchange_raw(address, &request_text(address, method, path, body))
}

/// One exchange of `text` as sent, well-formed or not.
pub fn exchange_raw(address: &str, text: &str) -> Reply {
    let mut tcp = TcpStream::connect(address).expect("connect");
    tcp.write_all(text.as_bytes()).expect("send");
    read_reply(tcp)
}

pub fn read_reply(mut stream: TcpStream) -> Reply {
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
pub fn dechunk(mut body: &str) -> String {
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

pub fn json_body(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{body:?}: {e}"))
}

/// A request of `method` on `path` with the extra header lines `headers` (each ending in CRLF)
/// and `body`.
pub fn with_headers(server: &Server, method: &str, path: &str, headers: &str, body: &str) -> Reply {
    let text = format!(
        "{method} {path} HTTP/1.1\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    exchange_raw(&server.address, &text)
}

/// A short completion request.
pub const PROMPT: &str = r#"{"prompt": "The", "max_tokens": 2}"#;

/// Reads one answer from a connection that may stay open: the head, then a body of its
/// `Content-Length` or chunks up to the empty one.
pub fn read_one(reader: &mut BufReader<TcpStream>) -> Reply {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        let n = reader.read_line(&mut line).expect("an answer");
        assert!(
            n > 0,
            "the connection closed before an answer; head so far: {head:?}"
        );
        if line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let head = head.to_ascii_lowercase();
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse::<usize>().expect("a length"));
    let body = match length {
        Some(n) => {
            let mut body = vec![0u8; n];
            reader.read_exact(&mut body).expect("the body");
            String::from_utf8(body).expect("UTF-8")
        }
        None => {
            let mut out = String::new();
            loop {
                let mut size = String::new();
                reader.read_line(&mut size).expect("a chunk size");
                let size = usize::from_str_radix(size.trim(), 16).expect("a hex chunk size");
                let mut chunk = vec![0u8; size + 2];
                reader.read_exact(&mut chunk).expect("a chunk");
                if size == 0 {
                    break;
                }
                out.push_str(std::str::from_utf8(&chunk[..size]).expect("UTF-8"));
            }
            out
        }
    };
    Reply { status, head, body }
}
