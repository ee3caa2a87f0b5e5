//! `emberlm serve-api`: the OpenAI-style HTTP API over one engine, so existing OpenAI clients
//! can point at it. `POST /v1/chat/completions` and `POST /v1/completions` (server-sent events
//! with `stream: true`), `POST /v1/embeddings`, `GET /v1/models`, `GET /health`. Completions run on the main thread
//! (which owns the engine): up to `--parallel` of them decoded together, each joining the
//! running batch in arrival order as a slot frees ([`crate::serve_batch`]), or one at a time
//! with `--parallel 1`. Each connection is read on a
//! thread of its own (at most [`MAX_CONNECTIONS`] at once; kept open between requests, see
//! [`crate::serve_http`]), which answers what needs no engine and admits at most
//! `--max-queue` waiting completions, refusing the rest at once with 503 and a `Retry-After`;
//! a slow client holds its place in the queue but never the engine. Bodies over the limit get
//! 413 (without reading them), bad JSON or fields 400 naming the problem. A client that has
//! closed its connection by its turn is not run (it is told so with 503, should it still
//! read), and one that goes away while its completion runs (streamed or not) stops it at the
//! next token. `GET /health` reports the requests inside, the sequences decoding together
//! (now and at most) and the completions abandoned.
//!
//! Before any of that, each request's head is checked ([`emberlm::openai::access`]): the name
//! it uses for the server (`Host`: IP addresses, `localhost`, `--host` and `--allowed-host`),
//! the page it comes from (`Origin`: only `--cors-origin` pages, which get CORS answers and
//! preflights) and, with `--api-key` / `--api-key-file`, its bearer key.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;

use clap::Args;
use emberlm::engine::Engine;
use emberlm::openai::access::{AccessPolicy, Decision};
use emberlm::openai::embeddings::EmbeddingRequest;
use emberlm::openai::{complete, CompletionKind, Request};
use serde_json::{json, Value};
use std::net::{TcpListener, TcpStream};

use crate::serve_batch::serve_batched;
use crate::serve_embed::embedding;
use crate::serve_http::{answer_stream, read_head, Connection, HeadError, HttpRequest};
use crate::serve_shared::{
    error_body, error_reply, not_run, reply, Admission, Decoding, Job, Shared, Work,
};
use crate::{load_engine, CliResult, Failure};

/// Completions decoded together when `--parallel` is not given (fewer where their KV cache
/// does not fit, see [`default_parallel`]).
const DEFAULT_PARALLEL: usize = 4;

/// `--parallel`'s default: [`DEFAULT_PARALLEL`] slots, fewer where their KV caches
/// (`per_slot` bytes each) would take more than half of the memory `available` (at least one).
fn default_parallel(per_slot: u64, available: Option<u64>) -> usize {
    let fits = match available {
        Some(bytes) => usize::try_from(bytes / 2 / per_slot.max(1)).unwrap_or(usize::MAX),
        None => DEFAULT_PARALLEL,
    };
    fits.clamp(1, DEFAULT_PARALLEL)
}

/// The memory the system can still give (`MemAvailable` of `/proc/meminfo`, Linux), bytes.
fn memory_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// Connections read at once; more are answered 503 and closed.
pub const MAX_CONNECTIONS: usize = 256;

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
    /// Completion requests that may wait while others run; more are refused with 503 and a
    /// `Retry-After` until a place frees.
    #[arg(long, default_value_t = 16)]
    pub max_queue: usize,
    /// Completions decoded together (each in a KV slot of its own; a request asking for `n`
    /// choices takes `n`). Default: 4, or fewer where their KV caches would take more than half
    /// of the memory available or do not fit the device. 1 runs them one at a time, reusing
    /// the previous request's prompt prefix.
    #[arg(long, value_name = "N")]
    pub parallel: Option<usize>,
    /// An API key that requests must send as `Authorization: Bearer KEY` (repeat for several;
    /// every endpoint then needs one). Without a key, anyone who can reach the address can run
    /// completions.
    #[arg(long = "api-key", value_name = "KEY", env = "EMBERLM_API_KEY")]
    pub api_keys: Vec<String>,
    /// A file of API keys, one per line (blank lines and lines starting with `#` skipped),
    /// which keeps them out of the process list.
    #[arg(long, value_name = "FILE")]
    pub api_key_file: Option<PathBuf>,
    /// A name that requests may use for this server besides IP addresses, `localhost` and
    /// `--host` (repeat for several; `*`: any). Other names are refused with 421, which keeps
    /// web pages from reaching the server through DNS rebinding.
    #[arg(long = "allowed-host", value_name = "NAME")]
    pub allowed_hosts: Vec<String>,
    /// A web page origin allowed to call the server from a browser, such as
    /// `https://app.example` or `http://localhost:5173` (repeat for several; `*`: any page).
    /// Browser requests from other pages are refused with 403 before they run.
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    pub cors_origins: Vec<String>,
}

/// The keys of `--api-key` and of `--api-key-file`.
fn api_keys(args: &ServeApiArgs) -> CliResult<Vec<String>> {
    let mut keys = args.api_keys.clone();
    if let Some(path) = &args.api_key_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Failure::usage(format!("--api-key-file {}: {e}", path.display())))?;
        let before = keys.len();
        keys.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(String::from),
        );
        if keys.len() == before {
            return Err(Failure::usage(format!(
                "--api-key-file {}: no key in the file (one per line)",
                path.display()
            )));
        }
    }
    Ok(keys)
}

/// Whether `host` (as given to `--host`) is a loopback address.
fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Reads and parses an admitted request's body: the request and its parsed body, or, once
/// the client has been answered with 413, 411 or 400, the connection if it stays open.
fn read_job(
    mut request: HttpRequest,
    kind: Option<CompletionKind>,
    limit: usize,
) -> Result<(HttpRequest, Work), Option<Connection>> {
    let body = match request.read_body(limit) {
        Ok(b) => b,
        Err((status, message)) => {
            return Err(reply(
                request,
                status,
                &error_body(&message, "invalid_request_error"),
            ));
        }
    };
    let parsed = match kind {
        Some(kind) => Request::from_json(kind, &body).map(|r| Work::Complete(Box::new(r))),
        None => EmbeddingRequest::from_json(&body).map(Work::Embed),
    };
    match parsed {
        Ok(work) => Ok((request, work)),
        Err(e) => Err(reply(
            request,
            400,
            &error_body(&e.to_string(), "invalid_request_error"),
        )),
    }
}

/// Answers a completion request on `engine`: JSON, or server-sent events when it streams.
/// Either way the generation stops when the client goes away (counted in `abandoned`). The
/// connection for the next request, if it stays open.
fn completion(
    engine: &Engine,
    request: HttpRequest,
    parsed: Request,
    abandoned: &AtomicU64,
) -> Option<Connection> {
    if !parsed.stream {
        let abort = engine.abort_switch();
        let watch = request.watch_client(move || abort.abort());
        let result = pollster::block_on(complete(engine, &parsed, None, &mut |_| {}));
        if watch.stop() {
            abandoned.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        return match result {
            Ok(body) => reply(request, 200, &body),
            Err(e) => error_reply(request, &e),
        };
    }
    // Server-sent events in HTTP/1.1 chunks written as they come.
    let mut events = request.event_stream()?;
    let cancel = engine.cancel_handle();
    let mut gone = false;
    let result = pollster::block_on(complete(engine, &parsed, Some(&cancel), &mut |chunk| {
        if !gone && !events.send(&format!("data: {chunk}\n\n")) {
            // the client went away: stop generating for it
            gone = true;
            cancel.cancel();
        }
    }));
    if gone {
        abandoned.fetch_add(1, Ordering::Relaxed);
        return None;
    }
    if let Err(e) = result {
        events.send(&format!(
            "data: {}\n\n",
            error_body(&e.to_string(), "server_error")
        ));
    }
    match events.send("data: [DONE]\n\n") {
        true => events.finish(),
        false => None,
    }
}

/// The 503 body of a completion refused while the queue is full, and its `Retry-After`.
fn busy(admission: &Admission) -> (Value, u64) {
    let wait = admission.retry_after_s();
    let message = format!(
        "the server is busy: {0} requests are already waiting (--max-queue {0}); retry after {wait} s",
        admission.max_queue
    );
    (error_body(&message, "server_error"), wait)
}

/// One connection's thread: its requests one after another while it stays open.
fn connection(stream: TcpStream, shared: &Shared) {
    let mut next = Some(Connection::new(stream));
    while let Some(connection) = next {
        next = match read_head(connection) {
            Ok(request) => serve(request, shared),
            Err((HeadError::Answer(status, message), stream)) => {
                let body = error_body(&message, "invalid_request_error").to_string();
                answer_stream(stream, status, &body, true);
                None
            }
            Err((HeadError::Gone, _)) => None,
        };
    }
}

/// One request: answers what needs no engine, admits a completion (or refuses it) and sends
/// it to the engine's thread. The connection for the next request, if it stays open (from
/// the engine's thread once it has answered).
fn serve(mut request: HttpRequest, shared: &Shared) -> Option<Connection> {
    let path = request.path.trim_end_matches('/').to_string();
    // the health check needs no key (balancers probe it), but the Host and Origin checks
    let public = path == "/health";
    match shared
        .access
        .check(&request.method, &request.access, public)
    {
        Decision::Allow { cors } => request.allow_origin(cors),
        Decision::Preflight(headers) => return request.respond(204, "", &headers),
        Decision::Refuse(r) => {
            let body = json!({
                "error": { "message": r.message, "type": r.kind, "param": null, "code": r.code }
            });
            return request.respond(r.status, &body.to_string(), &r.headers);
        }
    }
    let kind = match (request.method.as_str(), path.as_str()) {
        ("POST", "/v1/chat/completions") => Some(CompletionKind::Chat),
        ("POST", "/v1/completions") => Some(CompletionKind::Text),
        ("POST", "/v1/embeddings") => None,
        ("GET", "/v1/models") => {
            let body = json!({
                "object": "list",
                "data": [{ "id": shared.model, "object": "model", "created": 0, "owned_by": "emberlm" }],
            });
            return reply(request, 200, &body);
        }
        ("GET", "/health") => {
            let body = json!({
                "status": "ok",
                "model": shared.model,
                "requests": shared.admission.inside.load(Ordering::Acquire),
                "max_queue": shared.admission.max_queue,
                "parallel": shared.parallel,
                "decoding": shared.decoding.now.load(Ordering::Relaxed),
                "decoding_peak": shared.decoding.peak.load(Ordering::Relaxed),
                "abandoned": shared.abandoned.load(Ordering::Relaxed),
            });
            return reply(request, 200, &body);
        }
        (
            _,
            "/v1/chat/completions"
            | "/v1/completions"
            | "/v1/embeddings"
            | "/v1/models"
            | "/health",
        ) => {
            let message = format!("{} is not allowed on {path}", request.method);
            return reply(request, 405, &error_body(&message, "invalid_request_error"));
        }
        _ => {
            let message = format!(
                "no endpoint {path} (try /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models, /health)"
            );
            return reply(request, 404, &error_body(&message, "invalid_request_error"));
        }
    };
    let limit = shared.limit;
    if request.body_length().is_some_and(|n| n > limit) {
        let message = format!("the body is larger than the limit of {limit} bytes");
        return reply(request, 413, &error_body(&message, "invalid_request_error"));
    }
    if !shared.admission.enter() {
        let (body, wait) = busy(&shared.admission);
        return request.respond(503, &body.to_string(), &[("Retry-After", wait.to_string())]);
    }
    let (request, work) = match read_job(request, kind, limit) {
        Ok(job) => job,
        Err(next) => {
            shared.admission.leave(None);
            return next;
        }
    };
    let (back, returned) = mpsc::channel();
    let job = Job {
        request,
        work,
        back,
    };
    if let Err(mpsc::SendError(job)) = shared.jobs.send(job) {
        shared.admission.leave(None);
        return reply(
            job.request,
            503,
            &error_body("the server is stopping", "server_error"),
        );
    }
    // the engine's thread answers, and gives the connection back if it stays open
    returned.recv().ok()
}

/// Accepts connections and gives each a thread, at most [`MAX_CONNECTIONS`] at once.
fn listen(listener: TcpListener, shared: Arc<Shared>) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else {
            continue;
        };
        if shared.connections.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            shared.connections.fetch_sub(1, Ordering::AcqRel);
            let message = format!("more than {MAX_CONNECTIONS} connections are open; retry later");
            let body = error_body(&message, "server_error").to_string();
            answer_stream(stream, 503, &body, false);
            continue;
        }
        let mine = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name("serve-api connection".into())
            .spawn(move || {
                connection(stream, &mine);
                mine.connections.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            shared.connections.fetch_sub(1, Ordering::AcqRel);
            eprintln!("emberlm: serve-api: cannot start a thread for a connection: {e}");
        }
    }
}

/// Serves until the process is stopped.
pub fn serve_api(args: ServeApiArgs) -> CliResult<()> {
    let access = AccessPolicy::new(
        api_keys(&args)?,
        &args.host,
        &args.allowed_hosts,
        &args.cors_origins,
    )?;
    if args.parallel == Some(0) {
        return Err(Failure::usage("--parallel must be at least 1".to_string()));
    }
    let engine = load_engine(args.model, args.ctx)?;
    let parallel = match args.parallel {
        Some(n) => engine.inspect(|s| s.batch_limit(n)).unwrap_or(1),
        None => engine
            .inspect(|s| {
                let per_slot = s.forward().memory().kv_bytes_per_token * s.context() as u64;
                s.batch_limit(default_parallel(per_slot, memory_available()))
            })
            .unwrap_or(1),
    };
    if let Some(asked) = args.parallel.filter(|&n| n > parallel) {
        eprintln!(
            "emberlm: serve-api: --parallel {asked}: the KV cache holds {parallel} sequences at \
             this context on this device; decoding {parallel} together (a smaller --ctx fits more)"
        );
    }
    let listener = TcpListener::bind((args.host.as_str(), args.port)).map_err(|e| {
        Failure::usage(format!("cannot listen on {}:{}: {e}", args.host, args.port))
    })?;
    let address = listener.local_addr().map_or_else(
        |_| format!("{}:{}", args.host, args.port),
        |a| a.to_string(),
    );
    // the warning first: whoever reads the address line has it already
    if !is_loopback(&args.host) && !access.has_keys() {
        eprintln!(
            "emberlm: serve-api: warning: listening on {address} without an API key: anyone who \
             can reach this address can run completions on this machine and read them (give \
             --api-key or --api-key-file)"
        );
    }
    println!("emberlm: serving the OpenAI-style API at http://{address}/v1/ ({parallel} at once)");
    let _ = std::io::stdout().flush();
    let (jobs, queue) = mpsc::channel();
    let shared = Arc::new(Shared {
        access,
        admission: Admission::new(args.max_queue, parallel),
        jobs,
        model: emberlm::openai::model_name(engine.files().name()),
        limit: args.max_body,
        connections: AtomicUsize::new(0),
        abandoned: AtomicU64::new(0),
        parallel,
        decoding: Decoding::default(),
    });
    let listening = Arc::clone(&shared);
    std::thread::Builder::new()
        .name("serve-api listener".into())
        .spawn(move || listen(listener, listening))
        .map_err(|e| format!("cannot start the listening thread: {e}"))?;
    // The engine is not `Send`: completions run here, decoded together, or one at a time in
    // arrival order with --parallel 1.
    if parallel > 1 {
        serve_batched(&engine, &queue, &shared, parallel);
        return Ok(());
    }
    for job in queue {
        if job.request.client_gone() {
            not_run(job, &shared);
            continue;
        }
        let started = Instant::now();
        let back = job.back.clone();
        shared.decoding.record(1);
        let next = match job.work {
            Work::Complete(parsed) => completion(&engine, job.request, *parsed, &shared.abandoned),
            Work::Embed(parsed) => embedding(&engine, job.request, &parsed, &shared.model),
        };
        shared.decoding.now.store(0, Ordering::Relaxed);
        // the place frees before the connection goes back, so that its next request finds it
        shared
            .admission
            .leave(Some(started.elapsed().as_millis() as u64));
        if let Some(connection) = next {
            // its thread may have gone (the connection then closes with it)
            let _ = back.send(connection);
        }
    }
    Ok(())
}
