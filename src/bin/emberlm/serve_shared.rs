//! What `serve-api`'s threads share: the admission count, the jobs handed to the engine's
//! thread, how many sequences decode together, and the error answers every part gives.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;

use emberlm::openai::access::AccessPolicy;
use emberlm::openai::embeddings::EmbeddingRequest;
use emberlm::openai::Request;
use serde_json::{json, Value};

use crate::serve_http::{Connection, HttpRequest};

/// How many completion requests are in the server (reading their body, waiting or running)
/// and how long one takes: the listening thread admits or refuses with it.
#[derive(Debug)]
pub struct Admission {
    /// `--max-queue`.
    pub max_queue: usize,
    /// Requests allowed in at once: the running ones (`--parallel`) and `--max-queue` waiting.
    pub limit: usize,
    /// Requests inside now.
    pub inside: AtomicUsize,
    /// Running mean of a completion's time, milliseconds (0 before the first).
    mean_ms: AtomicU64,
}

impl Admission {
    pub fn new(max_queue: usize, running: usize) -> Self {
        Self {
            max_queue,
            limit: max_queue.saturating_add(running),
            inside: AtomicUsize::new(0),
            mean_ms: AtomicU64::new(0),
        }
    }

    /// Takes a place when one is free.
    pub fn enter(&self) -> bool {
        self.inside
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .is_ok()
    }

    /// Frees a place; `ran_ms` is the completion's time when it ran (not when its body was
    /// refused), folded into the mean.
    pub fn leave(&self, ran_ms: Option<u64>) {
        if let Some(ms) = ran_ms {
            let old = self.mean_ms.load(Ordering::Relaxed);
            let mean = if old == 0 { ms } else { (old * 7 + ms) / 8 };
            self.mean_ms.store(mean.max(1), Ordering::Relaxed);
        }
        self.inside.fetch_sub(1, Ordering::AcqRel);
    }

    /// Seconds until a place is likely free: the requests inside at the mean time each, at
    /// least 1.
    pub fn retry_after_s(&self) -> u64 {
        let inside = self.inside.load(Ordering::Acquire) as u64;
        (self.mean_ms.load(Ordering::Relaxed) * inside)
            .div_ceil(1000)
            .max(1)
    }
}

/// What an admitted request asks of the engine.
pub enum Work {
    /// A chat or text completion.
    Complete(Box<Request>),
    /// Embeddings of its texts.
    Embed(EmbeddingRequest),
}

/// An admitted request whose body parsed, on its way to the engine; the connection comes back
/// through `back` once it is answered.
pub struct Job {
    /// The request, its body read.
    pub request: HttpRequest,
    /// Its body.
    pub work: Work,
    /// Where the connection goes back after the answer.
    pub back: mpsc::Sender<Connection>,
}

/// An OpenAI-style error body.
pub fn error_body(message: &str, kind: &str) -> Value {
    json!({ "error": { "message": message, "type": kind, "param": null, "code": null } })
}

/// Answers with `body`: the connection for the next request, if it stays open.
pub fn reply(request: HttpRequest, status: u16, body: &Value) -> Option<Connection> {
    request.respond(status, &body.to_string(), &[])
}

/// Answers with a completion's error: 400 for the request's own mistakes, 500 otherwise.
pub fn error_reply(request: HttpRequest, e: &emberlm::Error) -> Option<Connection> {
    let (status, kind) = match e {
        emberlm::Error::InvalidArgument { .. } => (400, "invalid_request_error"),
        _ => (500, "server_error"),
    };
    reply(request, status, &error_body(&e.to_string(), kind))
}

/// A request whose client closed its connection before its turn: its place frees without
/// running it (a client that only closed its sending side still reads why).
pub fn not_run(job: Job, shared: &Shared) {
    shared.admission.leave(None);
    shared.abandoned.fetch_add(1, Ordering::Relaxed);
    let message = "not run: the client closed the connection before its turn";
    let _ = reply(job.request, 503, &error_body(message, "server_error"));
}

/// What every connection's thread shares.
pub struct Shared {
    /// Which hosts, origins and keys are let in.
    pub access: AccessPolicy,
    /// Completions inside the server, and the queue's limit.
    pub admission: Admission,
    /// Where admitted requests go, to the engine's thread.
    pub jobs: mpsc::Sender<Job>,
    /// The model's name in responses.
    pub model: String,
    /// Largest request body read, bytes.
    pub limit: usize,
    /// Connections open now.
    pub connections: AtomicUsize,
    /// Completions whose client went away before their answer (stopped, or not run).
    pub abandoned: AtomicU64,
    /// `--parallel`: sequences decoded together at most.
    pub parallel: usize,
    /// Sequences being decoded together.
    pub decoding: Decoding,
}

/// How many sequences the engine decodes together now and at most so far (`/health`).
#[derive(Debug, Default)]
pub struct Decoding {
    /// Sequences in the last step (0 while idle).
    pub now: AtomicUsize,
    /// The most sequences one step has decoded.
    pub peak: AtomicUsize,
}

impl Decoding {
    /// Records a step of `n` sequences.
    pub fn record(&self, n: usize) {
        self.now.store(n, Ordering::Relaxed);
        self.peak.fetch_max(n, Ordering::Relaxed);
    }
}
