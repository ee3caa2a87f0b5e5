//! What the browser itself says about its WebGPU adapter (wasm32 only).
//!
//! wgpu's WebGPU backend reports only `GPUAdapterInfo.description` as the name (empty in
//! Chromium) and only the features it can map, so `subgroups` never shows. Asking
//! `navigator.gpu` directly gives an adapter name a reader can recognise (vendor, architecture)
//! and the browser's full feature list.

use js_sys::{Function, Promise, Reflect};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;

/// The browser's own description of the adapter it would hand out.
pub struct BrowserAdapter {
    /// `vendor architecture device description`, skipping empty parts.
    pub name: String,
    /// Every entry of `GPUAdapter.features`.
    pub features: Vec<String>,
}

fn get(obj: &JsValue, key: &str) -> Option<JsValue> {
    Reflect::get(obj, &JsValue::from_str(key))
        .ok()
        .filter(|v| !v.is_undefined() && !v.is_null())
}

/// Asks `navigator.gpu.requestAdapter()` (in a window or a worker); `None` when any step fails,
/// since this only enriches the report.
pub async fn describe(power_preference: &str) -> Option<BrowserAdapter> {
    let gpu = get(&get(&js_sys::global(), "navigator")?, "gpu")?;
    let request: Function = get(&gpu, "requestAdapter")?.dyn_into().ok()?;
    let options = js_sys::Object::new();
    Reflect::set(
        &options,
        &JsValue::from_str("powerPreference"),
        &JsValue::from_str(power_preference),
    )
    .ok()?;
    let promise: Promise = request.call1(&gpu, &options).ok()?.dyn_into().ok()?;
    let adapter = JsFuture::from(promise).await.ok()?;
    if adapter.is_null() || adapter.is_undefined() {
        return None;
    }
    let info = get(&adapter, "info");
    let name = ["vendor", "architecture", "device", "description"]
        .iter()
        .filter_map(|k| info.as_ref().and_then(|i| get(i, k)))
        .filter_map(|v| v.as_string())
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let mut features: Vec<String> = get(&adapter, "features")
        .and_then(|set| js_sys::try_iter(&set).ok().flatten())
        .map(|iter| iter.filter_map(|v| v.ok()?.as_string()).collect())
        .unwrap_or_default();
    features.sort();
    Some(BrowserAdapter { name, features })
}
