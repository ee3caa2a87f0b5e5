//! One model file from its URL: from the store when it holds the file whole; otherwise from the
//! network, written to the store as it streams in, resumed with an HTTP `Range` request when
//! the connection breaks (and on the next load, from what the store kept), and checked against
//! the caller's SHA-256 as the bytes arrive.

use js_sys::{Object, Promise, Reflect};
use sha2::{Digest, Sha256};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use web_sys::{Cache, Response};

use super::opfs::{self, js_text, OpfsStore};
use super::pump::{hash_stored, io, read_stored, Download, Sink, UrlFile};
use super::stored::Store;
use crate::error::{Error, Result};
use crate::store::range::{self, Resume};
use crate::store::{self as rules, StoredRecord};

#[wasm_bindgen]
extern "C" {
    /// The global `fetch` (a window's or a worker's), with its init object.
    #[wasm_bindgen(js_name = fetch, catch)]
    fn fetch_with(url: &str, init: &JsValue) -> std::result::Result<Promise, JsValue>;
}

/// How many times one load asks again after the connection broke (each time for the bytes not
/// yet received), waiting 0.25 s, 0.5 s, 1 s between.
const RETRIES: u32 = 3;

/// The response's header `name`, where present and readable.
pub(super) fn header(response: &Response, name: &str) -> Option<String> {
    response.headers().get(name).ok().flatten()
}

/// The response's `Content-Length`, 0 when absent.
pub(crate) fn content_length(response: &Response) -> u64 {
    header(response, "content-length")
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Waits `ms` milliseconds (the page's or the worker's `setTimeout`).
pub(super) async fn sleep(ms: u32) {
    let promise = Promise::new(&mut |resolve, _| {
        let set = Reflect::get(&js_sys::global(), &JsValue::from_str("setTimeout"));
        if let Ok(f) = set.and_then(|f| f.dyn_into::<js_sys::Function>()) {
            let _ = f.call2(&JsValue::UNDEFINED, &resolve, &JsValue::from(ms));
        } else {
            let _ = resolve.call0(&JsValue::UNDEFINED);
        }
    });
    let _ = JsFuture::from(promise).await;
}

/// `fetch(url)`, with `Range: bytes=FROM-` when `from > 0`.
async fn fetch(url: &str, from: u64) -> std::result::Result<Response, String> {
    fetch_range(url, from, None).await
}

/// `fetch(url)` for bytes `from..=last` (`Range: bytes=FROM-LAST`) or from `from` to the end
/// (`Range: bytes=FROM-`, none when `from` is 0 too). A request for a range goes past the
/// browser's HTTP cache (`cache: 'no-store'`): a model read by range would otherwise fill that
/// cache with its gigabytes, and the cache answers a range from what it kept of an earlier,
/// broken response (asking the server for another span than the one asked for here).
pub(super) async fn fetch_range(
    url: &str,
    from: u64,
    last: Option<u64>,
) -> std::result::Result<Response, String> {
    let init = Object::new();
    if from > 0 || last.is_some() {
        let _ = Reflect::set(
            &init,
            &JsValue::from_str("cache"),
            &JsValue::from_str("no-store"),
        );
    }
    if from > 0 || last.is_some() {
        let headers = Object::new();
        let span = match last {
            Some(last) => format!("bytes={from}-{last}"),
            None => format!("bytes={from}-"),
        };
        let _ = Reflect::set(
            &headers,
            &JsValue::from_str("Range"),
            &JsValue::from_str(&span),
        );
        let _ = Reflect::set(&init, &JsValue::from_str("headers"), &headers);
    }
    let promise = fetch_with(url, &init).map_err(|e| js_text(&e))?;
    JsFuture::from(promise)
        .await
        .map_err(|e| js_text(&e))?
        .dyn_into()
        .map_err(|_| "fetch did not return a Response".to_string())
}

/// What a Cache API cache holds for `url`: the response and its length (0 when unknown).
async fn cached(cache: &Cache, url: &str) -> Option<(Response, u64)> {
    let hit = JsFuture::from(cache.match_with_str(url)).await.ok()?;
    let response: Response = hit.dyn_into().ok()?;
    let total = content_length(&response);
    Some((response, total))
}

/// Reads `url` from the Cache API cache of the store's name, where an earlier version kept it,
/// writing it into the private file system as it is read and then deleting the cache's entry.
/// `None` when the cache does not hold it or it could not be read (the sink is then empty);
/// else whether the private file system now holds it.
async fn move_from_cache_api(
    d: &mut Download<'_>,
    s: &OpfsStore,
    cache: &Cache,
    url: &str,
    fits: &mut dyn FnMut(u64) -> Result<()>,
) -> Result<Option<bool>> {
    let Some((response, total)) = cached(cache, url).await else {
        return Ok(None);
    };
    let Some(body) = response.body() else {
        return Ok(None);
    };
    fits(total)?;
    d.sink.reserve(total);
    d.writer = s
        .begin(StoredRecord::started(url, total, None, None))
        .await
        .ok();
    if d.pump(&body, total).await.is_err() {
        d.writer = None;
        s.remove(url).await;
        d.restart(0, None, None).await;
        return Ok(None);
    }
    d.write_tail().await;
    let len = d.sink.len();
    let moved = match d.writer.take() {
        Some(mut w) => w.finish(len).await.is_ok() && d.store_failed.is_none(),
        None => false,
    };
    if moved {
        let _ = JsFuture::from(cache.delete_with_str(url)).await;
    } else {
        s.remove(url).await;
        if !d.sink.keep {
            // the bytes went to the store, which did not keep them: from the network instead
            d.store_failed = None;
            d.restart(0, None, None).await;
            return Ok(None);
        }
    }
    Ok(Some(moved))
}

/// Reads the file at `url`. `store` keeps it between loads; `digest` is the SHA-256 the caller
/// gave for it. `fits(total)` is called with the file's length as soon as it is known, before
/// its body is read (to refuse a file the page cannot hold). `progress(loaded, total)` reports
/// the bytes read so far (total 0 while unknown).
///
/// With `keep` false the file goes to the store only (the Origin Private File System): memory
/// holds one part at a time, the returned bytes are empty, and a store that cannot keep the
/// file is an error rather than a notice. A digest is then checked over the bytes as they
/// arrive and over what the store held before (a stored copy, or the parts of a download cut
/// off), read back a slice at a time.
pub(crate) async fn read_url(
    url: &str,
    store: Option<&Store>,
    digest: Option<&[u8; 32]>,
    fits: &mut dyn FnMut(u64) -> Result<()>,
    progress: &mut dyn FnMut(u64, u64),
    keep: bool,
) -> Result<UrlFile> {
    if !keep && !matches!(store, Some(Store::Opfs(..))) {
        return Err(Error::invalid(
            "storage",
            "a download kept only in the store needs the private file system",
        ));
    }
    let mut d = Download {
        name: url,
        sink: Sink::new(keep, digest.is_some()),
        writer: None,
        store_failed: None,
        progress,
    };
    let mut out = UrlFile {
        bytes: Vec::new(),
        from_store: false,
        downloaded: 0,
        stored: false,
        cache_after: None,
        persisted: None,
        store_error: None,
    };
    // the file's length as first announced (0: unknown)
    let mut expected = 0u64;
    let matches = |got: Option<[u8; 32]>| match (digest, got) {
        (Some(want), Some(got)) => *want == got,
        _ => true,
    };

    match store {
        Some(Store::Opfs(s, earlier)) => {
            let entry = s.entry(url).await?;
            if let (None, Some(cache)) = (&entry, earlier) {
                if let Some(moved) = move_from_cache_api(&mut d, s, cache, url, fits).await? {
                    if matches(d.sink.digest()) {
                        return Ok(d.into_stored_file(moved));
                    }
                    d.forget_stored(s, digest).await;
                }
            }
            if let Some(entry) = entry {
                let record = entry.record.clone();
                if let (true, false, Some(r)) = (entry.is_complete(), keep, &record) {
                    // read from the store a range at a time, later: nothing to read now but
                    // the digest, over the stored copy
                    if digest.is_none() {
                        return Ok(d.into_stored_file(true));
                    }
                    if hash_stored(&mut d, &entry.blob()?, r.bytes, r.bytes).await
                        && matches(d.sink.digest())
                    {
                        return Ok(d.into_stored_file(true));
                    }
                    // unreadable, or not the file the caller named: fetched again
                    d.forget_stored(s, digest).await;
                } else if let (true, Some(r)) = (entry.is_complete(), &record) {
                    fits(r.bytes)?;
                    if read_stored(&mut d, &entry.blob()?, r.bytes).await
                        && matches(d.sink.digest())
                    {
                        return Ok(d.into_stored_file(true));
                    }
                    // unreadable, or not the file the caller named: fetched again
                    d.forget_stored(s, digest).await;
                } else if let Some(r) = record.filter(|r| {
                    !r.complete
                        && !entry.gaps
                        && entry.stored > 0
                        && (r.bytes == 0 || entry.stored < r.bytes)
                }) {
                    // a download cut off on an earlier visit: its parts, then the rest
                    fits(r.bytes)?;
                    // the parts stay in the store, their bytes hashed where a digest is to be
                    // checked; the rest is written after them
                    let hashed = match (keep, digest) {
                        (false, Some(_)) => {
                            hash_stored(&mut d, &entry.blob()?, entry.stored, r.bytes).await
                        }
                        _ => true,
                    };
                    if !keep && hashed {
                        d.sink.base = entry.stored;
                        expected = r.bytes;
                        d.writer = Some(s.resume(r, entry.parts.len(), entry.stored).await?);
                    } else if !keep {
                        s.remove(url).await;
                        d.restart(0, None, None).await;
                    } else if read_stored(&mut d, &entry.blob()?, r.bytes).await {
                        expected = r.bytes;
                        d.writer = Some(s.resume(r, entry.parts.len(), entry.stored).await?);
                    } else {
                        s.remove(url).await;
                        d.restart(0, None, None).await;
                    }
                } else {
                    s.remove(url).await;
                }
            }
        }
        Some(Store::CacheApi(cache)) => {
            if let Some((response, total)) = cached(cache, url).await {
                fits(total)?;
                d.sink.reserve(total);
                if let Some(body) = response.body() {
                    if d.pump(&body, total).await.is_ok() && matches(d.sink.digest()) {
                        return Ok(d.into_stored_file(true));
                    }
                }
                let _ = JsFuture::from(cache.delete_with_str(url)).await;
                d.restart(0, None, None).await;
                d.sink.hasher = digest.map(|_| Sha256::new());
            }
        }
        None => {}
    }

    let mut fitted = expected > 0;
    let mut failures = 0u32;
    let mut asked_room = d.writer.is_some();
    // navigator.storage.persist(), asked when the download starts going to the store
    let mut asked_persist: Option<js_sys::Promise> = None;
    loop {
        let from = d.sink.len();
        let response = match fetch(url, from).await {
            Ok(r) => r,
            // A store that failed on the last break ends a load that must keep its download,
            // as a body break does
            Err(e) if from > 0 && !keep && d.store_failed.is_some() => {
                remove_stored(store, url).await;
                let why = d.store_failed.take().unwrap_or_default();
                return Err(io(
                    url,
                    format!("the store could not keep the download ({why}), and the connection broke: {e}"),
                ));
            }
            Err(_) if from > 0 && failures < RETRIES => {
                failures += 1;
                sleep(125 << failures).await;
                continue;
            }
            // A resumed request that fails before its response (as Firefox reports a
            // connection broken early) is the same break as one cut mid-body.
            Err(e) if from > 0 => return Err(broke_off(url, &d, expected, &e)),
            Err(e) => return Err(io(url, format!("the download failed: {e}"))),
        };
        let status = response.status();
        let length = content_length(&response);
        let etag = header(&response, "etag");
        let modified = header(&response, "last-modified");
        let body = response.body();
        let cancel = || {
            if let Some(b) = &body {
                let _ = b.cancel();
            }
        };
        if from > 0 {
            let mut decision = range::resume(
                from,
                status,
                header(&response, "content-range").as_deref(),
                length,
                expected,
            );
            let changed = d
                .writer
                .as_ref()
                .is_some_and(|w| !w.record().same_file(etag.as_deref(), modified.as_deref()));
            if decision == Resume::Continue && changed {
                decision = Resume::Refetch("the server's ETag or Last-Modified changed".into());
            }
            match decision {
                Resume::Continue => {}
                Resume::FromStart => {
                    expected = length;
                    d.restart(length, etag.clone(), modified.clone()).await;
                }
                Resume::Refetch(reason) => {
                    cancel();
                    failures += 1;
                    if failures > RETRIES {
                        return Err(io(url, format!("the download cannot resume: {reason}")));
                    }
                    expected = 0;
                    d.restart(0, None, None).await;
                    continue;
                }
                Resume::Failed(s) => {
                    cancel();
                    return Err(io(url, format!("HTTP {s} {}", response.status_text())));
                }
            }
        } else {
            if !response.ok() {
                cancel();
                return Err(io(url, format!("HTTP {status} {}", response.status_text())));
            }
            expected = length;
            if d.writer.is_some() {
                // starting over after a refetch: the record names the file now sent
                d.restart(length, etag.clone(), modified.clone()).await;
            }
        }
        if !fitted && expected > 0 {
            if let Err(e) = fits(expected) {
                cancel();
                return Err(e);
            }
            fitted = true;
        }
        d.sink.reserve(expected.saturating_sub(d.sink.len()));
        if let (Some(Store::Opfs(s, _)), false) = (store, asked_room) {
            asked_room = true;
            if let Some((quota, used)) = opfs::estimate().await {
                let what = format!("{} in store `{}`", url_file_name(url), s.name());
                if let Err(e) = rules::check_room(&what, expected.saturating_sub(from), quota, used)
                {
                    cancel();
                    return Err(e);
                }
            }
            asked_persist = opfs::ask_persist();
            let record = StoredRecord::started(url, expected, etag.clone(), modified.clone());
            match s.begin(record).await {
                Ok(w) => d.writer = Some(w),
                Err(e) if !keep => {
                    cancel();
                    return Err(io(
                        url,
                        format!("the store could not keep the download: {e}"),
                    ));
                }
                Err(e) => d.store_failed = Some(e.to_string()),
            }
        }
        let body = body.ok_or_else(|| io(url, "the response has no body"))?;
        let before = d.sink.len();
        let result = d.pump(&body, expected).await;
        out.downloaded = out
            .downloaded
            .saturating_add(d.sink.len().saturating_sub(before));
        match result {
            Ok(()) => break,
            Err(e) if !keep && d.store_failed.is_some() => {
                remove_stored(store, url).await;
                return Err(io(url, e));
            }
            Err(e) => {
                d.write_tail().await;
                failures += 1;
                if failures > RETRIES {
                    return Err(broke_off(url, &d, expected, &e));
                }
                sleep(125 << failures).await;
            }
        }
    }

    let got = d.sink.digest();
    if let (Some(want), Some(got)) = (digest, got) {
        if let Err(e) = rules::check_digest(&url_file_name(url), want, &got) {
            // not the file the caller named: nothing of it is kept
            if let Some(Store::Opfs(s, _)) = store {
                s.remove(url).await;
            }
            return Err(e);
        }
    }
    let len = d.sink.len();
    d.write_tail().await;
    if let Some(w) = d.writer.as_mut() {
        match w.finish(len).await {
            Ok(()) => out.stored = true,
            Err(e) => d.store_failed = Some(e.to_string()),
        }
    }
    if let Some(why) = d.store_failed.take() {
        remove_stored(store, url).await;
        if !keep {
            return Err(io(
                url,
                format!("the store could not keep the download: {why}"),
            ));
        }
        out.stored = false;
        out.store_error = Some(why);
    }
    if let Some(Store::CacheApi(cache)) = store {
        out.cache_after = Some(cache.clone());
    }
    out.bytes = d.sink.bytes;
    out.persisted = opfs::persist_answer(asked_persist).await;
    Ok(out)
}

/// The error of a download that broke off with `why` after every retry: where, and what the
/// store keeps of it for the next load.
fn broke_off(url: &str, d: &Download, expected: u64, why: &str) -> Error {
    let kept = match &d.writer {
        Some(w) => format!(
            "; {} bytes are kept in the store and the next load asks for the rest",
            w.committed()
        ),
        None => String::new(),
    };
    io(
        url,
        format!(
            "the download broke off at {} of {} bytes after {RETRIES} retries: {why}{kept}",
            d.sink.len(),
            expected
        ),
    )
}

/// Removes what the private file system store holds of `url`.
async fn remove_stored(store: Option<&Store>, url: &str) {
    if let Some(Store::Opfs(s, _)) = store {
        s.remove(url).await;
    }
}

/// The last path segment of a URL, without query or fragment.
pub(crate) fn url_file_name(url: &str) -> String {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    path.rsplit('/')
        .find(|s| !s.is_empty())
        .unwrap_or("model.gguf")
        .to_string()
}
