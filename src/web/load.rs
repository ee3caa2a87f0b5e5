//! `Engine.load`'s options object read once: the JavaScript values it takes as they are
//! (`onProgress`, `draft`) set apart, every other key handed to
//! [`LoadOptions`](crate::engine::LoadOptions) as JSON, where it is checked by name (any
//! documented spelling; an unknown key refused naming the nearest known one).

use js_sys::{Function, Object};
use wasm_bindgen::{JsCast, JsValue};

use super::stored::Store;
use crate::engine::{LoadOptions, Surface};
use crate::error::{Error, Result};
use crate::store::Medium;

/// The options of one `Engine.load` call.
pub(super) struct PageLoad {
    /// Every option but the JavaScript values, checked.
    pub options: LoadOptions,
    /// `onProgress`.
    pub on_progress: Option<Function>,
    /// `draft`, as given (`undefined` when not).
    pub draft: JsValue,
}

/// Reads `options` (an object, or `undefined`/`null` for none).
pub(super) fn read(options: &JsValue) -> Result<PageLoad> {
    let mut out = PageLoad {
        options: LoadOptions::new(Surface::Page),
        on_progress: None,
        draft: JsValue::UNDEFINED,
    };
    if options.is_undefined() || options.is_null() {
        return Ok(out);
    }
    let Some(object) = options.dyn_ref::<Object>().filter(|_| options.is_object()) else {
        return Err(Error::invalid(
            "options",
            format!("load options must be an object, got {options:?}"),
        ));
    };
    for key in Object::keys(object).iter() {
        let Some(key) = key.as_string() else { continue };
        let value =
            js_sys::Reflect::get(object, &JsValue::from_str(&key)).unwrap_or(JsValue::UNDEFINED);
        if value.is_undefined() || value.is_null() {
            continue;
        }
        match LoadOptions::js_key(&key) {
            Some("onProgress") => {
                out.on_progress = Some(value.dyn_into().map_err(|_| {
                    Error::invalid("onProgress", format!("`{key}` must be a function"))
                })?);
            }
            Some(_) => out.draft = value,
            None => {
                let json = js_sys::JSON::stringify(&value)
                    .ok()
                    .and_then(|s| s.as_string())
                    .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok());
                // a function, a symbol or a BigInt: no JSON value to check
                let Some(json) = json else {
                    let what = value.js_typeof().as_string().unwrap_or_default();
                    return Err(out.options.refuse(&key, &format!("a {what}")));
                };
                out.options.set_json(&key, &json)?;
            }
        }
    }
    Ok(out)
}

impl PageLoad {
    /// The store `cache` names, opened in the medium `storage` chooses (`None` without
    /// `cache`, or where the browser has no storage and `storage` is `'auto'`). `storage`
    /// without `cache` is refused: it has no store to choose for.
    pub async fn store(&self) -> Result<Option<Store>> {
        let medium = self
            .options
            .text("storage")
            .map(Medium::parse)
            .transpose()?;
        let Some(name) = self.options.text("cache") else {
            if medium.is_some() {
                return Err(Error::invalid(
                    "storage",
                    format!(
                        "`{}` chooses where `cache` keeps files, but no `cache` is given (name \
                         the store: `cache: 'models'`)",
                        self.options.spelled("storage")
                    ),
                ));
            }
            return Ok(None);
        };
        if name.trim().is_empty() {
            return Err(Error::invalid(
                "cache",
                "must name a store (e.g. 'emberlm-models-v1')",
            ));
        }
        Store::open(name, medium.unwrap_or(Medium::Auto)).await
    }

    /// The `sha256` option's digests, one per file.
    pub fn digests(&self) -> Result<Option<Vec<[u8; 32]>>> {
        self.options
            .text("sha256")
            .map(crate::store::parse_digests)
            .transpose()
    }
}
