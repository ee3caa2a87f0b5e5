//! The HTTP/1.1 side of `emberlm serve-api`, over std's `TcpStream`: persistent connections
//! (HTTP/1.1 keep-alive, requests in order, pipelined ones included, at most
//! [`MAX_REQUESTS_PER_CONNECTION`] and [`IDLE_TIMEOUT`] between them), each head parsed by
//! [`http_head::parse_head`], each body read only when asked and never past the caller's limit,
//! whatever `Content-Length` says. Answers are JSON with a length, or a server-sent event stream
//! in chunks. A connection closes after an answer whose request body was left unread (it cannot
//! be found where the next request starts), or when the client asks.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use emberlm::openai::access::AccessHeaders;
use emberlm::openai::http_head::{self, HeadParse};

/// How long a client may take to send its head or body before the connection is dropped.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a kept connection may stay idle before its next request starts.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(15);
/// Requests served on one connection; the last answer closes it.
pub const MAX_REQUESTS_PER_CONNECTION: usize = 1000;
/// How long, and how much, of a refused request's unread body is drained after the answer, so
/// that the client reads the answer rather than a reset.
const LINGER: Duration = Duration::from_millis(200);
const LINGER_BYTES: usize = 1 << 20;

/// Why a request head could not be read: the status to answer with and why, or nothing to
/// answer (the client went away or was too slow).
#[derive(Debug)]
pub enum HeadError {
    /// Answer with this status and message.
    Answer(u16, String),
    /// The connection is gone or timed out.
    Gone,
}

/// A connection between requests: the stream, what the client sent past the last request (a
/// pipelined next one), and how many requests it has carried.
#[derive(Debug)]
pub struct Connection {
    stream: TcpStream,
    leftover: Vec<u8>,
    served: usize,
}

impl Connection {
    /// A new connection.
    pub fn new(stream: TcpStream) -> Self {
        Self {
            stream,
            leftover: Vec::new(),
            served: 0,
        }
    }
}

/// A request whose head has been read: method, path (without the query) and the connection,
/// with what came after the head so far.
#[derive(Debug)]
pub struct HttpRequest {
    /// `GET`, `POST`, …
    pub method: String,
    /// The path, without a query.
    pub path: String,
    /// The headers that decide whether it may be served.
    pub access: AccessHeaders,
    /// The page origin the answer allows (`Access-Control-Allow-Origin`), once allowed.
    cors: Option<String>,
    content_length: Option<usize>,
    chunked: bool,
    /// Whether body bytes may still be unread (the answer then drains a bounded amount).
    unread: bool,
    /// Whether the client keeps the connection for another request.
    keep_alive: bool,
    /// Requests the connection carried before this one.
    served: usize,
    stream: TcpStream,
    /// Bytes that arrived with the head: the body's start (and, once the body is read, what
    /// follows it).
    early: Vec<u8>,
}

/// Reads and parses the next request head on `connection`; on failure, why, with the stream
/// back (to answer on).
pub fn read_head(connection: Connection) -> Result<HttpRequest, (HeadError, TcpStream)> {
    let Connection {
        mut stream,
        leftover,
        served,
    } = connection;
    // the first request may take the read timeout to arrive, a kept connection's next one
    // the idle timeout
    let wait = if served == 0 {
        READ_TIMEOUT
    } else {
        IDLE_TIMEOUT
    };
    match parse_head(&mut stream, leftover, wait) {
        Ok((h, early)) => Ok(HttpRequest {
            method: h.method,
            path: h.path,
            access: h.access,
            cors: None,
            unread: h.chunked || h.content_length.is_some_and(|n| n > 0),
            keep_alive: h.keep_alive,
            served,
            content_length: h.content_length,
            chunked: h.chunked,
            stream,
            early,
        }),
        Err(e) => Err((e, stream)),
    }
}

/// The head, and the bytes read past it.
fn parse_head(
    stream: &mut TcpStream,
    mut buf: Vec<u8>,
    wait: Duration,
) -> Result<(http_head::RequestHead, Vec<u8>), HeadError> {
    let _ = stream.set_read_timeout(Some(wait));
    let mut chunk = [0u8; 4096];
    loop {
        match http_head::parse_head(&buf) {
            HeadParse::Complete(h) => {
                let early = buf[h.len..].to_vec();
                let _ = stream.set_read_timeout(Some(READ_TIMEOUT));
                return Ok((h, early));
            }
            HeadParse::Invalid(status, why) => return Err(HeadError::Answer(status, why)),
            HeadParse::Partial => {}
        }
        match stream.read(&mut chunk) {
            Ok(0) => return Err(HeadError::Gone),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Err(HeadError::Gone),
        }
    }
}

/// Answers `status` with a JSON body on a connection whose request was not read: after a bad
/// head, draining a bounded amount of the rest (`drain`), or from the accepting thread, which
/// must not wait (no drain).
pub fn answer_stream(stream: TcpStream, status: u16, body: &str, drain: bool) {
    let request = HttpRequest {
        method: String::new(),
        path: String::new(),
        access: AccessHeaders::default(),
        cors: None,
        content_length: None,
        chunked: false,
        unread: drain,
        keep_alive: false,
        served: 0,
        stream,
        early: Vec::new(),
    };
    let _ = request.respond(status, body, &[]);
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        411 => "Length Required",
        413 => "Content Too Large",
        421 => "Misdirected Request",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "",
    }
}

impl HttpRequest {
    /// Lets the page at `origin` read the answers to this request (CORS).
    pub fn allow_origin(&mut self, origin: Option<String>) {
        self.cors = origin;
    }

    /// The CORS headers of an answer, when a page was allowed.
    fn cors_head(&self) -> String {
        match &self.cors {
            Some(origin) => format!("Access-Control-Allow-Origin: {origin}\r\nVary: Origin\r\n"),
            None => String::new(),
        }
    }

    /// The declared body length, if any.
    pub fn body_length(&self) -> Option<usize> {
        self.content_length
    }

    /// Reads the body, at most `limit` bytes: `Err((status, message))` when it is declared or
    /// found larger, has no length, or cannot be read.
    pub fn read_body(&mut self, limit: usize) -> Result<String, (u16, String)> {
        let too_large = || {
            (
                413,
                format!("the body is larger than the limit of {limit} bytes"),
            )
        };
        let Some(length) = self.content_length else {
            let message = match self.chunked {
                true => "a chunked body is not accepted: send a Content-Length",
                false => "the request has no Content-Length",
            };
            return Err((411, message.to_string()));
        };
        if length > limit {
            return Err(too_large());
        }
        let mut body = std::mem::take(&mut self.early);
        // what came past the body is the start of a pipelined next request
        self.early = body.split_off(length.min(body.len()));
        let missing = length - body.len();
        let read = (&mut self.stream)
            .take(missing as u64)
            .read_to_end(&mut body)
            .map_err(|e| (400, format!("cannot read the body: {e}")))?;
        if read < missing {
            return Err((
                400,
                format!("the body ended after {} of {length} bytes", body.len()),
            ));
        }
        self.unread = false;
        String::from_utf8(body).map_err(|_| (400, "the body is not UTF-8".to_string()))
    }

    /// Whether the client has closed its side (checked before working for it).
    pub fn client_gone(&self) -> bool {
        peer_closed(&self.stream)
    }

    /// Watches the connection while a request that writes nothing until it ends (a
    /// non-streamed completion) runs: when the client goes, `on_gone` runs (it stops the
    /// request) and [`ClientWatch::is_gone`] turns true. The connection must not be written
    /// until [`ClientWatch::stop`].
    pub fn watch_client(&self, on_gone: impl FnOnce() + Send + 'static) -> ClientWatch {
        let done = Arc::new((Mutex::new(false), Condvar::new()));
        let gone = Arc::new(AtomicBool::new(false));
        let thread = self.stream.try_clone().ok().and_then(|stream| {
            let (done, gone) = (Arc::clone(&done), Arc::clone(&gone));
            std::thread::Builder::new()
                .name("serve-api client watch".into())
                .spawn(move || watch(&stream, &done, &gone, on_gone))
                .ok()
        });
        ClientWatch { done, gone, thread }
    }

    /// Whether the connection can carry another request after this one's answer.
    fn reusable(&self) -> bool {
        self.keep_alive && !self.unread && self.served + 1 < MAX_REQUESTS_PER_CONNECTION
    }

    /// The `Connection` header of the answer.
    fn connection_head(&self) -> &'static str {
        match self.reusable() {
            true => "Connection: keep-alive\r\n",
            false => "Connection: close\r\n",
        }
    }

    /// After a whole answer: the connection for the next request, or `None` once it is
    /// closed.
    fn next(self) -> Option<Connection> {
        match self.reusable() {
            true => Some(Connection {
                stream: self.stream,
                leftover: self.early,
                served: self.served + 1,
            }),
            false => {
                self.linger();
                None
            }
        }
    }

    /// Answers with a JSON body: the connection for the next request, if it stays open.
    pub fn respond(
        mut self,
        status: u16,
        body: &str,
        headers: &[(&str, String)],
    ) -> Option<Connection> {
        let mut head = format!(
            "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{}",
            reason(status),
            body.len(),
            self.connection_head()
        );
        head.push_str(&self.cors_head());
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        let written = self
            .stream
            .write_all(head.as_bytes())
            .and_then(|_| self.stream.write_all(body.as_bytes()))
            .and_then(|_| self.stream.flush());
        match written {
            Ok(()) => self.next(),
            Err(_) => None,
        }
    }

    /// After an answer: closes the sending side and drains a bounded amount of what the
    /// client still sends, so that it reads the answer before the connection closes.
    fn linger(mut self) {
        let _ = self.stream.shutdown(Shutdown::Write);
        if !self.unread {
            return;
        }
        let _ = self.stream.set_read_timeout(Some(LINGER));
        let mut sink = [0u8; 4096];
        let mut drained = 0;
        while drained < LINGER_BYTES {
            match self.stream.read(&mut sink) {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    }

    /// Starts a server-sent event stream (chunked): its writer, or `None` when the client is
    /// gone. `X-Accel-Buffering: no` asks a proxy in front (nginx) to pass it on unbuffered.
    pub fn event_stream(mut self) -> Option<EventStream> {
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nX-Accel-Buffering: no\r\nTransfer-Encoding: chunked\r\n{}{}\r\n",
            self.connection_head(),
            self.cors_head()
        );
        self.stream
            .write_all(head.as_bytes())
            .and_then(|_| self.stream.flush())
            .ok()?;
        Some(EventStream { request: self })
    }
}

/// Whether the peer of `stream` has closed its side (a read would end).
fn peer_closed(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return false;
    }
    let mut probe = [0u8; 1];
    let gone = matches!(stream.peek(&mut probe), Ok(0));
    let _ = stream.set_nonblocking(false);
    gone
}

/// How often a watched connection is looked at.
const WATCH_EVERY: Duration = Duration::from_millis(100);

/// The watching thread: until `done`, looks at the connection every [`WATCH_EVERY`]; when the
/// peer has closed, aborts the running request (unless it has just ended: `done` is checked
/// under its lock, which [`ClientWatch::stop`] takes to end the watch).
fn watch(
    stream: &TcpStream,
    done: &(Mutex<bool>, Condvar),
    gone: &AtomicBool,
    on_gone: impl FnOnce(),
) {
    let (lock, wake) = done;
    let mut ended = lock.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        if *ended {
            return;
        }
        if peer_closed(stream) {
            gone.store(true, Ordering::SeqCst);
            on_gone();
            return;
        }
        ended = wake
            .wait_timeout(ended, WATCH_EVERY)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

/// A connection being watched ([`HttpRequest::watch_client`]).
#[derive(Debug)]
pub struct ClientWatch {
    done: Arc<(Mutex<bool>, Condvar)>,
    gone: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ClientWatch {
    /// Whether the client has gone away.
    pub fn is_gone(&self) -> bool {
        self.gone.load(Ordering::SeqCst)
    }

    /// Ends the watch (the request has ended): whether the client went away and the request
    /// was aborted for it.
    pub fn stop(mut self) -> bool {
        let (lock, wake) = &*self.done;
        *lock.lock().unwrap_or_else(PoisonError::into_inner) = true;
        wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.gone.load(Ordering::SeqCst)
    }
}

/// A server-sent event stream being written.
#[derive(Debug)]
pub struct EventStream {
    request: HttpRequest,
}

impl EventStream {
    /// Sends one chunk; false when the client is gone.
    pub fn send(&mut self, data: &str) -> bool {
        let framed = format!("{:x}\r\n{data}\r\n", data.len());
        let stream = &mut self.request.stream;
        stream
            .write_all(framed.as_bytes())
            .and_then(|_| stream.flush())
            .is_ok()
    }

    /// Ends the body (the empty chunk): the connection for the next request, if it stays
    /// open.
    pub fn finish(mut self) -> Option<Connection> {
        match self.send("") {
            true => self.request.next(),
            false => None,
        }
    }
}
