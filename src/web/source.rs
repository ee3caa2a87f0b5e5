//! A model's bytes from what JavaScript hands `Engine.load`: a URL (fetched with download
//! progress, optionally through the Cache API), a File/Blob (read as a stream), or bytes; or a
//! list of those, the parts of a split GGUF set (a first part's URL brings the others).

use js_sys::{ArrayBuffer, Promise, Reflect, Uint8Array};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use web_sys::{Blob, Cache, CacheStorage, ReadableStream, ReadableStreamDefaultReader, Response};

use crate::{Error, Result};

#[wasm_bindgen]
extern "C" {
    /// The global `fetch` (a window's or a worker's).
    #[wasm_bindgen(js_name = fetch, catch)]
    fn fetch_url(url: &str) -> std::result::Result<Promise, JsValue>;
}

/// Reports at most one progress event per this many bytes (and the last one).
const PROGRESS_STEP: u64 = 1 << 20;

/// One file of a model, read into memory.
pub(crate) struct FetchedPart {
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// A name for messages: the URL's last segment, the File's name, or the caller's.
    pub name: String,
    /// Where to store it after the model parsed (a URL fetched from the network with a cache
    /// named).
    pub store: Option<(Cache, String)>,
}

/// A model's files read into memory: one, or every part of a split GGUF set.
pub(crate) struct Fetched {
    /// The files in the order given (a split set is put in part order when it is parsed).
    pub parts: Vec<FetchedPart>,
    /// The model's name: the caller's, or the first file's.
    pub name: String,
    /// Every file was read from the Cache API rather than the network.
    pub from_cache: bool,
}

/// What `Engine.load` was given.
pub(crate) enum Source {
    /// A URL to fetch.
    Url(String),
    /// A File or Blob.
    Blob(Blob),
    /// Bytes already in memory.
    Bytes(Vec<u8>),
    /// Every file of a model in several (a split GGUF set), one source each.
    Parts(Vec<Source>),
}

fn js_text(value: &JsValue) -> String {
    value
        .dyn_ref::<js_sys::Error>()
        .map(|e| String::from(e.message()))
        .or_else(|| value.as_string())
        .unwrap_or_else(|| format!("{value:?}"))
}

fn get(target: &JsValue, key: &str) -> JsValue {
    Reflect::get(target, &JsValue::from_str(key)).unwrap_or(JsValue::UNDEFINED)
}

/// A file opened for reading: its length (0 when unknown) and its bytes to come.
struct Opened {
    name: String,
    total: u64,
    body: Body,
    from_cache: bool,
    store: Option<(Cache, String)>,
}

enum Body {
    Stream(ReadableStream),
    Bytes(Vec<u8>),
}

impl Source {
    /// Recognises a URL string (or an object with an `href`, such as `URL`), a Blob, an
    /// ArrayBuffer or any ArrayBuffer view; or a list of those, or a `FileList`, as the files of
    /// one model. A URL whose file name is the first part of a split GGUF set
    /// (`NAME-00001-of-0000N.gguf`, N > 1) stands for every part, each beside it.
    pub fn from_js(value: &JsValue) -> Result<Self> {
        if js_sys::Array::is_array(value) {
            let list: &js_sys::Array = value.unchecked_ref();
            let parts = list
                .iter()
                .map(|v| Self::one_from_js(&v))
                .collect::<Result<Vec<_>>>()?;
            return Self::parts(parts);
        }
        if let Some(list) = value.dyn_ref::<web_sys::FileList>() {
            let parts = (0..list.length())
                .filter_map(|i| list.get(i))
                .map(|f| Source::Blob(f.into()))
                .collect();
            return Self::parts(parts);
        }
        Ok(Self::one_from_js(value)?.expanded())
    }

    /// A list of files: none is an error, one stands alone.
    fn parts(mut parts: Vec<Source>) -> Result<Self> {
        match parts.len() {
            0 => Err(Error::invalid("source", "an empty list of model files")),
            1 => Ok(parts
                .pop()
                .map_or(Source::Parts(Vec::new()), Source::expanded)),
            _ => Ok(Source::Parts(parts)),
        }
    }

    /// The URL of a split set's first part as the URLs of every part; anything else as it is.
    fn expanded(self) -> Self {
        match &self {
            Source::Url(url) => match crate::format::gguf_split::part_urls(url) {
                Some(urls) => Source::Parts(urls.into_iter().map(Source::Url).collect()),
                None => self,
            },
            _ => self,
        }
    }

    fn one_from_js(value: &JsValue) -> Result<Self> {
        if let Some(url) = value.as_string().or_else(|| get(value, "href").as_string()) {
            return Ok(Source::Url(url));
        }
        if let Some(blob) = value.dyn_ref::<Blob>() {
            return Ok(Source::Blob(blob.clone()));
        }
        if let Some(buffer) = value.dyn_ref::<ArrayBuffer>() {
            return Ok(Source::Bytes(Uint8Array::new(buffer).to_vec()));
        }
        if ArrayBuffer::is_view(value) {
            let buffer = get(value, "buffer");
            let offset = get(value, "byteOffset").as_f64().unwrap_or(0.0) as u32;
            let length = get(value, "byteLength").as_f64().unwrap_or(0.0) as u32;
            let view = Uint8Array::new_with_byte_offset_and_length(&buffer, offset, length);
            return Ok(Source::Bytes(view.to_vec()));
        }
        Err(Error::invalid(
            "source",
            "expected a URL string, a File or Blob, an ArrayBuffer or a Uint8Array (or a list \
             of those: the parts of a split GGUF set)",
        ))
    }

    /// Reads every file, reporting `progress(loaded, total)` over all of them (total 0 while
    /// any file's size is unknown: a URL not yet opened, or one without `Content-Length`).
    /// `cache` names a Cache API cache for URL sources; without the Cache API it is ignored.
    /// `name` names the model (and its file, when it is one). The files are read one after
    /// another, each URL fetched only once the file before it has been read: a browser keeps
    /// at most six HTTP/1.1 connections to one host, and a body not yet read holds its
    /// connection. Before each file's body is read, the sizes known so far are checked against
    /// the wasm32 address space.
    pub async fn read(
        self,
        name: Option<String>,
        cache: Option<&str>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Fetched> {
        let sources = match self {
            Source::Parts(parts) => parts,
            one => vec![one],
        };
        let single = sources.len() == 1;
        let mut known: Vec<Option<u64>> = sources.iter().map(Source::size_now).collect();
        let mut done = 0u64;
        let mut from_cache = true;
        let mut parts: Vec<FetchedPart> = Vec::with_capacity(sources.len());
        for (i, source) in sources.into_iter().enumerate() {
            let own_name = if single { name.clone() } else { None };
            let o = source.open(own_name, cache).await?;
            if let Some(size) = known.get_mut(i) {
                // a URL without Content-Length stays unknown
                *size = Some(o.total).filter(|&t| t > 0 || !matches!(o.body, Body::Stream(_)));
            }
            let sum = known
                .iter()
                .flatten()
                .fold(0u64, |t, n| t.saturating_add(*n));
            let first = parts.first().map_or(o.name.as_str(), |p| p.name.as_str());
            let what = name.as_deref().unwrap_or(first);
            if let Err(e) = crate::model::file_bytes::check_fits_wasm32(sum, what) {
                if let Body::Stream(stream) = &o.body {
                    // the download would only fill memory the model cannot have
                    let _ = stream.cancel();
                }
                return Err(e);
            }
            let total = if known.iter().all(Option::is_some) {
                sum
            } else {
                0
            };
            let shown = |at: u64| if total > 0 { total.max(at) } else { 0 };
            from_cache &= o.from_cache;
            let bytes = match o.body {
                Body::Bytes(bytes) => {
                    let at = done.saturating_add(bytes.len() as u64);
                    progress(at, shown(at));
                    bytes
                }
                Body::Stream(stream) => {
                    let mut each = |loaded: u64, _: u64| {
                        let at = done.saturating_add(loaded);
                        progress(at, shown(at));
                    };
                    read_stream(&stream, o.total, &o.name, &mut each).await?
                }
            };
            done = done.saturating_add(bytes.len() as u64);
            parts.push(FetchedPart {
                bytes,
                name: o.name,
                store: o.store,
            });
        }
        let name = name
            .or_else(|| parts.first().map(|p| p.name.clone()))
            .unwrap_or_else(|| "model.gguf".to_string());
        Ok(Fetched {
            parts,
            name,
            from_cache,
        })
    }

    /// A file's size before it is opened: a File's or bytes'; a URL's is known only from its
    /// response.
    fn size_now(&self) -> Option<u64> {
        match self {
            Source::Blob(blob) => Some(blob.size() as u64),
            Source::Bytes(bytes) => Some(bytes.len() as u64),
            Source::Url(_) | Source::Parts(_) => None,
        }
    }

    /// Opens one file for reading (a list inside a list is refused).
    async fn open(self, name: Option<String>, cache: Option<&str>) -> Result<Opened> {
        match self {
            Source::Url(url) => {
                let name = name.unwrap_or_else(|| url_file_name(&url));
                open_url(url, name, cache).await
            }
            Source::Blob(blob) => Ok(Opened {
                total: blob.size() as u64,
                name: name
                    .or_else(|| get(&blob, "name").as_string())
                    .filter(|n| !n.is_empty())
                    .unwrap_or_else(|| "model.gguf".to_string()),
                body: Body::Stream(blob.stream()),
                from_cache: false,
                store: None,
            }),
            Source::Bytes(bytes) => Ok(Opened {
                total: bytes.len() as u64,
                name: name.unwrap_or_else(|| "model.gguf".to_string()),
                body: Body::Bytes(bytes),
                from_cache: false,
                store: None,
            }),
            Source::Parts(_) => Err(Error::invalid(
                "source",
                "a list of model files inside a list: give one flat list of every part",
            )),
        }
    }
}

/// The last path segment of a URL, without query or fragment.
fn url_file_name(url: &str) -> String {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    path.rsplit('/')
        .find(|s| !s.is_empty())
        .unwrap_or("model.gguf")
        .to_string()
}

fn io(path: &str, message: impl Into<String>) -> Error {
    Error::Io {
        path: path.to_string(),
        message: message.into(),
    }
}

async fn open_cache(name: &str) -> Option<Cache> {
    let caches: CacheStorage = get(&js_sys::global(), "caches").dyn_into().ok()?;
    JsFuture::from(caches.open(name))
        .await
        .ok()?
        .dyn_into()
        .ok()
}

fn content_length(response: &Response) -> u64 {
    response
        .headers()
        .get("content-length")
        .ok()
        .flatten()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

async fn open_url(url: String, name: String, cache_name: Option<&str>) -> Result<Opened> {
    let cache = match cache_name {
        Some(c) => open_cache(c).await,
        None => None,
    };
    if let Some(cache) = &cache {
        let hit = JsFuture::from(cache.match_with_str(&url)).await.ok();
        if let Some(response) = hit.and_then(|r| r.dyn_into::<Response>().ok()) {
            if let Some(body) = response.body() {
                return Ok(Opened {
                    total: content_length(&response),
                    name,
                    body: Body::Stream(body),
                    from_cache: true,
                    store: None,
                });
            }
        }
    }
    let promise = fetch_url(&url).map_err(|e| io(&url, js_text(&e)))?;
    let response: Response = JsFuture::from(promise)
        .await
        .map_err(|e| io(&url, format!("the download failed: {}", js_text(&e))))?
        .dyn_into()
        .map_err(|_| io(&url, "fetch did not return a Response"))?;
    if !response.ok() {
        return Err(io(
            &url,
            format!("HTTP {} {}", response.status(), response.status_text()),
        ));
    }
    let body = response
        .body()
        .ok_or_else(|| io(&url, "the response has no body"))?;
    Ok(Opened {
        total: content_length(&response),
        name,
        body: Body::Stream(body),
        from_cache: false,
        store: cache.map(|c| (c, url)),
    })
}

/// Reads a byte stream to the end into one buffer, reserving `total` bytes up front.
async fn read_stream(
    stream: &ReadableStream,
    total: u64,
    what: &str,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Vec<u8>> {
    let too_big = |n: u64| {
        io(
            what,
            format!("{n} bytes do not fit in this page's memory (wasm32 allows at most 4 GiB)"),
        )
    };
    let mut bytes = Vec::new();
    let reserve = usize::try_from(total).map_err(|_| too_big(total))?;
    bytes
        .try_reserve_exact(reserve)
        .map_err(|_| too_big(total))?;
    let reader: ReadableStreamDefaultReader = stream.get_reader().unchecked_into();
    let mut reported = 0u64;
    progress(0, total);
    loop {
        let step = JsFuture::from(reader.read())
            .await
            .map_err(|e| io(what, format!("reading failed: {}", js_text(&e))))?;
        if get(&step, "done").as_bool().unwrap_or(true) {
            break;
        }
        let chunk: Uint8Array = get(&step, "value")
            .dyn_into()
            .map_err(|_| io(what, "the stream gave something other than bytes"))?;
        let start = bytes.len();
        let n = chunk.length() as usize;
        bytes
            .try_reserve(n)
            .map_err(|_| too_big((start + n) as u64))?;
        bytes.resize(start + n, 0);
        chunk.copy_to(&mut bytes[start..]);
        let loaded = bytes.len() as u64;
        if loaded - reported >= PROGRESS_STEP {
            reported = loaded;
            progress(loaded, total.max(loaded));
        }
    }
    // A length different from Content-Length (a compressed transfer) is left to the parser,
    // which rejects a truncated file.
    let loaded = bytes.len() as u64;
    progress(loaded, total.max(loaded));
    Ok(bytes)
}

/// Stores a fetched file in the cache under its URL, with its length so that a later read
/// reports progress. Returns whether it was stored (a full quota is not an error).
pub(crate) async fn store(cache: &Cache, url: &str, bytes: &Uint8Array) -> bool {
    let headers = js_sys::Object::new();
    let _ = Reflect::set(
        &headers,
        &JsValue::from_str("Content-Length"),
        &JsValue::from_str(&bytes.length().to_string()),
    );
    let _ = Reflect::set(
        &headers,
        &JsValue::from_str("Content-Type"),
        &JsValue::from_str("application/octet-stream"),
    );
    let init = web_sys::ResponseInit::new();
    init.set_headers(&headers);
    let Ok(response) = Response::new_with_opt_buffer_source_and_init(Some(bytes), &init) else {
        return false;
    };
    JsFuture::from(cache.put_with_str(url, &response))
        .await
        .is_ok()
}
