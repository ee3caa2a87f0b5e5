//! `serve-api --parallel N`: the completions of several clients decoded together. The engine's
//! thread serves the admitted requests through [`emberlm::session::ItemFeed`]: a request joins
//! the running batch as soon as a slot is free, in arrival order, and is answered the moment
//! its sequences end (streamed chunks as its tokens come), whatever the others do. A client
//! that goes away (streamed or not) ends its request at the next step. An embeddings request
//! waits until the batch has drained, runs by itself, and serving resumes.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::Instant;

use emberlm::chat::tools::ToolSyntax;
use emberlm::engine::Engine;
use emberlm::openai::Responder;
use emberlm::session::{BatchItem, Generation, ItemFeed, TokenEvent};
use emberlm::tokenizer::Tokenizer;

use crate::serve_embed::embedding;
use crate::serve_http::{ClientWatch, Connection, EventStream, HttpRequest};
use crate::serve_shared::{error_reply, Job, Shared, Work};

/// Where an answer goes.
enum Reply {
    /// A non-streamed completion: the whole body at the end; the client is watched meanwhile.
    Whole(HttpRequest, ClientWatch),
    /// Server-sent events as the tokens come.
    Stream(EventStream),
}

/// A request in the engine.
struct Active {
    reply: Reply,
    responder: Responder,
    back: mpsc::Sender<Connection>,
    started: Instant,
    /// A streamed client went away (a write failed).
    gone: bool,
}

/// The admitted requests, as the engine takes them.
pub struct JobFeed<'a> {
    queue: &'a mpsc::Receiver<Job>,
    shared: &'a Shared,
    tokenizer: Arc<Tokenizer>,
    /// The call syntax of the model's chat template.
    syntax: ToolSyntax,
    active: HashMap<u64, Active>,
    next_ticket: u64,
    /// An embeddings request taken from the queue: no request joins until it has run.
    pending: Option<Job>,
}

impl<'a> JobFeed<'a> {
    /// The feed of `queue` for requests on a model whose tokenizer is `tokenizer` and whose
    /// template writes calls in `syntax`.
    pub fn new(
        queue: &'a mpsc::Receiver<Job>,
        shared: &'a Shared,
        tokenizer: Arc<Tokenizer>,
        syntax: ToolSyntax,
    ) -> Self {
        Self {
            queue,
            shared,
            tokenizer,
            syntax,
            active: HashMap::new(),
            next_ticket: 0,
            pending: None,
        }
    }

    fn answer(
        &mut self,
        active: Active,
        result: emberlm::Result<Generation>,
    ) -> Option<Connection> {
        let Active {
            reply,
            responder,
            gone,
            ..
        } = active;
        match reply {
            Reply::Whole(request, watch) => {
                if watch.stop() {
                    self.shared.abandoned.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
                match result {
                    Ok(g) => {
                        let (_, body) = responder.finish(&g);
                        request.respond(200, &body.to_string(), &[])
                    }
                    Err(e) => error_reply(request, &e),
                }
            }
            Reply::Stream(mut events) => {
                if gone {
                    self.shared.abandoned.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
                match result {
                    Ok(g) => {
                        let (chunks, _) = responder.finish(&g);
                        for chunk in chunks {
                            if !events.send(&format!("data: {chunk}\n\n")) {
                                return None;
                            }
                        }
                    }
                    Err(e) => {
                        let body = crate::serve_shared::error_body(&e.to_string(), "server_error");
                        events.send(&format!("data: {body}\n\n"));
                    }
                }
                match events.send("data: [DONE]\n\n") {
                    true => events.finish(),
                    false => None,
                }
            }
        }
    }
}

/// Answers the next request of `queue` with `error`; false once the queue has closed.
fn fail_next(queue: &mpsc::Receiver<Job>, shared: &Shared, error: &emberlm::Error) -> bool {
    let Ok(job) = queue.recv() else {
        return false;
    };
    let next = error_reply(job.request, error);
    shared.admission.leave(None);
    if let Some(connection) = next {
        let _ = job.back.send(connection);
    }
    true
}

impl ItemFeed for JobFeed<'_> {
    fn next(&mut self, wait: bool) -> Option<(u64, BatchItem)> {
        loop {
            if self.pending.is_some() {
                // the batch drains, then serving ends for the embeddings to run
                return None;
            }
            let job = match wait {
                true => self.queue.recv().ok()?,
                false => self.queue.try_recv().ok()?,
            };
            if job.request.client_gone() {
                crate::serve_shared::not_run(job, self.shared);
                continue;
            }
            let (request, parsed, back) = match job.work {
                Work::Complete(parsed) => (job.request, *parsed, job.back),
                Work::Embed(_) => {
                    self.pending = Some(job);
                    continue;
                }
            };
            let responder = Responder::new(
                &parsed,
                &self.shared.model,
                Arc::clone(&self.tokenizer),
                self.syntax,
            );
            let reply = match parsed.stream {
                true => match request.event_stream() {
                    Some(events) => Reply::Stream(events),
                    None => {
                        // gone before its first byte
                        self.shared.abandoned.fetch_add(1, Ordering::Relaxed);
                        self.shared.admission.leave(None);
                        continue;
                    }
                },
                false => {
                    let watch = request.watch_client(|| {});
                    Reply::Whole(request, watch)
                }
            };
            let ticket = self.next_ticket;
            self.next_ticket += 1;
            self.active.insert(
                ticket,
                Active {
                    reply,
                    responder,
                    back,
                    started: Instant::now(),
                    gone: false,
                },
            );
            let item = BatchItem {
                prompt: parsed.prompt,
                options: parsed.options,
            };
            return Some((ticket, item));
        }
    }

    fn cancelled(&mut self, ticket: u64) -> bool {
        match self.active.get(&ticket) {
            Some(a) => match &a.reply {
                Reply::Whole(_, watch) => watch.is_gone(),
                Reply::Stream(_) => a.gone,
            },
            None => true,
        }
    }

    fn event(&mut self, ticket: u64, event: &TokenEvent) {
        let Some(a) = self.active.get_mut(&ticket) else {
            return;
        };
        for chunk in a.responder.on_token(event) {
            if let Reply::Stream(events) = &mut a.reply {
                if !a.gone && !events.send(&format!("data: {chunk}\n\n")) {
                    // the client went away: its request ends at the next step
                    a.gone = true;
                }
            }
        }
    }

    fn finished(&mut self, ticket: u64, result: emberlm::Result<Generation>) {
        let Some(active) = self.active.remove(&ticket) else {
            return;
        };
        let ran_ms = active.started.elapsed().as_millis() as u64;
        let back = active.back.clone();
        let next = self.answer(active, result);
        // the place frees before the connection goes back, so that its next request finds it
        self.shared.admission.leave(Some(ran_ms));
        if self.active.is_empty() {
            self.shared.decoding.now.store(0, Ordering::Relaxed);
        }
        if let Some(connection) = next {
            let _ = back.send(connection);
        }
    }

    fn step(&mut self, sequences: usize) {
        self.shared.decoding.record(sequences);
    }
}

/// The engine's thread with `slots` sequences decoded together: serves the queue until it
/// closes. A device error fails the requests in flight; the engine then starts again on a new
/// device (an engine that cannot start answers each request with why).
pub fn serve_batched(engine: &Engine, queue: &mpsc::Receiver<Job>, shared: &Shared, slots: usize) {
    let model = engine.with_session(|s| Ok((s.shared_tokenizer(), s.tool_format().syntax)));
    let (tokenizer, syntax) = match pollster::block_on(model) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("emberlm: serve-api: {e}");
            while fail_next(queue, shared, &e) {}
            return;
        }
    };
    let mut feed = JobFeed::new(queue, shared, tokenizer, syntax);
    loop {
        let before = feed.next_ticket;
        match pollster::block_on(engine.serve(&mut feed, slots)) {
            Ok(()) => match feed.pending.take() {
                Some(job) => run_embedding(engine, job, shared),
                None => return,
            },
            Err(e) => {
                eprintln!("emberlm: serve-api: {e} (the engine starts again for the next request)");
                // nothing was taken: the engine could not start; answer one request with why
                // so that a broken engine is paced by requests, not spinning
                if feed.next_ticket == before && !fail_next(queue, shared, &e) {
                    return;
                }
            }
        }
    }
}

/// Runs an embeddings request the feed held back, with nothing else in the engine.
fn run_embedding(engine: &Engine, job: Job, shared: &Shared) {
    let Work::Embed(parsed) = &job.work else {
        return;
    };
    if job.request.client_gone() {
        crate::serve_shared::not_run(job, shared);
        return;
    }
    let started = Instant::now();
    shared.decoding.record(1);
    let next = embedding(engine, job.request, parsed, &shared.model);
    shared.decoding.now.store(0, Ordering::Relaxed);
    shared
        .admission
        .leave(Some(started.elapsed().as_millis() as u64));
    if let Some(connection) = next {
        let _ = job.back.send(connection);
    }
}
