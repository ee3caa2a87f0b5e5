//! Models kept in a Cache API cache (`Engine.load(url, { cache })` stores each file under its
//! URL): listed with their sizes, and deleted by URL, without loading anything.

use js_sys::{Array, Promise, Reflect};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use web_sys::{Cache, CacheStorage, Response};

use super::engine::Engine;
use super::{js_error, spawn_promise};
use crate::format::gguf_split::part_urls;
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

async fn list(cache_name: String) -> Result<JsValue, JsValue> {
    check_name(&cache_name)?;
    let out = Array::new();
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
        let entry = js_sys::Object::new();
        super::set(&entry, "url", &JsValue::from_str(&url));
        super::set(&entry, "bytes", &bytes);
        out.push(&entry);
    }
    Ok(out.into())
}

async fn delete(url: String, cache_name: String) -> Result<JsValue, JsValue> {
    check_name(&cache_name)?;
    let Some(cache) = existing(&cache_name).await? else {
        return Ok(JsValue::from_f64(0.0));
    };
    let urls = part_urls(&url).unwrap_or_else(|| vec![url]);
    let mut deleted = 0u32;
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

#[wasm_bindgen]
impl Engine {
    /// The files kept in the Cache API cache `cache` (the name given as `Engine.load`'s `cache`
    /// option), each `{ url, bytes }` (`bytes` null when the entry has no length). A split
    /// set's parts are listed each under its own URL. Resolves to an empty list when the cache
    /// does not exist (it is not created).
    #[wasm_bindgen(js_name = listStored, unchecked_return_type = "Promise<StoredFile[]>")]
    pub fn list_stored(cache: String) -> Promise {
        spawn_promise(list(cache))
    }

    /// Deletes the file at `url` from the Cache API cache `cache`, and every other part when
    /// `url` is the first part of a split set (`NAME-00001-of-0000N.gguf`). Resolves to the
    /// number of files deleted (0 when none was there).
    #[wasm_bindgen(js_name = deleteStored, unchecked_return_type = "Promise<number>")]
    pub fn delete_stored(url: String, cache: String) -> Promise {
        spawn_promise(delete(url, cache))
    }
}
