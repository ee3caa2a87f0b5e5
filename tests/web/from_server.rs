//! Browser tests of a load from a URL that reads the server's files by HTTP range: without a
//! store, WebGPU gets the weights a few layers per request and the page never holds the file
//! (the same greedy tokens as the bytes, a handful of requests, the bytes counted), and the CPU
//! backend reads it so too (the tokens of its own load of the bytes); a server
//! without ranges is read whole as before; a broken range read is asked again; and a model that
//! cannot run here (a context past the model's) is refused after its header, before the
//! download, on either backend and with a store. The tiny Llamas from the test server
//! (`tools/serve.mjs`, which counts what it served per `id`), WebGPU on SwiftShader.

#![cfg(target_arch = "wasm32")]

use crate::common;

use common::browser_log as log;
use emberlm::web::Engine;
use serde_json::{json, Value};
use wasm_bindgen_test::wasm_bindgen_test;

use common::web_engine::*;

const FIXTURE: &str = "tiny-llama-q4_1.gguf";
/// A fixture many times larger than the first header read (64 KiB).
const LARGER: &str = "tiny-llama-256-q4_k_m.gguf";

/// What the test server sent for requests carrying `id`: (responses, body bytes).
async fn served(fixture_url: &str, id: &str) -> (u64, u64) {
    let root = fixture_url
        .split("tests/fixtures/")
        .next()
        .unwrap_or(fixture_url);
    let bytes = common::fetch_bytes(&format!("{root}__served?id={id}"))
        .await
        .unwrap();
    let counts: Value = serde_json::from_slice(&bytes).unwrap();
    (
        counts["requests"].as_u64().unwrap(),
        counts["bytes"].as_u64().unwrap(),
    )
}

#[wasm_bindgen_test]
async fn a_url_without_a_store_goes_to_the_gpu_by_range() {
    let test = "a_url_without_a_store_goes_to_the_gpu_by_range";
    let Some(base) = common::fixture_url(test, FIXTURE) else {
        return;
    };
    let size = fixture(FIXTURE).len() as u64;
    let want = crate::ranged::whole_tokens(fixture(FIXTURE)).await;
    let id = unique("by-range");
    let url = format!("{base}?id={id}");
    let (engine, info) = open_info(
        url.as_str().into(),
        &json!({ "contextLength": 64, "backend": "gpu" }),
    )
    .await
    .unwrap();
    assert_eq!(info["weightsReadByRange"], true, "{info}");
    assert_eq!(info["loadedFromCache"], false, "{info}");
    assert_eq!(info["storedInCache"], false, "{info}");
    let weight_bytes = info["model"]["weightBytes"].as_u64().unwrap();
    let downloaded = info["bytesDownloaded"].as_u64().unwrap();
    // the first byte, the first header read (64 KiB) and every tensor once
    assert!(
        downloaded >= weight_bytes && downloaded <= size + 65_536 + 1,
        "{downloaded} bytes downloaded for a {size}-byte file ({weight_bytes} of weights)"
    );
    assert_eq!(generate_greedy(&engine).await["tokens"], want);
    let (requests, bytes) = served(&base, &id).await;
    // (a browser may send a request twice where a kept-alive connection was closed)
    assert!(
        bytes >= downloaded && bytes <= downloaded + 16,
        "the server sent {bytes} bytes, the load counted {downloaded}"
    );
    // one request to open the file (sent twice at most), one for its header, then one per
    // group of tensors the upload asks for (the embedding, each layer, the rest), not one per
    // tensor: this model has 21 tensors in 2 layers
    assert!(requests <= 8, "{requests} requests");
    log(&format!(
        "a URL without a store on WebGPU: {requests} requests, {downloaded} bytes, tokens {want}"
    ));
}

/// The CPU backend reads a URL without a store by range too, each matrix its own as it comes:
/// the tokens of its load of the bytes, every tensor downloaded once.
#[wasm_bindgen_test]
async fn a_url_without_a_store_goes_to_the_cpu_by_range() {
    let test = "a_url_without_a_store_goes_to_the_cpu_by_range";
    let Some(base) = common::fixture_url(test, FIXTURE) else {
        return;
    };
    let bytes = fixture(FIXTURE);
    let on_cpu = json!({ "contextLength": 64, "backend": "cpu" });
    let (whole, _) = open_info(js_sys::Uint8Array::from(bytes).into(), &on_cpu)
        .await
        .unwrap();
    let want = generate_greedy(&whole).await["tokens"].clone();
    let url = format!("{base}?id={}", unique("cpu-by-range"));
    let (engine, info) = open_info(url.as_str().into(), &on_cpu).await.unwrap();
    assert_eq!(info["weightsReadByRange"], true, "{info}");
    assert_eq!(info["runsOn"], "cpu", "{info}");
    let downloaded = info["bytesDownloaded"].as_u64().unwrap();
    let weight_bytes = info["model"]["weightBytes"].as_u64().unwrap();
    assert!(
        downloaded >= weight_bytes && downloaded <= bytes.len() as u64 + 65_536 + 1,
        "{downloaded} bytes downloaded for a {}-byte file",
        bytes.len()
    );
    assert_eq!(generate_greedy(&engine).await["tokens"], want);
}

#[wasm_bindgen_test]
async fn a_server_without_ranges_is_read_whole() {
    let test = "a_server_without_ranges_is_read_whole";
    let Some(base) = common::fixture_url(test, FIXTURE) else {
        return;
    };
    let want = crate::ranged::whole_tokens(fixture(FIXTURE)).await;
    for backend in ["gpu", "cpu"] {
        let url = format!("{base}?norange=1&id={}", unique("whole"));
        let (engine, info) = open_info(
            url.as_str().into(),
            &json!({ "contextLength": 64, "backend": backend }),
        )
        .await
        .unwrap_or_else(|e| panic!("{backend}: {e}"));
        assert_eq!(info["weightsReadByRange"], false, "{backend}: {info}");
        assert_eq!(
            info["bytesDownloaded"],
            fixture(FIXTURE).len(),
            "{backend}: {info}"
        );
        if backend == "gpu" {
            assert_eq!(generate_greedy(&engine).await["tokens"], want);
        }
    }
}

/// A range read whose connection breaks mid-body is asked again (the same span), and the load
/// goes on with the right model.
#[wasm_bindgen_test]
async fn a_broken_range_read_is_asked_again() {
    let test = "a_broken_range_read_is_asked_again";
    let Some(base) = common::fixture_url(test, FIXTURE) else {
        return;
    };
    let want = crate::ranged::whole_tokens(fixture(FIXTURE)).await;
    let half = fixture(FIXTURE).len() * 3 / 4;
    let id = unique("broken-span");
    let url = format!("{base}?drop={half}&spans=1&times=2&id={id}");
    let (engine, info) = open_info(
        url.as_str().into(),
        &json!({ "contextLength": 64, "backend": "gpu" }),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(info["weightsReadByRange"], true, "{info}");
    assert_eq!(generate_greedy(&engine).await["tokens"], want);
    let (requests, _) = served(&base, &id).await;
    assert!(
        requests >= 4,
        "two broken reads asked again: {requests} requests"
    );

    // a span that breaks every time: the load fails naming the file and the bytes
    let url = format!(
        "{base}?drop={half}&spans=1&times=10&id={}",
        unique("broken")
    );
    let e = open_info(
        url.as_str().into(),
        &json!({ "contextLength": 64, "backend": "gpu" }),
    )
    .await
    .err()
    .expect("every read broke");
    assert!(
        e.starts_with("Io") && e.contains(FIXTURE) && e.contains("failed 4 times"),
        "{e}"
    );
}

/// A context past the model's is refused once the header is read, before the download: on
/// WebGPU, on the CPU backend and with a store (which is left empty); the server sent the
/// first byte and one header read, not the file.
#[wasm_bindgen_test]
async fn a_model_that_cannot_run_here_is_refused_before_its_download() {
    let test = "a_model_that_cannot_run_here_is_refused_before_its_download";
    let Some(base) = common::fixture_url(test, LARGER) else {
        return;
    };
    let size = fixture(LARGER).len() as u64;
    let store = unique("refused");
    for options in [
        json!({ "contextLength": 100_000, "backend": "gpu" }),
        json!({ "contextLength": 100_000, "backend": "cpu" }),
        json!({ "contextLength": 100_000, "backend": "gpu", "cache": store, "storage": "opfs" }),
    ] {
        let id = unique("refused");
        let url = format!("{base}?id={id}");
        let e = open_info(url.as_str().into(), &options)
            .await
            .err()
            .unwrap_or_else(|| panic!("{options}: a context of 100000 loaded"));
        assert!(
            e.contains("context") && e.contains("must be in 1..="),
            "{options}: {e}"
        );
        let (requests, bytes) = served(&base, &id).await;
        assert!(
            requests <= 3 && bytes <= 65_536 * 2 + 1 && bytes * 4 < size,
            "{options}: {requests} requests, {bytes} of {size} bytes sent before the refusal"
        );
    }
    let listed = wasm_bindgen_futures::JsFuture::from(Engine::list_stored(store))
        .await
        .unwrap();
    assert_eq!(js_sys::Array::from(&listed).length(), 0, "nothing stored");
}
