//! Browser tests of where downloads are kept: the Origin Private File System store (written in
//! parts as the download streams in, read back on the next load, listed and deleted), a
//! download whose connection breaks resumed with a `Range` request within the load and, once
//! the load gave up, on the next one from the parts kept; a server without ranges restarted
//! cleanly; the `sha256` option checked on the download and on the stored copy (a corrupted or
//! truncated copy fetched again); the options' refusals. The tiny Llama from the test server,
//! whose `?drop=` faults break a response mid-body (`tools/serve.mjs`), on the CPU backend.

#![cfg(target_arch = "wasm32")]

use crate::common;

use common::browser_log as log;
use emberlm::store;
use emberlm::web::Engine;
use js_sys::{Reflect, Uint8Array};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::wasm_bindgen_test;
use web_sys::{
    FileSystemDirectoryHandle, FileSystemFileHandle, FileSystemGetDirectoryOptions,
    FileSystemWritableFileStream,
};

use common::web_engine::*;

const FIXTURE: &str = "tiny-llama-q4_1.gguf";

/// The fixture's URL on the test server with `query` appended.
fn url_with(test: &str, query: &str) -> Option<String> {
    common::fixture_url(test, FIXTURE).map(|u| format!("{u}?{query}"))
}

async fn load(url: &str, options: Value) -> Result<(Engine, Value), String> {
    open_info(url.into(), &options).await
}

/// The greedy tokens of the fixture loaded from its bytes (what every load must give).
async fn expected_tokens() -> Value {
    let engine = Engine::open(
        Uint8Array::from(fixture(FIXTURE)).into(),
        js(&json!({ "contextLength": 64, "backend": "cpu" })),
    )
    .await
    .unwrap_or_else(|e| panic!("{}", message(&e)));
    generate_greedy(&engine).await["tokens"].clone()
}

async fn listed(store_name: &str) -> Vec<Value> {
    let list = JsFuture::from(Engine::list_stored(store_name.into()))
        .await
        .unwrap_or_else(|e| panic!("{}", message(&e)));
    rust(&list).as_array().cloned().unwrap_or_default()
}

async fn folder(parent: &FileSystemDirectoryHandle, name: &str) -> FileSystemDirectoryHandle {
    let options = FileSystemGetDirectoryOptions::new();
    options.set_create(false);
    JsFuture::from(parent.get_directory_handle_with_options(name, &options))
        .await
        .unwrap_or_else(|e| panic!("folder {name}: {e:?}"))
        .dyn_into()
        .unwrap()
}

/// Replaces part 0 of `url`'s entry in the store `store_name` with `bytes`.
pub(crate) async fn overwrite_first_part(store_name: &str, url: &str, bytes: &[u8]) {
    let manager: web_sys::StorageManager = Reflect::get(
        &Reflect::get(&js_sys::global(), &"navigator".into()).unwrap(),
        &"storage".into(),
    )
    .unwrap()
    .dyn_into()
    .unwrap();
    let root: FileSystemDirectoryHandle = JsFuture::from(manager.get_directory())
        .await
        .unwrap()
        .dyn_into()
        .unwrap();
    let top = folder(&root, store::ROOT_FOLDER).await;
    let dir = folder(&top, &store::folder_name(store_name)).await;
    let entry = folder(&dir, &store::entry_name(url)).await;
    let handle: FileSystemFileHandle = JsFuture::from(entry.get_file_handle(&store::part_name(0)))
        .await
        .unwrap()
        .dyn_into()
        .unwrap();
    let writable: FileSystemWritableFileStream = JsFuture::from(handle.create_writable())
        .await
        .unwrap()
        .dyn_into()
        .unwrap();
    JsFuture::from(
        writable
            .write_with_js_u8_array(&Uint8Array::from(bytes))
            .unwrap(),
    )
    .await
    .unwrap();
    JsFuture::from(writable.close()).await.unwrap();
}

/// A download into the private file system is kept in parts and read back on the next load
/// (nothing downloaded, the same tokens), listed with its size and deleted by URL.
#[wasm_bindgen_test]
async fn an_opfs_store_keeps_a_download_and_reads_it_back() {
    let run = unique("fresh");
    let Some(url) = url_with("an_opfs_store_keeps_a_download_and_reads_it_back", &run) else {
        return;
    };
    let size = fixture(FIXTURE).len() as u64;
    let store_name = unique("emberlm-test-opfs");
    let expected = expected_tokens().await;
    let options =
        json!({ "cache": store_name, "storage": "opfs", "contextLength": 64, "backend": "cpu" });
    for (round, cached) in [(1, false), (2, true)] {
        let (engine, info) = load(&url, options.clone())
            .await
            .unwrap_or_else(|e| panic!("load {round}: {e}"));
        log(&format!(
            "opfs load {round}: loadedFromCache {}, bytesDownloaded {}, persisted {}",
            info["loadedFromCache"], info["bytesDownloaded"], info["persisted"]
        ));
        assert_eq!(info["storage"], "opfs", "{info}");
        assert_eq!(info["storageNotice"], Value::Null, "{info}");
        assert_eq!(info["loadedFromCache"], cached, "{info}");
        assert_eq!(info["storedInCache"], !cached, "{info}");
        let downloaded = if cached { 0.0 } else { size as f64 };
        assert_eq!(info["bytesDownloaded"].as_f64(), Some(downloaded), "{info}");
        assert_eq!(
            generate_greedy(&engine).await["tokens"],
            expected,
            "load {round}"
        );
    }
    let list = listed(&store_name).await;
    assert_eq!(
        list,
        vec![
            json!({ "url": url, "bytes": size, "total": size, "storage": "opfs", "complete": true })
        ]
    );
    let deleted = JsFuture::from(Engine::delete_stored(url.clone(), store_name.clone()))
        .await
        .unwrap_or_else(|e| panic!("{}", message(&e)));
    assert_eq!(deleted.as_f64(), Some(1.0));
    assert!(listed(&store_name).await.is_empty());
    // after deleting, the next load downloads again
    let (_, info) = load(&url, options).await.unwrap();
    assert_eq!(info["loadedFromCache"], false, "{info}");
}

/// A connection broken half-way is resumed within the load: with ranges only the rest is asked
/// for (bytes downloaded = the file); a server without ranges sends the whole file again, and
/// the load starts over cleanly (half + the file). Either way the model is right. Without a
/// store the download is whole (a `sha256` asks for it), with one it is written to the store as
/// it arrives.
#[wasm_bindgen_test]
async fn a_broken_download_resumes_or_restarts_within_the_load() {
    let test = "a_broken_download_resumes_or_restarts_within_the_load";
    let size = fixture(FIXTURE).len();
    let half = size / 2;
    let expected = expected_tokens().await;
    for (query, downloaded) in [
        (format!("drop={half}&id={}", unique("resume")), size),
        (
            format!("drop={half}&id={}&norange=1", unique("restart")),
            half + size,
        ),
    ] {
        let Some(url) = url_with(test, &query) else {
            return;
        };
        for store_name in [None, Some(unique("emberlm-test-broken"))] {
            let mut options = json!({ "contextLength": 64, "backend": "cpu" });
            match &store_name {
                Some(s) => options["cache"] = json!(s),
                // Without a store the CPU reads a server that answers ranges by range (the
                // `from_server` tests); a digest covers the whole file, so with one the load
                // downloads it whole, and that download's own resume is what this checks.
                None => options["sha256"] = json!(crate::ranged::sha256_hex(fixture(FIXTURE))),
            }
            // a fault id is spent once: a second round with a store needs its own
            let url = match &store_name {
                Some(_) => url.replace("&id=", "&id=s"),
                None => url.clone(),
            };
            let (engine, info) = load(&url, options)
                .await
                .unwrap_or_else(|e| panic!("{query}, store {store_name:?}: {e}"));
            log(&format!(
                "{query}, store {store_name:?}: bytesDownloaded {}",
                info["bytesDownloaded"]
            ));
            assert_eq!(
                info["bytesDownloaded"].as_f64(),
                Some(downloaded as f64),
                "{query}: {info}"
            );
            assert_eq!(
                generate_greedy(&engine).await["tokens"],
                expected,
                "{query}"
            );
            if let Some(s) = &store_name {
                let list = listed(s).await;
                assert_eq!(list.len(), 1, "{list:?}");
                assert_eq!(list[0]["complete"], true, "{list:?}");
                assert_eq!(list[0]["bytes"].as_f64(), Some(size as f64), "{list:?}");
            }
        }
    }
}

/// A load that gives up (the connection breaks on every retry) says so and keeps the bytes it
/// received; the next load asks only for the rest, and the file it assembles is right.
#[wasm_bindgen_test]
async fn a_download_cut_off_on_one_visit_resumes_on_the_next() {
    let size = fixture(FIXTURE).len();
    let cut = 50_000;
    // four breaks: the first response and its three retries
    let query = format!("drop={cut}&id={}&times=4", unique("visit"));
    let Some(url) = url_with(
        "a_download_cut_off_on_one_visit_resumes_on_the_next",
        &query,
    ) else {
        return;
    };
    let store_name = unique("emberlm-test-visit");
    let options = json!({ "cache": store_name, "contextLength": 64, "backend": "cpu" });
    let e = load(&url, options.clone())
        .await
        .err()
        .expect("every retry broke: the load fails");
    assert!(
        e.starts_with("Io")
            && e.contains("broke off")
            && e.contains(&format!("{cut} bytes are kept")),
        "{e}"
    );
    let list = listed(&store_name).await;
    assert_eq!(
        list,
        vec![
            json!({ "url": url, "bytes": cut, "total": size, "storage": "opfs", "complete": false })
        ]
    );
    let expected = expected_tokens().await;
    let (engine, info) = load(&url, options).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        info["bytesDownloaded"].as_f64(),
        Some((size - cut) as f64),
        "{info}"
    );
    assert_eq!(
        (
            info["loadedFromCache"].clone(),
            info["storedInCache"].clone()
        ),
        (json!(false), json!(true))
    );
    assert_eq!(generate_greedy(&engine).await["tokens"], expected);
    assert_eq!(listed(&store_name).await[0]["complete"], true);
}

/// `sha256` is checked on a download (a wrong digest fails naming both, and nothing is kept)
/// and on the stored copy: a copy with a byte changed is fetched again. Without `sha256` a
/// truncated copy is caught by its size and fetched again.
#[wasm_bindgen_test]
async fn stored_copies_are_checked_and_fetched_again_when_they_fail() {
    let run = unique("check");
    let Some(url) = url_with(
        "stored_copies_are_checked_and_fetched_again_when_they_fail",
        &run,
    ) else {
        return;
    };
    let bytes = fixture(FIXTURE);
    let digest = store::hex(&Sha256::digest(bytes));
    let store_name = unique("emberlm-test-check");
    let expected = expected_tokens().await;
    let base = json!({ "cache": store_name, "contextLength": 64, "backend": "cpu" });

    let mut wrong = base.clone();
    wrong["sha256"] = json!("0".repeat(64));
    let e = load(&url, wrong).await.err().expect("a wrong digest fails");
    assert!(
        e.starts_with("Format") && e.contains(&digest) && e.contains(&"0".repeat(64)),
        "{e}"
    );
    assert!(
        listed(&store_name).await.is_empty(),
        "a file that failed its digest is not kept"
    );

    let mut checked = base.clone();
    checked["sha256"] = json!(digest);
    let (_, info) = load(&url, checked.clone())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(info["storedInCache"], true, "{info}");

    // one byte changed in the stored copy: the digest catches it, the file comes again
    let mut corrupted = bytes.to_vec();
    corrupted[1000] ^= 0x55;
    overwrite_first_part(&store_name, &url, &corrupted).await;
    let (engine, info) = load(&url, checked.clone())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(info["loadedFromCache"], false, "{info}");
    assert_eq!(
        info["bytesDownloaded"].as_f64(),
        Some(bytes.len() as f64),
        "{info}"
    );
    assert_eq!(generate_greedy(&engine).await["tokens"], expected);
    let (_, info) = load(&url, checked).await.unwrap();
    assert_eq!(
        info["loadedFromCache"], true,
        "the copy fetched again is kept: {info}"
    );

    // a truncated copy: its size differs from the record's, fetched again without a digest
    overwrite_first_part(&store_name, &url, &bytes[..bytes.len() - 10]).await;
    let (engine, info) = load(&url, base).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(info["loadedFromCache"], false, "{info}");
    assert_eq!(generate_greedy(&engine).await["tokens"], expected);
}

/// The storage options' refusals name the option.
#[wasm_bindgen_test]
async fn storage_options_are_checked() {
    let bytes = || Uint8Array::from(fixture(FIXTURE)).into();
    for (options, needle) in [
        (json!({ "storage": "opfs" }), "no `cache` is given"),
        (
            json!({ "cache": "x", "storage": "indexeddb" }),
            "`indexeddb`: expected 'auto', 'opfs' or 'cacheApi'",
        ),
        (json!({ "sha256": "abc" }), "not a SHA-256 digest"),
        (
            json!({ "sha256": format!("{0},{0}", "a".repeat(64)) }),
            "2 digest(s) for 1 file(s)",
        ),
        (json!({ "cache": " " }), "must name a store"),
    ] {
        let e = Engine::open(bytes(), js(&options))
            .await
            .err()
            .map(|e| message(&e))
            .unwrap_or_else(|| panic!("{options} loads"));
        assert!(e.contains(needle), "{options}: {e}");
    }
    // a digest that matches raw bytes passes
    let digest = store::hex(&Sha256::digest(fixture(FIXTURE)));
    Engine::open(
        bytes(),
        js(&json!({ "sha256": digest, "backend": "cpu", "contextLength": 64 })),
    )
    .await
    .unwrap_or_else(|e| panic!("{}", message(&e)));
}

/// A file an earlier version kept in the Cache API (the same store name) is read from there by
/// a load with `storage: 'auto'`, nothing downloaded, and moved into the private file system.
#[wasm_bindgen_test]
async fn an_earlier_cache_api_copy_moves_into_the_private_file_system() {
    let run = unique("moved");
    let Some(url) = url_with(
        "an_earlier_cache_api_copy_moves_into_the_private_file_system",
        &run,
    ) else {
        return;
    };
    let store_name = unique("emberlm-test-move");
    let expected = expected_tokens().await;
    let old = json!({ "cache": store_name, "storage": "cacheApi", "contextLength": 64, "backend": "cpu" });
    let (_, info) = load(&url, old).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(info["storage"], "cacheApi", "{info}");
    let media: Vec<Value> = listed(&store_name)
        .await
        .iter()
        .map(|f| f["storage"].clone())
        .collect();
    assert_eq!(media, vec![json!("cacheApi")]);

    let auto = json!({ "cache": store_name, "contextLength": 64, "backend": "cpu" });
    let (engine, info) = load(&url, auto.clone())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(info["storage"], "opfs", "{info}");
    assert_eq!(info["loadedFromCache"], true, "{info}");
    assert_eq!(info["bytesDownloaded"].as_f64(), Some(0.0), "{info}");
    assert_eq!(generate_greedy(&engine).await["tokens"], expected);
    let list = listed(&store_name).await;
    let size = fixture(FIXTURE).len() as u64;
    assert_eq!(
        list,
        vec![
            json!({ "url": url, "bytes": size, "total": size, "storage": "opfs", "complete": true })
        ],
        "moved, not copied"
    );
    // and read from the private file system from then on
    let (_, info) = load(&url, auto).await.unwrap();
    assert_eq!(
        (
            info["loadedFromCache"].clone(),
            info["bytesDownloaded"].clone()
        ),
        (json!(true), json!(0))
    );
}
