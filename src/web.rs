//! The JavaScript surface (wasm32 only): converts between JS and Rust values, nothing more.

use wasm_bindgen::prelude::*;

use crate::gpu::{GpuContext, GpuOptions};

/// Installs the panic hook so a Rust panic shows its message in the console.
#[wasm_bindgen(start)]
pub fn start() {
    console_error_panic_hook::set_once();
}

fn to_js<T: serde::Serialize>(value: &T) -> Result<JsValue, JsError> {
    let json = serde_json::to_string(value).map_err(|e| JsError::new(&e.to_string()))?;
    js_sys::JSON::parse(&json).map_err(|_| JsError::new("could not convert a value for JavaScript"))
}

/// Creates a GPU context and describes the adapter: `{ name, backend, deviceType, ...,
/// subgroups, shaderF16, limits }` (field names as in `AdapterReport`, snake_case).
#[wasm_bindgen(js_name = gpuInfo)]
pub async fn gpu_info() -> Result<JsValue, JsError> {
    let ctx = GpuContext::new(GpuOptions::default())
        .await
        .map_err(|e| JsError::new(&e.to_string()))?;
    to_js(ctx.report())
}

/// The crate version.
#[wasm_bindgen]
pub fn version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}
