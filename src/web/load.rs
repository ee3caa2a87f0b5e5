//! `Engine.load`'s options object read once: the JavaScript values it takes as they are
//! (`onProgress`, `draft`) set apart, every other key handed to
//! [`LoadOptions`](crate::engine::LoadOptions) as JSON, where it is checked by name (any
//! documented spelling; an unknown key refused naming the nearest known one).

use js_sys::{Function, Object};
use wasm_bindgen::{JsCast, JsValue};

use crate::engine::{LoadOptions, Surface};
use crate::error::{Error, Result};

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
