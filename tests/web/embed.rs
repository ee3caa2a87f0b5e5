//! Embeddings in the page: `engine.embed` on WebGPU and on the CPU backend against the
//! reference forward pass run in the same page, `engine.embeddings.create` in OpenAI's shape,
//! the conversation kept across an embedding, and bad input refused by name.

#![cfg(target_arch = "wasm32")]

use crate::common;

use common::web_engine::{fixture, generate, js, load, load_cpu, message, rust, Events};
use emberlm::loader::ModelFiles;
use emberlm::model::reference::ReferenceModel;
use emberlm::session::Pooling;
use emberlm::web::Engine;
use js_sys::{Array, Float32Array};
use serde_json::{json, Value};
use wasm_bindgen::JsValue;
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::wasm_bindgen_test;

const MODEL: &str = "tiny-llama-f32.gguf";

fn texts() -> Vec<&'static str> {
    vec!["Permission is hereby granted", "THE SOFTWARE IS PROVIDED"]
}

async fn embed(engine: &Engine, texts: JsValue, options: Value) -> Result<Vec<Vec<f32>>, String> {
    let out = JsFuture::from(engine.embed(texts, js(&options)))
        .await
        .map_err(|e| message(&e))?;
    Ok(Array::from(&out)
        .iter()
        .map(|v| Float32Array::from(v).to_vec())
        .collect())
}

/// The reference's vectors of `texts()` (pooled, not normalized).
fn reference(pooling: Pooling) -> Vec<Vec<f32>> {
    let files = ModelFiles::from_bytes(fixture(MODEL).to_vec(), MODEL).unwrap();
    let model = ReferenceModel::new(&files.weights().unwrap()).unwrap();
    let tokenizer = files.tokenizer().unwrap();
    texts()
        .iter()
        .map(|t| {
            let ids = tokenizer.encode(t, false, None).unwrap();
            let states = model.hidden(&mut model.new_cache(), &ids).unwrap();
            pooling.pool(&states, model.config().hidden_size)
        })
        .collect()
}

fn close(got: &[Vec<f32>], want: &[Vec<f32>], label: &str) {
    assert_eq!(got.len(), want.len(), "{label}");
    for (g, w) in got.iter().zip(want) {
        let scale = w.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (a, b) in g.iter().zip(w) {
            assert!((a - b).abs() <= 1e-3 * scale, "{label}: {a} vs {b}");
        }
    }
}

fn text_array() -> JsValue {
    js(&json!(texts()))
}

#[wasm_bindgen_test]
async fn embeddings_match_the_reference_on_webgpu_and_the_cpu() {
    let gpu = load(MODEL).await;
    let cpu = load_cpu(MODEL).await;
    for pooling in Pooling::ALL {
        let want = reference(pooling);
        let options = json!({ "pooling": pooling.name(), "normalize": false });
        let g = embed(&gpu, text_array(), options.clone()).await.unwrap();
        close(&g, &want, &format!("webgpu {}", pooling.name()));
        let c = embed(&cpu, text_array(), options).await.unwrap();
        close(&c, &want, &format!("cpu {}", pooling.name()));
    }
    // one string, normalized by default
    let one = embed(&cpu, JsValue::from_str(texts()[0]), json!({}))
        .await
        .unwrap();
    let length: f64 = one[0]
        .iter()
        .map(|&x| f64::from(x).powi(2))
        .sum::<f64>()
        .sqrt();
    assert!((length - 1.0).abs() < 1e-5, "{length}");

    // OpenAI's shape
    let request = json!({ "input": texts(), "encoding_format": "float" });
    let answer = rust(
        &JsFuture::from(cpu.embeddings().create(js(&request)))
            .await
            .unwrap(),
    );
    assert_eq!(answer["object"], json!("list"), "{answer}");
    assert_eq!(answer["data"].as_array().map(Vec::len), Some(2), "{answer}");
    let first: Vec<f32> = serde_json::from_value(answer["data"][0]["embedding"].clone()).unwrap();
    close(&[first], &one, "embeddings.create");
}

#[wasm_bindgen_test]
async fn the_conversation_survives_and_bad_input_is_named() {
    let engine = load_cpu(MODEL).await;
    let greedy = json!({ "temperature": 0, "maxNewTokens": 6 });
    let first = generate(
        &engine,
        &json!([3, 4, 5, 6, 7]),
        greedy.clone(),
        &Events::new(),
    )
    .await
    .unwrap();
    let mut next: Vec<Value> = first["promptTokenIds"].as_array().unwrap().clone();
    next.extend(first["tokens"].as_array().unwrap().iter().cloned());
    next.push(json!(9));
    embed(&engine, text_array(), json!({})).await.unwrap();
    let got = generate(
        &engine,
        &Value::Array(next.clone()),
        greedy.clone(),
        &Events::new(),
    )
    .await
    .unwrap();
    // the cache held the prompt and every generated token but the last (never fed back)
    let held = first["promptTokenIds"].as_array().unwrap().len()
        + first["tokens"].as_array().unwrap().len()
        - 1;
    assert_eq!(got["stats"]["cachedTokens"], json!(held), "{got}");

    for (texts, options, says) in [
        (js(&json!([])), json!({}), "no text to embed"),
        (js(&json!([1])), json!({}), "texts[0] is not a string"),
        (
            text_array(),
            json!({ "pooling": "max" }),
            "`max` is not a pooling",
        ),
        (
            text_array(),
            json!({ "normalise": true }),
            "`normalise` is not an embedding option",
        ),
    ] {
        let e = embed(&engine, texts, options).await.unwrap_err();
        assert!(e.contains(says), "{e}");
    }
}

/// The tiny BERT encoder in the page, on WebGPU and on the CPU backend: its mean-pooled
/// states (the pooling its file names, the default) against the float64 goldens, and
/// generation refused naming why.
#[wasm_bindgen_test]
async fn a_bert_encoder_embeds_in_the_page_on_webgpu_and_the_cpu() {
    const BERT: &str = "tiny-bert-f32.gguf";
    let (_, _, golden) = common::web_fixtures::ENCODER_GGUFS[0];
    let golden: Value = serde_json::from_str(golden).unwrap();
    let results = golden["results"].as_array().unwrap();
    let texts: Vec<&str> = results
        .iter()
        .map(|r| r["text"].as_str().unwrap())
        .collect();
    let want: Vec<Vec<f32>> = results
        .iter()
        .map(|r| {
            r["mean"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect()
        })
        .collect();
    let gpu = load(BERT).await;
    let cpu = load_cpu(BERT).await;
    for (label, engine) in [("webgpu", &*gpu), ("cpu", &cpu)] {
        let got = embed(engine, js(&json!(texts)), json!({ "normalize": false }))
            .await
            .unwrap();
        close(&got, &want, &format!("tiny BERT on {label}"));
        let events = Events::new();
        let refused = generate(
            engine,
            &json!("permission is"),
            json!({ "maxNewTokens": 2 }),
            &events,
        )
        .await
        .unwrap_err();
        assert!(
            refused.contains("encoder with no LM head"),
            "{label}: {refused}"
        );
    }
}
