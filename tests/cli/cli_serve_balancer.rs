//! `emberlm serve-api` behind nginx (Debian's package, `./build.sh setup` puts it under
//! `.cache/nginx/`), with the documented configuration `examples/nginx/emberlm.conf` in front of
//! two servers: streams reach the client while they are generated, requests spread over both,
//! and when one server is killed under load its started streams end without `[DONE]`, the
//! other's finish, its unanswered requests are answered by the other, new requests go to the
//! survivor, and nothing hangs.

#![cfg(not(target_arch = "wasm32"))]

use crate::serve;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use serve::{http, json_body, Server};

/// How long any read may wait: a hang fails the test instead of stalling it.
const PATIENCE: Duration = Duration::from_secs(120);

/// nginx: `EMBERLM_NGINX`, the copy `./build.sh setup` unpacks, or the system's.
fn nginx_binary() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("EMBERLM_NGINX").map(PathBuf::from),
        Some(PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/.cache/nginx/usr/sbin/nginx"
        ))),
        Some(PathBuf::from("/usr/sbin/nginx")),
    ];
    let found = candidates.into_iter().flatten().find(|p| p.is_file());
    if found.is_none() {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "nginx is missing (`./build.sh setup` unpacks Debian's into .cache/nginx/)"
        );
        eprintln!(
            "SKIPPED: nginx is missing (`./build.sh setup` unpacks Debian's into .cache/nginx/)"
        );
    }
    found
}

/// nginx running the example configuration in front of two servers; stopped when dropped.
struct Front {
    child: Child,
    address: String,
    /// nginx's prefix: its configuration, PID file and temporary folders.
    dir: PathBuf,
}

impl Drop for Front {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}

impl Front {
    fn start(nginx: &PathBuf, a: &str, b: &str) -> Front {
        let dir = std::env::temp_dir().join(format!("emberlm-nginx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a folder");
        let example = include_str!("../../examples/nginx/emberlm.conf");
        let address = format!("127.0.0.1:{}", free_port());
        let conf = example
            .replace("127.0.0.1:8081", a)
            .replace("127.0.0.1:8082", b)
            .replace("listen 127.0.0.1:8080", &format!("listen {address}"));
        assert_ne!(conf, example, "the example's addresses were not found");
        let path = dir.join("nginx.conf");
        std::fs::write(&path, conf).expect("write the configuration");
        let child = Command::new(nginx)
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(&path)
            // one process: killing it leaves no worker behind
            .args(["-g", "daemon off; master_process off;"])
            .stdout(Stdio::null())
            .spawn()
            .expect("nginx starts");
        let front = Front {
            child,
            address,
            dir,
        };
        let start = Instant::now();
        while TcpStream::connect(&front.address).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "nginx did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        front
    }
}

/// A completion request through `address`; SmolLM2's end-of-text tokens banned so that it
/// runs its length.
fn send(address: &str, max_tokens: usize, stream: bool) -> TcpStream {
    let body = json!({
        "prompt": "Once upon a time",
        "max_tokens": max_tokens,
        "logit_bias": {"0": -100, "1": -100, "2": -100},
        "stream": stream,
    })
    .to_string();
    let mut tcp = TcpStream::connect(address).expect("connect");
    tcp.set_read_timeout(Some(PATIENCE)).expect("a timeout");
    let text = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(text.as_bytes()).expect("send");
    tcp
}

/// Reads until the first event of a stream has come; what was read.
fn first_event(tcp: &mut TcpStream) -> String {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("data: {") {
        let n = tcp.read(&mut buf).expect("the stream goes on");
        assert!(
            n > 0,
            "the stream ended before its first event: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&seen).into_owned()
}

/// Reads to the end (the connection closes, or is reset): everything read.
fn rest(mut tcp: TcpStream, mut seen: String) -> String {
    let mut buf = [0u8; 4096];
    loop {
        match tcp.read(&mut buf) {
            Ok(0) => return seen,
            Ok(n) => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                panic!("a read waited {PATIENCE:?}: it hangs; so far {seen}")
            }
            Err(_) => return seen,
        }
    }
}

fn health(server: &Server) -> Value {
    let (status, body) = http(server, "GET", "/health", "");
    assert_eq!(status, 200, "{body}");
    json_body(&body)
}

#[test]
fn nginx_spreads_requests_streams_unbuffered_and_survives_a_lost_server() {
    let Some(nginx) = nginx_binary() else {
        return;
    };
    let Some(model) = crate::common::require::smollm2() else {
        return;
    };
    let model = model.to_str().expect("a UTF-8 path");
    let a = serve::start_model(model, &["--parallel", "4"]);
    let b = serve::start_model(model, &["--parallel", "4"]);
    let front = Front::start(&nginx, &a.address, &b.address);
    let inside = || {
        health(&a)["requests"].as_u64().unwrap_or(0) + health(&b)["requests"].as_u64().unwrap_or(0)
    };

    // a stream's first event arrives while it is still being generated
    let mut tcp = send(&front.address, 300, true);
    let head = first_event(&mut tcp);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        inside() >= 1,
        "the first event came only after the stream ended: nginx buffered it"
    );
    drop(tcp);

    // load: four streams spread over both servers (each has started), two whole answers
    let mut streams: Vec<(TcpStream, String)> = (0..4)
        .map(|_| {
            let mut tcp = send(&front.address, 48, true);
            let seen = first_event(&mut tcp);
            (tcp, seen)
        })
        .collect();
    let (sa, sb) = (
        health(&a)["requests"].as_u64(),
        health(&b)["requests"].as_u64(),
    );
    assert!(
        sa >= Some(1) && sb >= Some(1),
        "not spread over both servers: {sa:?} {sb:?}"
    );
    let whole: Vec<_> = (0..2)
        .map(|_| {
            let address = front.address.clone();
            std::thread::spawn(move || rest(send(&address, 24, false), String::new()))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // one server dies under load
    let mut a = a;
    a.child.kill().expect("kill a server");
    a.child.wait().expect("it ends");
    let (mut finished, mut cut) = (0, 0);
    for (tcp, seen) in streams.drain(..) {
        let all = rest(tcp, seen);
        match all.contains("data: [DONE]") {
            true => finished += 1,
            false => cut += 1,
        }
    }
    assert!(
        finished >= 1 && cut >= 1,
        "{finished} streams finished, {cut} cut short"
    );
    for w in whole {
        let reply = w.join().expect("a client");
        assert!(
            reply.starts_with("HTTP/1.1 200"),
            "an unanswered request was not answered by the other server: {reply}"
        );
        assert!(reply.contains("\"text_completion\""), "{reply}");
    }
    // new requests go to the survivor
    for _ in 0..3 {
        let reply = rest(send(&front.address, 8, false), String::new());
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    }
    eprintln!("nginx: {finished} streams finished on the survivor, {cut} ended with their server");
}
