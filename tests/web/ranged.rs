//! Browser tests of the GPU load that reads a model's files a layer at a time: a `File` (and
//! every part of a split set as Files, in any order) and a download the Origin Private File
//! System store holds whole go to WebGPU without the page holding the files
//! (`weightsReadByRange`), with the same greedy tokens as the load of the bytes; the CPU
//! backend and bytes still read whole; a File shorter than its header says is refused naming
//! it. The tiny Llama on SwiftShader.

#![cfg(target_arch = "wasm32")]

use crate::common;

use common::browser_log as log;
use emberlm::web::Engine;
use js_sys::{Array, Reflect, Uint8Array};
use serde_json::{json, Value};
use wasm_bindgen::prelude::*;
use wasm_bindgen_test::wasm_bindgen_test;
use web_sys::File;

use common::web_engine::*;

const FIXTURE: &str = "tiny-llama-q4_1.gguf";

fn file(bytes: &[u8], name: &str) -> File {
    let parts = Array::of1(&Uint8Array::from(bytes));
    File::new_with_u8_array_sequence(&parts, name).unwrap()
}

fn on_gpu() -> Value {
    json!({ "contextLength": 64, "backend": "gpu" })
}

async fn open(source: JsValue, options: &Value) -> Result<(Engine, Value), String> {
    let engine = Engine::open(source, js(options))
        .await
        .map_err(|e| message(&e))?;
    let info = rust(&engine.info().map_err(|e| message(&e))?);
    Ok((engine, info))
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

    // the CPU backend reads the File whole
    let (_, info) = open(
        file(bytes, FIXTURE).into(),
        &json!({ "contextLength": 64, "backend": "cpu" }),
    )
    .await
    .unwrap();
    assert_eq!(info["weightsReadByRange"], false, "{info}");

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
    let (whole, _) = open(Uint8Array::from(fixture(FIXTURE)).into(), &on_gpu())
        .await
        .unwrap();
    let want = generate_greedy(&whole).await["tokens"].clone();
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
async fn a_stored_download_is_read_by_range_on_the_next_visit() {
    let test = "a_stored_download_is_read_by_range_on_the_next_visit";
    let Some(url) = common::fixture_url(test, FIXTURE) else {
        return;
    };
    let store = format!("ranged-{}", (js_sys::Math::random() * 1e12) as u64);
    let options = json!({
        "cache": store, "storage": "opfs", "contextLength": 64, "backend": "gpu"
    });
    let (first, info) = open(url.as_str().into(), &options).await.unwrap();
    assert_eq!(info["storedInCache"], true, "{info}");
    assert_eq!(
        info["weightsReadByRange"], false,
        "the first visit downloads: {info}"
    );
    let want = generate_greedy(&first).await["tokens"].clone();
    let (next, info) = open(url.as_str().into(), &options).await.unwrap();
    assert_eq!(info["loadedFromCache"], true, "{info}");
    assert_eq!(info["bytesDownloaded"], 0, "{info}");
    assert_eq!(info["weightsReadByRange"], true, "{info}");
    assert_eq!(info["model"]["name"], FIXTURE, "{info}");
    assert_eq!(generate_greedy(&next).await["tokens"], want);
    // with a sha256 to check, the stored copy is read whole (the digest covers every byte)
    let mut checked = options.clone();
    let digest: String = {
        use sha2::{Digest, Sha256};
        Sha256::digest(fixture(FIXTURE))
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    checked["sha256"] = json!(digest);
    let (_, info) = open(url.as_str().into(), &checked).await.unwrap();
    assert_eq!(info["weightsReadByRange"], false, "{info}");
    assert_eq!(info["loadedFromCache"], true, "{info}");
}
