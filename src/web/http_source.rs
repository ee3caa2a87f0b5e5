//! A model's files on a web server read a byte range at a time with HTTP `Range` requests: what
//! a WebGPU load without a store reads each layer's tensors from, so that the page never holds
//! the files, and what every load from URLs reads the headers from before anything is
//! downloaded (to refuse a model that cannot run here before its gigabytes arrive).
//!
//! A file is opened with a one-byte request: the server must answer `206` with a
//! `Content-Range` that says the file's length (across origins, the server must expose that
//! header, as Hugging Face's and most CDNs do). Where it does not, the caller reads the file
//! whole as before. Each read is checked: the span asked for and no other, exactly its bytes,
//! from the same file (its `ETag` or `Last-Modified` unchanged since it was opened).

use std::cell::Cell;

use js_sys::Uint8Array;
use wasm_bindgen_futures::JsFuture;
use web_sys::Response;

use super::download::{fetch_range, header, sleep, url_file_name};
use super::opfs::js_text;
use crate::error::{Error, Result};
use crate::model::byte_source::{ByteSource, LocalFuture};
use crate::store::range::parse_content_range;

/// How many times a read asks again after the connection broke, waiting 0.25 s, 0.5 s, 1 s.
const RETRIES: u32 = 3;

/// The most bytes one request asks for when neighbouring tensors are read together: a layer of
/// a 1B model at 4 bits (about 40 MB) in one request, a larger layer in a few.
const MERGE_UP_TO: u64 = 64 << 20;

/// One file on the server.
struct HttpFile {
    url: String,
    name: String,
    /// Its length, from the first answer's `Content-Range`.
    bytes: u64,
    /// Its `ETag`, else its `Last-Modified`, when the server sent one: every later answer must
    /// carry the same.
    version: Option<String>,
}

/// A model's files read by HTTP range requests.
pub(crate) struct HttpSource {
    files: Vec<HttpFile>,
    /// Body bytes received so far, headers' and tensors' reads together.
    received: Cell<u64>,
}

fn io(name: &str, message: String) -> Error {
    Error::Io {
        path: name.to_string(),
        message,
    }
}

/// The answer's version: its `ETag`, else its `Last-Modified`.
fn version(response: &Response) -> Option<String> {
    header(response, "etag").or_else(|| header(response, "last-modified"))
}

/// The body of `response`, whole.
async fn body_bytes(response: &Response) -> std::result::Result<Vec<u8>, String> {
    let promise = response.array_buffer().map_err(|e| js_text(&e))?;
    let buffer = JsFuture::from(promise).await.map_err(|e| js_text(&e))?;
    Ok(Uint8Array::new(&buffer).to_vec())
}

/// Stops reading `response`'s body (a whole file sent where a range was asked for).
fn cancel(response: &Response) {
    if let Some(body) = response.body() {
        let _ = body.cancel();
    }
}

impl HttpSource {
    /// Opens every file of `urls` (with its name for messages) by asking each server for its
    /// first byte. `None` where any server does not answer with a range and the file's length
    /// (no range support, the header not exposed across origins, an error status, a network
    /// failure): the caller then reads the files as before, and reports what goes wrong there.
    pub async fn open(urls: &[(String, String)]) -> Option<Self> {
        let mut files = Vec::with_capacity(urls.len());
        let mut received = 0u64;
        for (url, name) in urls {
            let response = fetch_range(url, 0, Some(0)).await.ok()?;
            let total = header(&response, "content-range")
                .as_deref()
                .and_then(parse_content_range)
                .filter(|r| r.first == 0)
                .and_then(|r| r.total);
            let opened = (response.status() == 206).then_some(total).flatten();
            let Some(bytes) = opened else {
                cancel(&response);
                return None;
            };
            received += body_bytes(&response).await.map_or(0, |b| b.len() as u64);
            files.push(HttpFile {
                url: url.clone(),
                name: name.clone(),
                bytes,
                version: version(&response),
            });
        }
        Some(Self {
            files,
            received: Cell::new(received),
        })
    }

    /// The files' URLs with their names: the last path segment of each (or `name` for a
    /// single file).
    pub fn named(urls: &[String], name: Option<&str>) -> Vec<(String, String)> {
        let single = urls.len() == 1;
        urls.iter()
            .map(|u| {
                let own = name.filter(|_| single).map(String::from);
                (u.clone(), own.unwrap_or_else(|| url_file_name(u)))
            })
            .collect()
    }

    /// Each file's name and length, in order.
    pub fn names(&self) -> Vec<(String, u64)> {
        self.files
            .iter()
            .map(|f| (f.name.clone(), f.bytes))
            .collect()
    }

    /// Body bytes received so far.
    pub fn received(&self) -> u64 {
        self.received.get()
    }

    /// Bytes `range` of `f`, one request (asked again, for the same span, where the connection
    /// breaks or the server answers 429 or 5xx).
    async fn read_span(&self, f: &HttpFile, range: std::ops::Range<u64>) -> Result<Vec<u8>> {
        let want = range.end.saturating_sub(range.start);
        if want == 0 {
            return Ok(Vec::new());
        }
        if range.end > f.bytes {
            return Err(io(
                &f.name,
                format!(
                    "bytes {range:?} are past the end of the file ({} bytes): the file is shorter \
                     than its header says",
                    f.bytes
                ),
            ));
        }
        let mut failures = 0u32;
        loop {
            let response = fetch_range(&f.url, range.start, Some(range.end - 1)).await;
            let broke = match response {
                // the server is busy or failed for now: asked again like a broken connection
                Ok(response) if response.status() == 429 || response.status() >= 500 => {
                    cancel(&response);
                    format!("HTTP {} {}", response.status(), response.status_text())
                }
                Ok(response) => match self.check(f, &range, &response) {
                    Ok(()) => match body_bytes(&response).await {
                        Ok(bytes) if bytes.len() as u64 == want => {
                            self.received.set(self.received.get().saturating_add(want));
                            return Ok(bytes);
                        }
                        Ok(bytes) => format!("{} bytes came of {want}", bytes.len()),
                        Err(e) => e,
                    },
                    Err(e) => {
                        cancel(&response);
                        return Err(e);
                    }
                },
                Err(e) => e,
            };
            failures += 1;
            if failures > RETRIES {
                return Err(io(
                    &f.name,
                    format!("reading bytes {range:?} failed {failures} times: {broke}"),
                ));
            }
            sleep(125 << failures).await;
        }
    }

    /// Whether `response` is the span `range` of the file `f` was opened as.
    fn check(&self, f: &HttpFile, range: &std::ops::Range<u64>, response: &Response) -> Result<()> {
        let status = response.status();
        if status != 206 {
            let what = match status {
                200 => "the whole file came".to_string(),
                s => format!("HTTP {s} {}", response.status_text()),
            };
            return Err(io(
                &f.name,
                format!("bytes {range:?} were asked for and {what}"),
            ));
        }
        let sent = header(response, "content-range");
        if let Some(r) = sent.as_deref().and_then(parse_content_range) {
            let end = r.last.saturating_add(1);
            if r.first != range.start || end != range.end {
                return Err(io(
                    &f.name,
                    format!(
                        "bytes {range:?} were asked for and bytes {}..{end} came",
                        r.first
                    ),
                ));
            }
        }
        let now = version(response);
        if f.version.is_some() && now.is_some() && now != f.version {
            return Err(io(
                &f.name,
                format!(
                    "the file changed on the server while it loaded (it was {}, it is now {})",
                    f.version.as_deref().unwrap_or_default(),
                    now.as_deref().unwrap_or_default()
                ),
            ));
        }
        Ok(())
    }
}

impl ByteSource for HttpSource {
    fn read(&self, file: usize, range: std::ops::Range<u64>) -> LocalFuture<'_, Result<Vec<u8>>> {
        Box::pin(async move {
            let f = self
                .files
                .get(file)
                .ok_or_else(|| Error::invalid("file", format!("no file {file} in this model")))?;
            self.read_span(f, range).await
        })
    }

    fn merge_up_to(&self) -> u64 {
        MERGE_UP_TO
    }
}

impl std::fmt::Debug for HttpSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSource")
            .field("files", &self.files.len())
            .finish()
    }
}
