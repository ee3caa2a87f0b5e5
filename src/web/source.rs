//! A model file's bytes from what JavaScript hands `Engine.load`: a URL (fetched with download
//! progress, optionally through the Cache API), a File/Blob (read as a stream), or bytes.

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

/// A model file read into memory.
pub(crate) struct Fetched {
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// A name for messages: the URL's last segment, the File's name, or the caller's.
    pub name: String,
    /// Read from the Cache API rather than the network.
    pub from_cache: bool,
    /// Where to store it after it parsed (a URL fetched from the network with a cache named).
    pub store: Option<(Cache, String)>,
}

/// What `Engine.load` was given.
pub(crate) enum Source {
    /// A URL to fetch.
    Url(String),
    /// A File or Blob.
    Blob(Blob),
    /// Bytes already in memory.
    Bytes(Vec<u8>),
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

impl Source {
    /// Recognises a URL string (or an object with an `href`, such as `URL`), a Blob, an
    /// ArrayBuffer or any ArrayBuffer view.
    pub fn from_js(value: &JsValue) -> Result<Self> {
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
            "expected a URL string, a File or Blob, an ArrayBuffer or a Uint8Array",
        ))
    }

    /// Reads the bytes, reporting `progress(loaded, total)` (total 0 when unknown). `cache`
    /// names a Cache API cache for URL sources; without the Cache API it is ignored.
    pub async fn read(
        self,
        name: Option<String>,
        cache: Option<&str>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Fetched> {
        match self {
            Source::Url(url) => {
                let name = name.unwrap_or_else(|| url_file_name(&url));
                read_url(url, name, cache, progress).await
            }
            Source::Blob(blob) => {
                let total = blob.size() as u64;
                let name = name
                    .or_else(|| get(&blob, "name").as_string())
                    .filter(|n| !n.is_empty())
                    .unwrap_or_else(|| "model.gguf".to_string());
                let bytes = read_stream(&blob.stream(), total, &name, progress).await?;
                Ok(Fetched {
                    bytes,
                    name,
                    from_cache: false,
                    store: None,
                })
            }
            Source::Bytes(bytes) => {
                let total = bytes.len() as u64;
                progress(total, total);
                Ok(Fetched {
                    bytes,
                    name: name.unwrap_or_else(|| "model.gguf".to_string()),
                    from_cache: false,
                    store: None,
                })
            }
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

async fn read_url(
    url: String,
    name: String,
    cache_name: Option<&str>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Fetched> {
    let cache = match cache_name {
        Some(c) => open_cache(c).await,
        None => None,
    };
    if let Some(cache) = &cache {
        let hit = JsFuture::from(cache.match_with_str(&url)).await.ok();
        if let Some(response) = hit.and_then(|r| r.dyn_into::<Response>().ok()) {
            if let Some(body) = response.body() {
                let total = content_length(&response);
                let bytes = read_stream(&body, total, &url, progress).await?;
                return Ok(Fetched {
                    bytes,
                    name,
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
    let bytes = read_stream(&body, content_length(&response), &url, progress).await?;
    Ok(Fetched {
        bytes,
        name,
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
