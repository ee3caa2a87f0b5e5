//! Browser tests of the GPU load that reads a model's files a layer at a time: a `File` (and
//! every part of a split set as Files, in any order) and a download the Origin Private File
//! System store holds whole go to WebGPU without the page holding the files
//! (`weightsReadByRange`), with the same greedy tokens as the load of the bytes; a URL's first
//! visit is written to the store as it arrives and read back the same way, the page holding at
//! most the largest tensor and 64 MiB more at any time; the CPU backend reads a File so too
//! (with the tokens of its own load of the bytes); bytes are still read whole; a File shorter than its header says is refused naming it. The tiny Llama on
//! SwiftShader, and for the memory bound a deep copy of the 256-wide one.

#![cfg(target_arch = "wasm32")]

use crate::common;

use common::browser_log as log;
use emberlm::web::Engine;
use js_sys::{Array, Reflect, Uint8Array};
use serde_json::{json, Value};
use wasm_bindgen::prelude::*;
use wasm_bindgen_test::wasm_bindgen_test;
use web_sys::File;

use common::web_engine::open_info as open;
use common::web_engine::*;

const FIXTURE: &str = "tiny-llama-q4_1.gguf";

fn file(bytes: &[u8], name: &str) -> File {
    let parts = Array::of1(&Uint8Array::from(bytes));
    File::new_with_u8_array_sequence(&parts, name).unwrap()
}

fn on_gpu() -> Value {
    json!({ "contextLength": 64, "backend": "gpu" })
}

/// A new private file system store's name, starting with `what`, and the options of a WebGPU
/// load that keeps its downloads there.
fn in_new_store(what: &str) -> (String, Value) {
    let store = unique(what);
    let options =
        json!({ "cache": store, "storage": "opfs", "contextLength": 64, "backend": "gpu" });
    (store, options)
}

/// The greedy tokens of `bytes` loaded whole on WebGPU (what a load read by range must give).
pub(crate) async fn whole_tokens(bytes: &[u8]) -> Value {
    let (whole, _) = open(Uint8Array::from(bytes).into(), &on_gpu())
        .await
        .unwrap();
    generate_greedy(&whole).await["tokens"].clone()
}

/// The SHA-256 of `bytes` in hex, as the `sha256` option takes it.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[wasm_bindgen_test]
async fn a_file_goes_to_the_gpu_a_layer_at_a_time() {
    let bytes = fixture(FIXTURE);
    let (whole, info) = open(Uint8Array::from(bytes).into(), &on_gpu())
        .await
        .unwrap();
    assert_eq!(info["weightsReadByRange"], false, "bytes are read whole");
    let want = generate_greedy(&whole).await["tokens"].clone();
    let weight_bytes = info["model"]["weightBytes"].clone();

    // a File: read by range, the upload's progress ends at the weights' bytes
    let uploads = Array::new();
    let seen = uploads.clone();
    let on_progress = Closure::<dyn Fn(JsValue)>::new(move |event: JsValue| {
        seen.push(&event);
    });
    let options = js(&on_gpu());
    Reflect::set(
        &options,
        &"onProgress".into(),
        on_progress.as_ref().unchecked_ref(),
    )
    .unwrap();
    let engine = Engine::open(file(bytes, FIXTURE).into(), options)
        .await
        .unwrap_or_else(|e| panic!("{}", message(&e)));
    let info = rust(&engine.info().unwrap());
    assert_eq!(info["weightsReadByRange"], true, "{info}");
    assert_eq!(info["runsOn"], "gpu", "{info}");
    assert_eq!(info["model"]["name"], FIXTURE, "{info}");
    assert_eq!(info["model"]["weightBytes"], weight_bytes, "{info}");
    assert_eq!(generate_greedy(&engine).await["tokens"], want);
    let last_upload = uploads
        .iter()
        .map(|e| rust(&e))
        .rfind(|e| e["phase"] == "upload")
        .expect("upload progress");
    assert_eq!(last_upload["loaded"], weight_bytes, "{last_upload}");
    log(&format!("a File read by range: tokens {want}"));

    // the CPU backend reads the File so too, each matrix its own as it comes (in tiles where
    // the module has them), and answers as the bytes read whole do there
    let on_cpu = json!({ "contextLength": 64, "backend": "cpu" });
    let (whole_cpu, info) = open(Uint8Array::from(bytes).into(), &on_cpu).await.unwrap();
    assert_eq!(
        info["weightsReadByRange"], false,
        "bytes are read whole: {info}"
    );
    let want_cpu = generate_greedy(&whole_cpu).await["tokens"].clone();
    let loads = Array::new();
    let seen = loads.clone();
    let on_load = Closure::<dyn Fn(JsValue)>::new(move |event: JsValue| {
        seen.push(&event);
    });
    let options = js(&on_cpu);
    Reflect::set(
        &options,
        &"onProgress".into(),
        on_load.as_ref().unchecked_ref(),
    )
    .unwrap();
    let engine = Engine::open(file(bytes, FIXTURE).into(), options)
        .await
        .unwrap_or_else(|e| panic!("{}", message(&e)));
    let info = rust(&engine.info().unwrap());
    assert_eq!(info["weightsReadByRange"], true, "{info}");
    assert_eq!(info["runsOn"], "cpu", "{info}");
    assert_eq!(info["model"]["weightBytes"], weight_bytes, "{info}");
    assert_eq!(generate_greedy(&engine).await["tokens"], want_cpu);
    let last_load = loads
        .iter()
        .map(|e| rust(&e))
        .rfind(|e| e["phase"] == "load")
        .expect("load progress");
    assert_eq!(last_load["loaded"], weight_bytes, "{last_load}");

    // a File cut short inside its tensors: refused, naming the file
    let cut = file(&bytes[..bytes.len() - 100], "cut.gguf");
    let err = open(cut.into(), &on_gpu())
        .await
        .err()
        .expect("a short file is refused");
    assert!(err.contains("cut.gguf"), "{err}");
}

#[wasm_bindgen_test]
async fn a_split_set_of_files_reads_by_range_in_any_order() {
    let test = "a_split_set_of_files_reads_by_range_in_any_order";
    let mut parts = Vec::new();
    for k in [2, 3, 1] {
        let name = format!("tiny-llama-q4_1-0000{k}-of-00003.gguf");
        let Some(url) = common::fixture_url(test, &format!("split/{name}")) else {
            return;
        };
        let bytes = common::fetch_bytes(&url).await.unwrap();
        parts.push(JsValue::from(file(&bytes, &name)));
    }
    let want = whole_tokens(fixture(FIXTURE)).await;
    let list: Array = parts.into_iter().collect();
    let (engine, info) = open(list.into(), &on_gpu()).await.unwrap();
    assert_eq!(info["weightsReadByRange"], true, "{info}");
    assert_eq!(
        info["model"]["name"], "tiny-llama-q4_1-00001-of-00003.gguf",
        "{info}"
    );
    assert_eq!(generate_greedy(&engine).await["tokens"], want);
}

#[wasm_bindgen_test]
async fn a_download_goes_to_the_store_and_is_read_back_by_range() {
    let test = "a_download_goes_to_the_store_and_is_read_back_by_range";
    let Some(url) = common::fixture_url(test, FIXTURE) else {
        return;
    };
    let want = whole_tokens(fixture(FIXTURE)).await;
    let (_, options) = in_new_store("ranged");
    // the first visit: downloaded into the store, then read from there a layer at a time
    let (first, info) = open(url.as_str().into(), &options).await.unwrap();
    assert_eq!(info["storedInCache"], true, "{info}");
    assert_eq!(info["loadedFromCache"], false, "{info}");
    assert_eq!(info["bytesDownloaded"], fixture(FIXTURE).len(), "{info}");
    assert_eq!(info["weightsReadByRange"], true, "{info}");
    assert_eq!(generate_greedy(&first).await["tokens"], want);
    let (next, info) = open(url.as_str().into(), &options).await.unwrap();
    assert_eq!(info["loadedFromCache"], true, "{info}");
    assert_eq!(info["bytesDownloaded"], 0, "{info}");
    assert_eq!(info["weightsReadByRange"], true, "{info}");
    assert_eq!(info["model"]["name"], FIXTURE, "{info}");
    assert_eq!(generate_greedy(&next).await["tokens"], want);
    // with a sha256 to check, the stored copy is checked, then read by range
    let mut checked = options.clone();
    let digest = sha256_hex(fixture(FIXTURE));
    checked["sha256"] = json!(digest);
    let (_, info) = open(url.as_str().into(), &checked).await.unwrap();
    assert_eq!(info["weightsReadByRange"], true, "{info}");
    assert_eq!(info["loadedFromCache"], true, "{info}");
    assert_eq!(info["bytesDownloaded"], 0, "{info}");

    // a stored copy that no longer matches is fetched again, checked as it arrives
    let store = checked["cache"].as_str().unwrap().to_string();
    crate::storage::overwrite_first_part(&store, &url, b"not the model").await;
    let (again, info) = open(url.as_str().into(), &checked).await.unwrap();
    assert_eq!(info["weightsReadByRange"], true, "{info}");
    assert_eq!(info["bytesDownloaded"], fixture(FIXTURE).len(), "{info}");
    assert_eq!(generate_greedy(&again).await["tokens"], want);

    // a digest the file does not have: refused naming both digests, nothing kept
    let mut wrong = checked.clone();
    let (_, fresh) = in_new_store("ranged-wrong");
    wrong["cache"] = fresh["cache"].clone();
    wrong["sha256"] = json!("0".repeat(64));
    let e = open(url.as_str().into(), &wrong)
        .await
        .err()
        .expect("a wrong digest is refused");
    assert!(e.starts_with("Format") && e.contains(&digest), "{e}");
    let listed = wasm_bindgen_futures::JsFuture::from(Engine::list_stored(
        fresh["cache"].as_str().unwrap().to_string(),
    ))
    .await
    .unwrap();
    assert_eq!(Array::from(&listed).length(), 0, "nothing kept");
}

/// Layers of [`deep_model`]: 40 of the 256-wide tiny Llama's 2.4 MB, a 95 MB file whose
/// largest tensor is 0.5 MiB.
const DEEP_LAYERS: usize = 40;

/// The 256-wide tiny Llama with its two layers repeated to [`DEEP_LAYERS`]: a file far larger
/// than any of its tensors, and its largest tensor's bytes.
fn deep_model() -> (Vec<u8>, usize) {
    use common::gguf_meta::{self, TensorBytes};
    use emberlm::format::gguf::{GgufHeader, GgufValue};
    let bytes = fixture("tiny-llama-256-f32.gguf");
    let header = GgufHeader::parse(bytes, "tiny-llama-256-f32.gguf").unwrap();
    let mut meta = header.metadata().to_vec();
    gguf_meta::set(
        &mut meta,
        "llama.block_count",
        GgufValue::U32(DEEP_LAYERS as u32),
    );
    let tensors: Vec<TensorBytes> = header
        .tensors()
        .iter()
        .map(|t| {
            let data = header.tensor_data(bytes, t).unwrap().to_vec();
            (t.name.clone(), t.dims.clone(), t.dtype.ggml_id(), data)
        })
        .collect();
    let (layers, rest): (Vec<_>, Vec<_>) =
        tensors.into_iter().partition(|t| t.0.starts_with("blk."));
    let mut out = rest;
    for i in 0..DEEP_LAYERS {
        let from = format!("blk.{}.", i % 2);
        for (name, dims, dtype, data) in layers.iter().filter(|t| t.0.starts_with(&from)) {
            let name = name.replacen(&from, &format!("blk.{i}."), 1);
            out.push((name, dims.clone(), *dtype, data.clone()));
        }
    }
    let largest = out.iter().map(|t| t.3.len()).max().unwrap_or(0);
    (gguf_meta::write_with_tensors(&meta, &out), largest)
}

/// A URL's first visit on WebGPU holds at most its largest tensor and 64 MiB more of wasm
/// memory at any time (what Rust allocates: the download's part in flight, a layer's tensors,
/// the tokenizer), though its file is 95 MB; and it answers as the file's bytes loaded whole do.
#[wasm_bindgen_test]
async fn a_first_visit_holds_no_more_than_a_tensor_and_64_mib() {
    let (bytes, largest) = deep_model();
    let size = bytes.len();
    let blob =
        web_sys::Blob::new_with_u8_array_sequence(&Array::of1(&Uint8Array::from(bytes.as_slice())))
            .unwrap();
    let url = web_sys::Url::create_object_url_with_blob(&blob).unwrap();
    let want = whole_tokens(&bytes).await;
    drop(bytes);

    let (store, options) = in_new_store("deep");
    let before = crate::peak_alloc::reset_live_peak();
    let (engine, info) = open(url.as_str().into(), &options).await.unwrap();
    let held = crate::peak_alloc::live_peak().saturating_sub(before);
    let _ = web_sys::Url::revoke_object_url(&url);
    log(&format!(
        "a {size}-byte first visit held at most {held} bytes more than before it (largest \
         tensor {largest})"
    ));
    assert_eq!(info["weightsReadByRange"], true, "{info}");
    assert_eq!(info["bytesDownloaded"], size, "{info}");
    let bound = largest + (64 << 20);
    assert!(
        held <= bound,
        "the load held {held} bytes at once, more than the largest tensor and 64 MiB ({bound})"
    );
    assert_eq!(generate_greedy(&engine).await["tokens"], want);
    let _ = wasm_bindgen_futures::JsFuture::from(Engine::delete_stored(url, store)).await;
}

/// A first visit written to the store as it arrives survives a broken connection as the whole
/// read does: resumed with `Range` (only the rest is fetched), started over where the server
/// ignores ranges, and, where every retry breaks, kept for the next visit, which asks only for
/// the rest; every load reads the model back by range with the tokens of the bytes.
#[wasm_bindgen_test]
async fn a_first_visit_broken_off_resumes_or_restarts_by_range() {
    let test = "a_first_visit_broken_off_resumes_or_restarts_by_range";
    let size = fixture(FIXTURE).len();
    let (half, cut) = (size / 2, 50_000);
    let want = whole_tokens(fixture(FIXTURE)).await;
    for (query, downloaded) in [
        (format!("drop={half}&id={}", unique("r-resume")), size),
        (
            format!("drop={half}&id={}&norange=1", unique("r-restart")),
            half + size,
        ),
    ] {
        let Some(url) = common::fixture_url(test, FIXTURE).map(|u| format!("{u}?{query}")) else {
            return;
        };
        let (engine, info) = open(url.as_str().into(), &in_new_store("r-broken").1)
            .await
            .unwrap_or_else(|e| panic!("{query}: {e}"));
        assert_eq!(info["weightsReadByRange"], true, "{query}: {info}");
        assert_eq!(info["bytesDownloaded"], downloaded, "{query}: {info}");
        assert_eq!(generate_greedy(&engine).await["tokens"], want, "{query}");
    }

    // every retry breaks: the load fails keeping what came, the next asks for the rest
    let query = format!("drop={cut}&id={}&times=4", unique("r-visit"));
    let Some(url) = common::fixture_url(test, FIXTURE).map(|u| format!("{u}?{query}")) else {
        return;
    };
    // with a digest to check, over the parts kept and the rest
    let (_, mut options) = in_new_store("r-visit");
    options["sha256"] = json!(sha256_hex(fixture(FIXTURE)));
    let e = open(url.as_str().into(), &options)
        .await
        .err()
        .expect("every retry broke: the load fails");
    assert!(
        e.starts_with("Io") && e.contains(&format!("{cut} bytes are kept")),
        "{e}"
    );
    let (engine, info) = open(url.as_str().into(), &options)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(info["bytesDownloaded"], size - cut, "{info}");
    assert_eq!(info["weightsReadByRange"], true, "{info}");
    assert_eq!(generate_greedy(&engine).await["tokens"], want);
}

/// A first visit whose file does not fit the store's quota (`navigator.storage.estimate()`
/// answers 1000 bytes free) fails before any byte is written, with a `Quota` error giving the
/// bytes needed and free; the store holds nothing of it.
#[wasm_bindgen_test]
async fn a_first_visit_past_the_quota_is_refused_before_writing() {
    let test = "a_first_visit_past_the_quota_is_refused_before_writing";
    let Some(url) = common::fixture_url(test, FIXTURE) else {
        return;
    };
    let (store, options) = in_new_store("quota");
    let storage = Reflect::get(&js_sys::global(), &"navigator".into())
        .and_then(|n| Reflect::get(&n, &"storage".into()))
        .unwrap();
    let small = js_sys::Function::new_no_args("return Promise.resolve({ quota: 1000, usage: 0 })");
    Reflect::set(&storage, &"estimate".into(), &small).unwrap();
    let result = open(url.as_str().into(), &options).await;
    // the browser's own estimate again
    Reflect::delete_property(
        storage.unchecked_ref::<js_sys::Object>(),
        &"estimate".into(),
    )
    .unwrap();
    let e = result.err().expect("a file past the quota is refused");
    let size = fixture(FIXTURE).len();
    assert!(
        e.starts_with("Quota") && e.contains(&size.to_string()) && e.contains("1000"),
        "{e}"
    );
    let listed = wasm_bindgen_futures::JsFuture::from(Engine::list_stored(store))
        .await
        .unwrap();
    assert_eq!(rust(&listed), json!([]), "nothing of the file is kept");
}
