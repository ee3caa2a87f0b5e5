//! Who may use `emberlm serve-api`: API keys (`--api-key`, `--api-key-file`), the `Host` a
//! request names (against DNS rebinding), the `Origin` of browser requests (CORS and
//! preflights), and the warning for an open address without a key.

#![cfg(not(target_arch = "wasm32"))]

use crate::serve;

use serve::{json_body, start, with_headers, PROMPT};

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
    let mut server = serve::start_with(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/tiny-llama-f32.gguf"
        ),
        &["--host", "0.0.0.0"],
        std::process::Stdio::piped(),
    );
    assert!(server.address.starts_with("0.0.0.0:"), "{}", server.address);
    let _ = server.child.kill();
    let mut stderr = String::new();
    std::io::Read::read_to_string(
        &mut server.child.stderr.take().expect("stderr"),
        &mut stderr,
    )
    .expect("stderr");
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
