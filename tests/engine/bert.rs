//! BERT encoders: the tiny fixture in its three forms (Hugging Face folder, F32 and Q8_0 GGUF
//! twins) and, where `./build.sh setup` fetched it, the real all-MiniLM-L6-v2, embedded on the
//! CPU backend and on the GPU against float64 goldens (tools/make_bert_fixtures.py): the token
//! ids (`[CLS] text [SEP]`, uncased WordPiece), the pooled states, the cosine similarities
//! between texts, the pooling each file names, and a text longer than a decoder's prefill chunk
//! read in one step. An encoder asked to generate is refused, naming why.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use std::path::{Path, PathBuf};

use emberlm::backend::cpu::CpuPrecision;
use emberlm::loader::ModelFiles;
use emberlm::session::{CachePlanOptions, EmbedOptions, Pooling, Prompt, Session};
use emberlm::GpuOptions;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// One golden text: its ids and the float64 pooled states.
struct Golden {
    text: String,
    ids: Vec<u32>,
    mean: Vec<f64>,
    cls: Vec<f64>,
}

/// The goldens of `file`, with the pooled states under `mean{suffix}` and `cls{suffix}`.
fn goldens(file: &str, suffix: &str) -> Vec<Golden> {
    let path = fixture("golden").join(file);
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let floats = |v: &serde_json::Value| -> Vec<f64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    json["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| Golden {
            text: r["text"].as_str().unwrap().to_string(),
            ids: r["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect(),
            mean: floats(&r[format!("mean{suffix}").as_str()]),
            cls: floats(&r[format!("cls{suffix}").as_str()]),
        })
        .collect()
}

/// The model at `path` on the CPU backend (with its default 8-bit activations, and with
/// `exact` also in f32), and where a GPU is usable, on it.
fn sessions(path: &Path, exact: bool) -> Vec<(&'static str, Session)> {
    let f = ModelFiles::open(path).unwrap();
    let mut out = vec![("cpu", Session::new_cpu(&f, None).unwrap())];
    if exact {
        let s = Session::new_cpu_with(&f, None, CpuPrecision::F32).unwrap();
        out.push(("cpu-f32", s));
    }
    if let Some(ctx) = common::native_gpu(GpuOptions::default()) {
        out.push((
            "gpu",
            pollster::block_on(Session::new(ctx, &f, None)).unwrap(),
        ));
    }
    out
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

fn wide(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// Every golden text reads as its golden ids (`[CLS] text [SEP]`).
fn check_tokens(label: &str, s: &Session, golden: &[Golden]) {
    for g in golden {
        assert_eq!(
            s.tokenizer().encode_whole(&g.text).unwrap(),
            g.ids,
            "{label}: tokens of {:?}",
            g.text
        );
    }
}

/// How close a form must come: each value to within `value` of the largest golden value's
/// magnitude, each vector's direction to within `direction` (1 − cosine), the cosine between
/// any two texts to within `pair`.
#[derive(Clone, Copy)]
struct Tolerance {
    value: f64,
    direction: f64,
    pair: f64,
}

/// f32 products (every GPU path, the CPU on f32 weights): the 1e-3 on cosines.
const EXACT: Tolerance = Tolerance {
    value: 2e-3,
    direction: 1e-5,
    pair: 1e-3,
};

/// The CPU's products of quantized rows with 8-bit activations (as llama.cpp's), on the tiny
/// Q8_0 twin (64 wide, so each row's 8-bit scale is coarse): measured up to 6.6e-3 on the
/// cosines between texts (first-token pooling) and 2.0e-4 on a vector's direction. With f32
/// activations (`CpuPrecision::F32`) the same file meets [`EXACT`].
const INT8: Tolerance = Tolerance {
    value: 3e-2,
    direction: 1e-3,
    pair: 1e-2,
};

/// Embeds every golden text with `pooling` (unnormalised) and holds the vectors to the
/// goldens within `tol`.
fn check(label: &str, s: &mut Session, golden: &[Golden], pooling: Pooling, tol: Tolerance) {
    let texts: Vec<String> = golden.iter().map(|g| g.text.clone()).collect();
    let options = EmbedOptions {
        pooling: Some(pooling),
        normalize: false,
    };
    let got = pollster::block_on(s.embed(&texts, &options)).unwrap();
    assert_eq!(
        got.tokens,
        golden.iter().map(|g| g.ids.len()).collect::<Vec<_>>(),
        "{label}"
    );
    let want: Vec<&[f64]> = golden
        .iter()
        .map(|g| match pooling {
            Pooling::Cls => g.cls.as_slice(),
            _ => g.mean.as_slice(),
        })
        .collect();
    let got: Vec<Vec<f64>> = got.vectors.iter().map(|v| wide(v)).collect();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.len(), w.len(), "{label} text {i}");
        let scale = w.iter().fold(0f64, |m, v| m.max(v.abs()));
        let worst = g
            .iter()
            .zip(*w)
            .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            worst <= tol.value * scale,
            "{label} text {i}: off by {worst:e} (largest value {scale})"
        );
        let direction = cosine(g, w);
        assert!(
            1.0 - direction <= tol.direction,
            "{label} text {i}: cosine {direction}"
        );
    }
    for i in 0..got.len() {
        for j in i + 1..got.len() {
            let (g, w) = (cosine(&got[i], &got[j]), cosine(want[i], want[j]));
            assert!(
                (g - w).abs() < tol.pair,
                "{label}: cos(text {i}, text {j}) {g} vs {w}"
            );
        }
    }
}

#[test]
fn the_tiny_encoder_matches_its_goldens_in_every_form_on_both_backends() {
    // (form, the pooling its file names, the goldens' key suffix)
    let forms = [
        ("tiny-bert", Pooling::Mean, ""),
        ("tiny-bert-f32.gguf", Pooling::Mean, ""),
        ("tiny-bert-q8_0.gguf", Pooling::Cls, "_q8_0"),
    ];
    for (form, named, suffix) in forms {
        let golden = goldens("tiny-bert.golden.json", suffix);
        assert!(
            golden
                .iter()
                .any(|g| g.ids.len() > emberlm::backend::DEFAULT_CHUNK),
            "a golden text must be longer than a decoder's prefill chunk"
        );
        for (backend, mut s) in sessions(&fixture(form), true) {
            let label = format!("{form} on the {backend}");
            check_tokens(&label, &s, &golden);
            assert_eq!(
                s.pooling(&EmbedOptions::default()),
                named,
                "{label}: the pooling the file names"
            );
            let tol = match (backend, suffix) {
                ("cpu", "_q8_0") => INT8,
                _ => EXACT,
            };
            for pooling in [Pooling::Mean, Pooling::Cls] {
                check(
                    &format!("{label}, {} pooling", pooling.name()),
                    &mut s,
                    &golden,
                    pooling,
                    tol,
                );
            }
        }
    }
}

#[test]
fn an_encoder_embeds_but_does_not_generate() {
    for (backend, mut s) in sessions(&fixture("tiny-bert-f32.gguf"), false) {
        let prompt = Prompt::Text("permission is granted".into());
        let err =
            pollster::block_on(s.generate(&prompt, &crate::saved_state::greedy(4), &mut |_| {}))
                .unwrap_err()
                .to_string();
        assert!(
            err.contains("encoder with no LM head") && err.contains("bert"),
            "{backend}: {err}"
        );
        // the automatic KV-cache plan has nothing to measure on an encoder
        let decision = pollster::block_on(s.plan_kv_cache(&CachePlanOptions::default())).unwrap();
        assert_eq!(decision.source, "not planned", "{backend}");
        // and it still embeds after both
        let texts = vec!["permission is granted".to_string()];
        let got = pollster::block_on(s.embed(&texts, &EmbedOptions::default())).unwrap();
        assert_eq!(got.vectors.len(), 1, "{backend}");
    }
}

#[test]
fn all_minilm_l6_v2_matches_its_goldens_on_both_backends() {
    let Some(weights) = common::require::minilm() else {
        return;
    };
    let folder = weights.parent().unwrap().to_path_buf();
    let golden = goldens("all-minilm-l6-v2.golden.json", "");
    for (backend, mut s) in sessions(&folder, false) {
        let label = format!("all-MiniLM-L6-v2 on the {backend}");
        check_tokens(&label, &s, &golden);
        check(
            &format!("{label}, mean pooling"),
            &mut s,
            &golden,
            Pooling::Mean,
            EXACT,
        );
    }
}
