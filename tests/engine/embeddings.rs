//! Embeddings: every pooling of the final hidden states, on the CPU backend and on the GPU, for
//! each architecture's fixture, against the reference forward pass (the vectors, and the cosine
//! similarities between texts); a text longer than a prefill chunk; the conversation the cache
//! held continues exactly as if nothing had been embedded; bad input is refused by name.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;
use crate::saved_state::greedy;

use std::path::PathBuf;

use emberlm::loader::ModelFiles;
use emberlm::model::reference::ReferenceModel;
use emberlm::session::{EmbedOptions, Pooling, Prompt, Session};
use emberlm::GpuOptions;

const FIXTURES: [&str; 3] = [
    "tiny-llama-f32.gguf",
    "tiny-gpt2-f32.gguf",
    "tiny-gemma3-f32.gguf",
];

fn files(name: &str) -> ModelFiles {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    ModelFiles::open(&path).unwrap()
}

/// Texts of different lengths; the last is longer than a prefill chunk (64 tokens), so its
/// states come back over several steps.
fn texts() -> Vec<String> {
    vec![
        "Permission is hereby granted".into(),
        "THE SOFTWARE IS PROVIDED AS IS".into(),
        "The license. ".repeat(20),
    ]
}

fn sessions(name: &str) -> Vec<(&'static str, Session)> {
    let f = files(name);
    let mut out = vec![("cpu", Session::new_cpu(&f, None).unwrap())];
    if let Some(ctx) = common::native_gpu(GpuOptions::default()) {
        out.push((
            "gpu",
            pollster::block_on(Session::new(ctx, &f, None)).unwrap(),
        ));
    }
    out
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum();
    let norm = |v: &[f32]| v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

/// The reference's pooled vector of `tokens`.
fn reference(model: &ReferenceModel, tokens: &[u32], pooling: Pooling) -> Vec<f32> {
    let states = model.hidden(&mut model.new_cache(), tokens).unwrap();
    pooling.pool(&states, model.config().hidden_size)
}

#[test]
fn every_pooling_matches_the_reference_on_both_backends() {
    for name in FIXTURES {
        let f = files(name);
        let model = ReferenceModel::new(&f.weights().unwrap()).unwrap();
        for (backend, mut s) in sessions(name) {
            let ids: Vec<Vec<u32>> = texts()
                .iter()
                .map(|t| s.tokenizer().encode(t, false, None).unwrap())
                .collect();
            assert!(ids[2].len() > 64, "{name}: {} tokens", ids[2].len());
            for pooling in Pooling::ALL {
                let label = format!("{name} {backend} {}", pooling.name());
                let options = EmbedOptions {
                    pooling: Some(pooling),
                    normalize: false,
                };
                let got = pollster::block_on(s.embed(&texts(), &options)).unwrap();
                assert_eq!(got.tokens, ids.iter().map(Vec::len).collect::<Vec<_>>());
                let want: Vec<Vec<f32>> =
                    ids.iter().map(|t| reference(&model, t, pooling)).collect();
                for (i, (g, w)) in got.vectors.iter().zip(&want).enumerate() {
                    assert_eq!(g.len(), model.config().hidden_size, "{label}");
                    let scale = w.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let worst = g.iter().zip(w).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                    assert!(
                        worst <= 1e-3 * scale,
                        "{label} text {i}: {worst} of {scale}"
                    );
                }
                for (i, j) in [(0, 1), (0, 2), (1, 2)] {
                    let (g, w) = (
                        cosine(&got.vectors[i], &got.vectors[j]),
                        cosine(&want[i], &want[j]),
                    );
                    assert!((g - w).abs() < 1e-4, "{label} cos({i},{j}) {g} vs {w}");
                }
                // normalized: the same direction, unit length
                let unit = pollster::block_on(s.embed(
                    &texts()[..1],
                    &EmbedOptions {
                        pooling: Some(pooling),
                        normalize: true,
                    },
                ))
                .unwrap();
                let v = &unit.vectors[0];
                let length = v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
                assert!((length - 1.0).abs() < 1e-5, "{label}: length {length}");
                assert!(cosine(v, &got.vectors[0]) > 1.0 - 1e-6, "{label}");
            }
        }
    }
}

/// A conversation embedded in the middle of continues with the tokens it gives alone, from its
/// cache (the prompt is not run again).
#[test]
fn the_conversation_survives_an_embedding() {
    let prompt = Prompt::Text("Permission is hereby granted, free of charge,".into());
    let next = |s: &mut Session, cached: &[u32]| {
        let mut tokens = cached.to_vec();
        tokens.extend(
            s.tokenizer()
                .encode(" to any person", false, Some(false))
                .unwrap(),
        );
        pollster::block_on(s.generate(&Prompt::Tokens(tokens), &greedy(12), &mut |_| {})).unwrap()
    };
    for (backend, mut s) in sessions("tiny-llama-f32.gguf") {
        pollster::block_on(s.generate(&prompt, &greedy(10), &mut |_| {})).unwrap();
        let cached = s.cached_tokens().to_vec();
        let mut alone = sessions("tiny-llama-f32.gguf")
            .into_iter()
            .find(|(b, _)| *b == backend)
            .unwrap()
            .1;
        pollster::block_on(alone.generate(&prompt, &greedy(10), &mut |_| {})).unwrap();
        assert_eq!(alone.cached_tokens(), &cached[..], "{backend}");
        let want = next(&mut alone, &cached);

        pollster::block_on(s.embed(&texts(), &EmbedOptions::default())).unwrap();
        assert_eq!(
            s.cached_tokens(),
            &cached[..],
            "{backend}: the cache was not kept"
        );
        let got = next(&mut s, &cached);
        assert_eq!(
            got.sequences[0].tokens, want.sequences[0].tokens,
            "{backend}"
        );
        assert_eq!(
            got.stats.cached_tokens,
            cached.len(),
            "{backend}: the conversation was run again"
        );
    }
}

#[test]
fn bad_input_is_refused_by_name() {
    for (backend, mut s) in sessions("tiny-llama-f32.gguf") {
        let e = pollster::block_on(s.embed(&[], &EmbedOptions::default())).unwrap_err();
        assert!(e.to_string().contains("no text to embed"), "{backend}: {e}");
        let long = vec!["ok".to_string(), "word ".repeat(s.context() + 10)];
        let e = pollster::block_on(s.embed(&long, &EmbedOptions::default())).unwrap_err();
        assert!(
            e.to_string().contains("text 1 is") && e.to_string().contains("context"),
            "{backend}: {e}"
        );
    }
}
