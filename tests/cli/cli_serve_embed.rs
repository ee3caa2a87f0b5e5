//! `POST /v1/embeddings` on `serve-api`: OpenAI's shape (a string or an array of texts, float
//! or base64), the vectors the library's `Session::embed` gives, with `--parallel 1` and with
//! completions decoding alongside (the batch drains, the embeddings run, serving resumes and
//! the completions' answers are unchanged); bad requests are 400 naming the field.

#![cfg(not(target_arch = "wasm32"))]

use crate::serve;

use std::sync::{Arc, Barrier};

use emberlm::loader::ModelFiles;
use emberlm::session::{EmbedOptions, Pooling, Session};
use serde_json::{json, Value};
use serve::{http, json_body};

const MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/tiny-llama-256-f32.gguf"
);

fn texts() -> Vec<String> {
    vec![
        "Permission is hereby granted".into(),
        "THE SOFTWARE IS PROVIDED".into(),
    ]
}

/// What the library gives for `texts()` (on the CPU).
fn library(options: EmbedOptions) -> Vec<Vec<f32>> {
    let files = ModelFiles::open(std::path::Path::new(MODEL)).unwrap();
    let mut s = Session::new_cpu(&files, None).unwrap();
    pollster::block_on(s.embed(&texts(), &options))
        .unwrap()
        .vectors
}

fn vectors(body: &Value) -> Vec<Vec<f32>> {
    body["data"]
        .as_array()
        .unwrap_or_else(|| panic!("no data in {body}"))
        .iter()
        .enumerate()
        .map(|(i, item)| {
            assert_eq!(item["index"], json!(i), "{body}");
            assert_eq!(item["object"], json!("embedding"), "{body}");
            match &item["embedding"] {
                Value::String(text) => base64::decode(text)
                    .expect("base64")
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                v => serde_json::from_value(v.clone()).expect("floats"),
            }
        })
        .collect()
}

fn close(got: &[Vec<f32>], want: &[Vec<f32>], label: &str) {
    assert_eq!(got.len(), want.len(), "{label}");
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.len(), w.len(), "{label}");
        for (a, b) in g.iter().zip(w) {
            // the server may run on the GPU, the library here on the CPU
            assert!(
                (a - b).abs() <= 2e-4 * b.abs().max(1.0),
                "{label}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn embeddings_are_the_librarys_in_openais_shape() {
    let want = library(EmbedOptions::default());
    let last = library(EmbedOptions {
        pooling: Some(Pooling::Last),
        normalize: false,
    });
    let server = serve::start_model(MODEL, &["--parallel", "1"]);
    let (status, body) = http(
        &server,
        "POST",
        "/v1/embeddings",
        &json!({"input": texts(), "model": "mine"}).to_string(),
    );
    assert_eq!(status, 200, "{body}");
    let v = json_body(&body);
    assert_eq!(
        (v["object"].as_str(), v["model"].as_str()),
        (Some("list"), Some("mine"))
    );
    assert!(v["usage"]["prompt_tokens"].as_u64() > Some(4), "{v}");
    close(&vectors(&v), &want, "float");

    let body = json!({"input": texts(), "encoding_format": "base64", "pooling": "last",
                      "normalize": false});
    let (status, reply) = http(&server, "POST", "/v1/embeddings", &body.to_string());
    assert_eq!(status, 200, "{reply}");
    close(&vectors(&json_body(&reply)), &last, "base64, last");

    let (status, reply) = http(
        &server,
        "POST",
        "/v1/embeddings",
        &json!({"input": texts()[0]}).to_string(),
    );
    assert_eq!(status, 200, "{reply}");
    close(&vectors(&json_body(&reply)), &want[..1], "one string");

    for (body, says) in [
        (
            json!({"input": "a", "dimensions": 7}),
            "`dimensions` 7 is not supported",
        ),
        (json!({"input": [1, 2]}), "token ids are not accepted"),
        (
            json!({"input": "a", "temperature": 0}),
            "unknown field `temperature`",
        ),
        (json!({"texts": "a"}), "unknown field `texts`"),
    ] {
        let (status, reply) = http(&server, "POST", "/v1/embeddings", &body.to_string());
        assert_eq!(status, 400, "{body}: {reply}");
        assert!(reply.contains(says), "{body}: {reply}");
    }
    let (status, _) = http(&server, "GET", "/v1/embeddings", "");
    assert_eq!(status, 405);
}

/// Embeddings sent while completions decode together: each answer is what it gets alone.
#[test]
fn embeddings_wait_for_the_batch_and_serving_resumes() {
    let want = library(EmbedOptions::default());
    let completion = |prompt: &str| json!({"prompt": prompt, "max_tokens": 40, "temperature": 0, "logit_bias": {"0": -100}});
    let prompts = ["The license", "Copyright", "Redistribution"];
    let alone = serve::start_model(MODEL, &["--parallel", "1"]);
    let texts_alone: Vec<Value> = prompts
        .iter()
        .map(|p| {
            let (status, body) = http(
                &alone,
                "POST",
                "/v1/completions",
                &completion(p).to_string(),
            );
            assert_eq!(status, 200, "{body}");
            json_body(&body)["choices"][0]["text"].clone()
        })
        .collect();
    drop(alone);

    let server = serve::start_model(MODEL, &["--parallel", "3"]);
    let address = Arc::new(server.address.clone());
    let start = Arc::new(Barrier::new(prompts.len() + 1));
    let completions: Vec<_> = prompts
        .iter()
        .map(|p| {
            let (address, start, body) = (Arc::clone(&address), Arc::clone(&start), completion(p));
            std::thread::spawn(move || {
                start.wait();
                let reply = serve::exchange(&address, "POST", "/v1/completions", &body.to_string());
                assert_eq!(reply.status, 200, "{}", reply.body);
                json_body(&reply.body)["choices"][0]["text"].clone()
            })
        })
        .collect();
    let embed_all = |label: &str| {
        let body = json!({"input": texts()}).to_string();
        let (status, reply) = http(&server, "POST", "/v1/embeddings", &body);
        assert_eq!(status, 200, "{reply}");
        close(&vectors(&json_body(&reply)), &want, label);
    };
    start.wait();
    embed_all("beside completions");
    for (c, want) in completions.into_iter().zip(&texts_alone) {
        assert_eq!(&c.join().expect("a client"), want);
    }
    // and the server goes on answering both
    let (status, body) = http(
        &server,
        "POST",
        "/v1/completions",
        &completion(prompts[0]).to_string(),
    );
    assert_eq!(
        (status, &json_body(&body)["choices"][0]["text"]),
        (200, &texts_alone[0])
    );
    embed_all("after");
}
