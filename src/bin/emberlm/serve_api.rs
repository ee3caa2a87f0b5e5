//! `emberlm serve-api`: the OpenAI-style HTTP API over one engine, so existing OpenAI clients
//! can point at it. `POST /v1/chat/completions` and `POST /v1/completions` (server-sent events
//! with `stream: true`), `GET /v1/models`. Requests are answered one at a time, in arrival
//! order; bodies over the limit get 413, bad JSON or fields 400 naming the problem.

use std::io::{Read, Write};
use std::path::PathBuf;

use clap::Args;
use emberlm::engine::Engine;
use emberlm::openai::{complete, CompletionKind, Request};
use serde_json::{json, Value};
use tiny_http::{Header, Method, Response, Server};

use crate::{load_engine, CliResult, Failure};

/// Options of `emberlm serve-api`.
#[derive(Debug, Args)]
pub struct ServeApiArgs {
    /// A GGUF file or a Hugging Face folder (default: the model in models/).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// KV cache length (default: the model's context, at most 4096).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Address to listen on (default: loopback only). Anything but loopback exposes the model
    /// to the network.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on; 0 picks a free one (the address is printed on stdout).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Largest request body accepted, in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body: usize,
}

fn json_header() -> Header {
    Header::from_bytes("Content-Type", "application/json").unwrap_or_else(|_| unreachable!())
}

/// An OpenAI-style error body.
fn error_body(message: &str, kind: &str) -> Value {
    json!({ "error": { "message": message, "type": kind, "param": null, "code": null } })
}

fn reply(request: tiny_http::Request, status: u16, body: &Value) {
    let response = Response::from_string(body.to_string())
        .with_status_code(status)
        .with_header(json_header());
    if let Err(e) = request.respond(response) {
        eprintln!("emberlm: serve-api: could not answer: {e}");
    }
}

/// Reads the body, at most `limit` bytes: `Err((status, message))` when it is larger or
/// unreadable.
fn read_body(request: &mut tiny_http::Request, limit: usize) -> Result<String, (u16, String)> {
    if request.body_length().is_some_and(|n| n > limit) {
        return Err((
            413,
            format!("the body is larger than the limit of {limit} bytes"),
        ));
    }
    let mut body = Vec::new();
    request
        .as_reader()
        .take(limit as u64 + 1)
        .read_to_end(&mut body)
        .map_err(|e| (400, format!("cannot read the body: {e}")))?;
    if body.len() > limit {
        return Err((
            413,
            format!("the body is larger than the limit of {limit} bytes"),
        ));
    }
    String::from_utf8(body).map_err(|_| (400, "the body is not UTF-8".to_string()))
}

/// Answers a completion request on `engine`: JSON, or server-sent events when it streams.
fn completion(
    engine: &Engine,
    mut request: tiny_http::Request,
    kind: CompletionKind,
    limit: usize,
) {
    let body = match read_body(&mut request, limit) {
        Ok(b) => b,
        Err((status, message)) => {
            return reply(
                request,
                status,
                &error_body(&message, "invalid_request_error"),
            )
        }
    };
    let parsed = match Request::from_json(kind, &body) {
        Ok(p) => p,
        Err(e) => {
            return reply(
                request,
                400,
                &error_body(&e.to_string(), "invalid_request_error"),
            )
        }
    };
    if !parsed.stream {
        return match pollster::block_on(complete(engine, &parsed, None, &mut |_| {})) {
            Ok(body) => reply(request, 200, &body),
            Err(e) => {
                let status = if matches!(e, emberlm::Error::InvalidArgument { .. }) {
                    400
                } else {
                    500
                };
                let kind = if status == 400 {
                    "invalid_request_error"
                } else {
                    "server_error"
                };
                reply(request, status, &error_body(&e.to_string(), kind))
            }
        };
    }
    // Server-sent events in HTTP/1.1 chunks written as they come (the connection stays usable).
    let mut out = request.into_writer();
    let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n";
    if out
        .write_all(head.as_bytes())
        .and_then(|_| out.flush())
        .is_err()
    {
        return;
    }
    let mut send = move |data: &str| -> bool {
        let framed = format!("{:x}\r\n{data}\r\n", data.len());
        out.write_all(framed.as_bytes())
            .and_then(|_| out.flush())
            .is_ok()
    };
    let cancel = engine.cancel_handle();
    let mut gone = false;
    let result = pollster::block_on(complete(engine, &parsed, Some(&cancel), &mut |chunk| {
        if !gone && !send(&format!("data: {chunk}\n\n")) {
            // the client went away: stop generating for it
            gone = true;
            cancel.cancel();
        }
    }));
    if gone {
        return;
    }
    if let Err(e) = result {
        send(&format!(
            "data: {}\n\n",
            error_body(&e.to_string(), "server_error")
        ));
    }
    if send("data: [DONE]\n\n") {
        // the empty chunk ends the body
        send("");
    }
}

/// Serves until the process is stopped.
pub fn serve_api(args: ServeApiArgs) -> CliResult<()> {
    let engine = load_engine(args.model, args.ctx)?;
    let server = Server::http((args.host.as_str(), args.port)).map_err(|e| {
        Failure::usage(format!("cannot listen on {}:{}: {e}", args.host, args.port))
    })?;
    let address = server
        .server_addr()
        .to_ip()
        .map_or_else(|| format!("{}:{}", args.host, args.port), |a| a.to_string());
    println!("emberlm: serving the OpenAI-style API at http://{address}/v1/");
    let _ = std::io::stdout().flush();
    let model = emberlm::openai::model_name(engine.files().name());
    for request in server.incoming_requests() {
        let path = request.url().split('?').next().unwrap_or("").to_string();
        match (request.method(), path.trim_end_matches('/')) {
            (Method::Post, "/v1/chat/completions") => {
                completion(&engine, request, CompletionKind::Chat, args.max_body)
            }
            (Method::Post, "/v1/completions") => {
                completion(&engine, request, CompletionKind::Text, args.max_body)
            }
            (Method::Get, "/v1/models") => {
                let body = json!({
                    "object": "list",
                    "data": [{ "id": model, "object": "model", "created": 0, "owned_by": "emberlm" }],
                });
                reply(request, 200, &body)
            }
            (_, "/v1/chat/completions" | "/v1/completions" | "/v1/models") => {
                let message = format!("{} is not allowed on {path}", request.method());
                reply(request, 405, &error_body(&message, "invalid_request_error"))
            }
            _ => {
                let message = format!(
                    "no endpoint {path} (try /v1/chat/completions, /v1/completions, /v1/models)"
                );
                reply(request, 404, &error_body(&message, "invalid_request_error"))
            }
        }
    }
    Ok(())
}
