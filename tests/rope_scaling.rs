//! RoPE frequency scaling end to end: the tiny Llama's Hugging Face folder with `rope_scaling`
//! (`llama3`, `linear`) in its `config.json` runs on the GPU within rounding of the CPU
//! reference (which computes every angle in f64), at positions past the original context,
//! and the scaling changes the logits there (a loader that ignored it would fail).

#![cfg(not(target_arch = "wasm32"))]

mod common;

use std::path::{Path, PathBuf};

use common::model_forms::{logits, tiny_llama_tensors, write_folder};
use emberlm::config::RopeScaling;
use emberlm::loader::ModelFiles;

/// The tiny Llama folder with `scaling` (JSON) added to its config, in a fresh folder.
fn scaled_folder(scaling: &str, tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("emberlm-rope-{tag}-{}", std::process::id()));
    write_folder(&tiny_llama_tensors(), &dir, |c| {
        c.replace(
            "\"hidden_act\"",
            &format!("\"rope_scaling\": {scaling}, \"hidden_act\""),
        )
    });
    dir
}

#[test]
fn scaled_rope_runs_as_the_reference_and_changes_long_positions() {
    let tokens: Vec<u32> = (0..120u32).map(|i| (i * 37 + 11) % 512).collect();
    let plain_dir = scaled_folder("null", "plain");
    let Some((plain, _)) = logits(&plain_dir, &tokens) else {
        return;
    };
    let vocab = 512;
    for (tag, scaling, want) in [
        (
            "llama3",
            r#"{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32}"#,
            RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_context: 32,
            },
        ),
        (
            "linear",
            r#"{"type": "linear", "factor": 4.0}"#,
            RopeScaling::Linear { factor: 4.0 },
        ),
    ] {
        let dir = scaled_folder(scaling, tag);
        let files = ModelFiles::open(&dir).unwrap();
        assert_eq!(files.weights().unwrap().config.rope_scaling, want);
        let (gpu, reference) = logits(&dir, &tokens).unwrap();
        let mut worst = 0.0f32;
        let mut changed = 0.0f32;
        for (t, row) in reference.iter().enumerate() {
            let got = &gpu[t * vocab..][..vocab];
            for (i, (&g, &r)) in got.iter().zip(row).enumerate() {
                let d = (g - r).abs();
                worst = worst.max(d);
                assert!(
                    d <= 2e-3 + 1e-3 * r.abs(),
                    "{tag}: token {t} logit {i}: {g} vs {r}"
                );
            }
            if t >= 40 {
                for (&g, &p) in got.iter().zip(&plain[t * vocab..][..vocab]) {
                    changed = changed.max((g - p).abs());
                }
            }
        }
        eprintln!("{tag}: GPU vs reference max |Δ| {worst:.2e}, vs unscaled {changed:.3}");
        assert!(
            changed > 0.05,
            "{tag}: the scaling changed nothing past position 40"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
    std::fs::remove_dir_all(&plain_dir).ok();
}

use common::gguf_meta;

/// The GGUF forms: `rope.scaling.type = linear` with a factor, and the `rope_freqs.weight`
/// divisors llama.cpp writes for Llama 3 (here 4 for every pair, which is linear ×4). Both load
/// as their scaling and give the logits of the `config.json` linear ×4 model.
#[test]
fn gguf_linear_metadata_and_rope_freqs_divisors_load_as_scaling() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama-f32.gguf");
    let meta = gguf_meta::read(&src);
    let tensors = gguf_meta::read_tensors(&src);
    let tokens: Vec<u32> = (0..100u32).map(|i| (i * 37 + 11) % 512).collect();
    let hf = scaled_folder(r#"{"type": "linear", "factor": 4.0}"#, "gguf-ref");
    let Some((want, _)) = logits(&hf, &tokens) else {
        return;
    };
    std::fs::remove_dir_all(&hf).ok();
    let dir = std::env::temp_dir().join(format!("emberlm-rope-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let mut linear = meta.clone();
    gguf_meta::set(
        &mut linear,
        "llama.rope.scaling.type",
        emberlm::format::gguf::GgufValue::String("linear".into()),
    );
    gguf_meta::set(
        &mut linear,
        "llama.rope.scaling.factor",
        emberlm::format::gguf::GgufValue::F32(4.0),
    );
    let mut with_freqs = tensors.clone();
    let divisors: Vec<u8> = std::iter::repeat_n(4.0f32, 8)
        .flat_map(|v| v.to_le_bytes())
        .collect();
    with_freqs.push(("rope_freqs.weight".into(), vec![8], 0, divisors));
    for (tag, meta, tensors, want_scaling) in [
        (
            "linear",
            &linear,
            &tensors,
            RopeScaling::Linear { factor: 4.0 },
        ),
        (
            "freqs",
            &meta,
            &with_freqs,
            RopeScaling::Factors(vec![4.0; 8]),
        ),
    ] {
        let path = dir.join(format!("{tag}.gguf"));
        std::fs::write(&path, gguf_meta::write_with_tensors(meta, tensors)).unwrap();
        let files = ModelFiles::open(&path).unwrap();
        assert_eq!(files.weights().unwrap().config.rope_scaling, want_scaling);
        let (got, _) = logits(&path, &tokens).unwrap();
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst < 1e-3,
            "{tag}: max |Δ| {worst} against the HF linear ×4 model"
        );
    }
    // a scaling the engine does not implement is refused by name, not ignored
    let mut yarn = meta.clone();
    gguf_meta::set(
        &mut yarn,
        "llama.rope.scaling.type",
        emberlm::format::gguf::GgufValue::String("yarn".into()),
    );
    gguf_meta::set(
        &mut yarn,
        "llama.rope.scaling.factor",
        emberlm::format::gguf::GgufValue::F32(4.0),
    );
    let path = dir.join("yarn.gguf");
    std::fs::write(&path, gguf_meta::write_with_tensors(&yarn, &tensors)).unwrap();
    let err = ModelFiles::open(&path).and_then(|f| f.weights().map(|_| ()));
    let text = err.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(text.contains("yarn"), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}
