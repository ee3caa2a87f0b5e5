//! The draft model of speculative decoding from JavaScript: `engine.loadDraft(source)`,
//! `engine.unloadDraft()` and `Engine.load(source, { draft })`.

use std::cell::RefCell;

use js_sys::Promise;
use std::rc::Rc;
use wasm_bindgen::prelude::*;

use super::handle::Engine;
use super::source::Source;
use super::types::EngineInfo;
use super::{js_error, spawn_promise};
use crate::engine;
use crate::loader::ModelFiles;
use crate::Error;

/// Fetches `source` (a URL, a Blob or bytes, as `Engine.load` takes) and loads it as the draft
/// model; `options` may give `name` and `cache` as for `Engine.load`. Refreshes `info`.
pub(super) async fn load_into(
    inner: &engine::Engine,
    info: &RefCell<EngineInfo>,
    source: JsValue,
    options: &JsValue,
) -> Result<(), JsValue> {
    // the same keys and checks as `Engine.load`; a draft takes only where its bytes come from
    let page = super::load::read(options).map_err(|e| js_error(&e))?;
    let other = page
        .options
        .given_names()
        .find(|n| !matches!(*n, "name" | "cache" | "storage" | "sha256"))
        .map(|n| page.options.spelled(n))
        .or_else(|| (!page.draft.is_undefined()).then(|| "draft".to_string()))
        .or_else(|| page.on_progress.is_some().then(|| "onProgress".to_string()));
    if let Some(other) = other {
        return Err(js_error(&Error::invalid(
            "options",
            format!(
                "`{other}`: a draft model takes only `name`, `cache`, `storage` and `sha256` (it \
                 runs with the model's settings)"
            ),
        )));
    }
    let name = page.options.text("name").map(String::from);
    let store = page.store().await.map_err(|e| js_error(&e))?;
    let digests = page.digests().map_err(|e| js_error(&e))?;
    let source = Source::from_js(&source).map_err(|e| js_error(&e))?;
    let fetched = source
        .read(name, store.as_ref(), digests.as_deref(), &mut |_, _| {})
        .await
        .map_err(|e| js_error(&e))?;
    let (files, to_cache) = super::source::into_files(fetched.parts);
    let files = ModelFiles::from_parts(files).map_err(|e| js_error(&e))?;
    // a draft that could not be stored still runs; the next load downloads it again
    let _ = super::source::put_in_cache(to_cache, &files).await;
    inner.load_draft(files).await.map_err(|e| js_error(&e))?;
    refresh(inner, info);
    Ok(())
}

fn refresh(inner: &engine::Engine, info: &RefCell<EngineInfo>) {
    if let Some(fresh) = inner.inspect(|s| info.borrow().rebuilt(s)) {
        *info.borrow_mut() = fresh;
    }
}

#[wasm_bindgen]
impl Engine {
    /// Loads a second, smaller model with the same vocabulary as the draft model of
    /// speculative decoding (`generate(..., { speculative: { method: 'draft' } })`), on the
    /// same device. `source` is what `Engine.load` takes; `options` may give `name` and
    /// `cache`. Replaces a draft loaded before; rejects when the vocabularies differ (the
    /// message names the first difference). `info().draft` names it afterwards.
    #[wasm_bindgen(js_name = loadDraft, unchecked_return_type = "Promise<void>")]
    pub fn load_draft(
        &self,
        #[wasm_bindgen(unchecked_param_type = "ModelSource")] source: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "{ name?: string; cache?: string }")]
        options: JsValue,
    ) -> Promise {
        let inner = Rc::clone(&self.inner);
        let info = Rc::clone(&self.info);
        spawn_promise(async move {
            load_into(&inner, &info, source, &options).await?;
            Ok(JsValue::UNDEFINED)
        })
    }

    /// Drops the draft model and frees its GPU memory.
    #[wasm_bindgen(js_name = unloadDraft, unchecked_return_type = "Promise<void>")]
    pub fn unload_draft(&self) -> Promise {
        let inner = Rc::clone(&self.inner);
        let info = Rc::clone(&self.info);
        spawn_promise(async move {
            inner.unload_draft().await.map_err(|e| js_error(&e))?;
            refresh(&inner, &info);
            Ok(JsValue::UNDEFINED)
        })
    }
}
