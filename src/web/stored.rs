//! Models kept in a store (`Engine.load(url, { cache })` keeps each file under its URL, in the
//! Origin Private File System or the Cache API): listed with their sizes, and deleted by URL,
//! without loading anything. A store's name covers both media. Also the store a load opens
//! ([`Store`]) and the Cache API write after a model has parsed.

use js_sys::{Array, Promise, Reflect};
use js_sys::{Object, Uint8Array};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use web_sys::{Cache, CacheStorage, Response};

use super::handle::Engine;
use super::opfs::OpfsStore;
use super::{js_error, spawn_promise};
use crate::format::gguf_split::part_urls;
use crate::store::Medium;
use crate::Error;

/// The page's (or worker's) `caches`, or an error saying there is none (an insecure context).
fn caches() -> Result<CacheStorage, JsValue> {
    Reflect::get(&js_sys::global(), &JsValue::from_str("caches"))
        .ok()
        .and_then(|c| c.dyn_into::<CacheStorage>().ok())
        .ok_or_else(|| {
            js_error(&Error::Io {
                path: "caches".into(),
                message: "the Cache API is not available here (it needs a secure context: \
                          https or localhost)"
                    .into(),
            })
        })
}

fn io(cache: &str, e: &JsValue) -> JsValue {
    js_error(&Error::Io {
        path: format!("cache `{cache}`"),
        message: e
            .dyn_ref::<js_sys::Error>()
            .map(|e| String::from(e.message()))
            .unwrap_or_else(|| format!("{e:?}")),
    })
}

/// The cache called `name` when it exists (opening a missing one would create it).
async fn existing(name: &str) -> Result<Option<Cache>, JsValue> {
    let caches = caches()?;
    let has = JsFuture::from(caches.has(name))
        .await
        .map_err(|e| io(name, &e))?;
    if !has.as_bool().unwrap_or(false) {
        return Ok(None);
    }
    let cache = JsFuture::from(caches.open(name))
        .await
        .map_err(|e| io(name, &e))?;
    Ok(cache.dyn_into::<Cache>().ok())
}

fn check_name(cache: &str) -> Result<(), JsValue> {
    if cache.trim().is_empty() {
        return Err(js_error(&Error::invalid(
            "cache",
            "must name a Cache API cache (the `cache` option given to Engine.load)",
        )));
    }
    Ok(())
}

fn entry(url: &str, bytes: JsValue, total: JsValue, storage: &str, complete: bool) -> JsValue {
    let entry = js_sys::Object::new();
    super::set(&entry, "url", &JsValue::from_str(url));
    super::set(&entry, "bytes", &bytes);
    super::set(&entry, "total", &total);
    super::set(&entry, "storage", &JsValue::from_str(storage));
    super::set(&entry, "complete", &JsValue::from_bool(complete));
    entry.into()
}

async fn list(cache_name: String) -> Result<JsValue, JsValue> {
    check_name(&cache_name)?;
    let out = Array::new();
    if let Some(store) = OpfsStore::open(&cache_name, false)
        .await
        .map_err(|e| js_error(&e))?
    {
        for (record, stored) in store.list().await.map_err(|e| js_error(&e))? {
            let total = if record.bytes > 0 {
                JsValue::from_f64(record.bytes as f64)
            } else {
                JsValue::NULL
            };
            let complete = record.complete && record.bytes == stored;
            out.push(&entry(
                &record.url,
                JsValue::from_f64(stored as f64),
                total,
                "opfs",
                complete,
            ));
        }
    }
    let Some(cache) = existing(&cache_name).await? else {
        return Ok(out.into());
    };
    let keys: Array = JsFuture::from(cache.keys())
        .await
        .map_err(|e| io(&cache_name, &e))?
        .dyn_into()
        .map_err(|_| io(&cache_name, &JsValue::from_str("keys() gave no list")))?;
    for request in keys.iter() {
        let url = Reflect::get(&request, &JsValue::from_str("url"))
            .ok()
            .and_then(|u| u.as_string())
            .unwrap_or_default();
        let response = JsFuture::from(cache.match_with_str(&url))
            .await
            .ok()
            .and_then(|r| r.dyn_into::<Response>().ok());
        // Engine.load stores every file with its Content-Length
        let bytes = response
            .and_then(|r| r.headers().get("content-length").ok().flatten())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map_or(JsValue::NULL, JsValue::from_f64);
        out.push(&entry(&url, bytes.clone(), bytes, "cacheApi", true));
    }
    Ok(out.into())
}

async fn delete(url: String, cache_name: String) -> Result<JsValue, JsValue> {
    check_name(&cache_name)?;
    let urls = part_urls(&url).unwrap_or_else(|| vec![url]);
    let mut deleted = 0u32;
    if let Some(store) = OpfsStore::open(&cache_name, false)
        .await
        .map_err(|e| js_error(&e))?
    {
        for u in &urls {
            if store.remove(u).await {
                deleted = deleted.saturating_add(1);
            }
        }
    }
    let Some(cache) = existing(&cache_name).await? else {
        return Ok(JsValue::from_f64(f64::from(deleted)));
    };
    for u in &urls {
        let gone = JsFuture::from(cache.delete_with_str(u))
            .await
            .map_err(|e| io(&cache_name, &e))?;
        if gone.as_bool().unwrap_or(false) {
            deleted = deleted.saturating_add(1);
        }
    }
    Ok(JsValue::from_f64(f64::from(deleted)))
}

/// Where downloads are kept (the `cache` and `storage` load options).
pub(crate) enum Store {
    /// A store in the Origin Private File System.
    /// A store in the Origin Private File System, with the Cache API cache of the same name
    /// when one exists and the medium was `auto` (what an earlier version stored there is moved
    /// into the private file system when it is next loaded).
    Opfs(OpfsStore, Option<Cache>),
    /// A Cache API cache.
    CacheApi(Cache),
}

impl Store {
    /// Opens (creating) the store `name` in `medium`; `auto` takes the private file system
    /// where the browser has one, else the Cache API. `Ok(None)` when neither is available
    /// (an insecure context) and the medium was `auto`.
    pub async fn open(name: &str, medium: Medium) -> crate::Result<Option<Self>> {
        if medium != Medium::CacheApi {
            if let Some(s) = OpfsStore::open(name, true).await? {
                let earlier = match medium {
                    Medium::Auto => existing(name).await.ok().flatten(),
                    _ => None,
                };
                return Ok(Some(Store::Opfs(s, earlier)));
            }
            if medium == Medium::Opfs {
                return Err(Error::Io {
                    path: format!("store `{name}`"),
                    message: "this browser has no Origin Private File System here (`storage: \
                              'opfs'`; it needs a secure context, and some private windows \
                              refuse it); `storage: 'cacheApi'` uses the Cache API"
                        .into(),
                });
            }
        }
        match open_cache(name).await {
            Some(c) => Ok(Some(Store::CacheApi(c))),
            None if medium == Medium::CacheApi => Err(Error::Io {
                path: format!("store `{name}`"),
                message: "the Cache API is not available here (it needs a secure context: \
                          https or localhost)"
                    .into(),
            }),
            None => Ok(None),
        }
    }

    /// The medium, as JavaScript names it.
    pub fn medium(&self) -> Medium {
        match self {
            Store::Opfs(..) => Medium::Opfs,
            Store::CacheApi(_) => Medium::CacheApi,
        }
    }
}

/// The Cache API cache `name`, created when missing; `None` without the Cache API.
async fn open_cache(name: &str) -> Option<Cache> {
    JsFuture::from(caches().ok()?.open(name))
        .await
        .ok()?
        .dyn_into()
        .ok()
}

/// Bytes handed to the Cache API per write while it stores a file.
const PUT_CHUNK: usize = 1 << 20;

/// Stores a fetched file in a Cache API cache under its URL, with its length so that a later
/// read reports progress. The file streams into the cache a chunk at a time (each copied to
/// JavaScript when the cache is ready for it), so storing costs one chunk of memory, not a copy
/// of the file. `Err` with the browser's reason when the cache refused it.
pub(crate) async fn put_in_cache(cache: &Cache, url: &str, bytes: &[u8]) -> Result<(), String> {
    let text = |e: JsValue| super::opfs::js_text(&e);
    let headers = Object::new();
    let _ = Reflect::set(
        &headers,
        &JsValue::from_str("Content-Length"),
        &JsValue::from_str(&bytes.len().to_string()),
    );
    let _ = Reflect::set(
        &headers,
        &JsValue::from_str("Content-Type"),
        &JsValue::from_str("application/octet-stream"),
    );
    let init = web_sys::ResponseInit::new();
    init.set_headers(&headers);
    let pipe = web_sys::TransformStream::new().map_err(text)?;
    let response = Response::new_with_opt_readable_stream_and_init(Some(&pipe.readable()), &init)
        .map_err(text)?;
    let put = JsFuture::from(cache.put_with_str(url, &response));
    let writer = pipe.writable().get_writer().map_err(text)?;
    let feed = async {
        for chunk in bytes.chunks(PUT_CHUNK) {
            JsFuture::from(writer.ready()).await?;
            // not awaited: `ready` above is the backpressure
            let _ = writer.write_with_chunk(&Uint8Array::from(chunk));
        }
        JsFuture::from(writer.close()).await
    };
    // the cache reads while the chunks are written; a refusal ends both
    let (fed, put) = futures_util::future::join(feed, put).await;
    put.map_err(text)?;
    fed.map_err(text)?;
    Ok(())
}

#[wasm_bindgen]
impl Engine {
    /// The files kept in the store `cache` (the name given as `Engine.load`'s `cache` option),
    /// in the private file system and the Cache API: each `{ url, bytes, total, storage,
    /// complete }` (`bytes` stored so far, null when a Cache API entry has no length; `complete`
    /// false for a download cut off part-way, which the next load resumes). A split set's parts
    /// are listed each under its own URL. Resolves to an empty list when the store does not
    /// exist (it is not created).
    #[wasm_bindgen(js_name = listStored, unchecked_return_type = "Promise<StoredFile[]>")]
    pub fn list_stored(cache: String) -> Promise {
        spawn_promise(list(cache))
    }

    /// Deletes the file at `url` from the store `cache` (both media), and every other part
    /// when `url` is the first part of a split set (`NAME-00001-of-0000N.gguf`). Resolves to
    /// the number of files deleted (0 when none was there).
    #[wasm_bindgen(js_name = deleteStored, unchecked_return_type = "Promise<number>")]
    pub fn delete_stored(url: String, cache: String) -> Promise {
        spawn_promise(delete(url, cache))
    }
}
