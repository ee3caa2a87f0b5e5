//! RoPE frequency scaling end to end: the tiny Llama's Hugging Face folder with `rope_scaling`
//! (`llama3`, `linear`) in its `config.json` runs on the GPU within rounding of the CPU
//! reference (which computes every angle in f64), at positions past the original context,
//! and the scaling changes the logits there (a loader that ignored it would fail).

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

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

/// YaRN over an original context of 32 (a ramp over the first pairs of the tiny Llama's heads
/// of 16, the rest divided by 4), with the default attention factor.
const YARN_JSON: &str =
    r#"{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}"#;

fn yarn_scaling() -> RopeScaling {
    RopeScaling::Yarn {
        factor: 4.0,
        original_context: 32,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor: (0.1 * 4f64.ln() + 1.0) as f32,
    }
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
        ("yarn", YARN_JSON, yarn_scaling()),
    ] {
        let dir = scaled_folder(scaling, tag);
        let files = ModelFiles::open(&dir).unwrap();
        assert_eq!(files.weights().unwrap().config.rope_scaling, want);
        let (gpu, reference) = logits(&dir, &tokens).unwrap();
        // the CPU backend too (f32 weights: no 8-bit activations, the GPU's tolerance)
        let weights = files.weights().unwrap();
        let mut cpu = emberlm::backend::cpu::CpuForward::backend(&weights, tokens.len()).unwrap();
        let cpu = pollster::block_on(cpu.forward(&tokens, true)).unwrap();
        let mut worst = 0.0f32;
        let mut changed = 0.0f32;
        for (t, row) in reference.iter().enumerate() {
            let got = &gpu[t * vocab..][..vocab];
            let on_cpu = &cpu[t * vocab..][..vocab];
            for (i, ((&g, &c), &r)) in got.iter().zip(on_cpu).zip(row).enumerate() {
                let d = (g - r).abs().max((c - r).abs());
                worst = worst.max(d);
                assert!(
                    d <= 2e-3 + 1e-3 * r.abs(),
                    "{tag}: token {t} logit {i}: GPU {g}, CPU {c}, reference {r}"
                );
            }
            if t >= 40 {
                for (&g, &p) in got.iter().zip(&plain[t * vocab..][..vocab]) {
                    changed = changed.max((g - p).abs());
                }
            }
        }
        eprintln!("{tag}: GPU and CPU vs reference max |Δ| {worst:.2e}, vs unscaled {changed:.3}");
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
    // YaRN from llama.cpp's keys gives the logits of the config.json form
    let hf = scaled_folder(YARN_JSON, "gguf-yarn-ref");
    let (want, _) = logits(&hf, &tokens).unwrap();
    std::fs::remove_dir_all(&hf).ok();
    let set = |m: &mut _, k: &str, v| gguf_meta::set(m, &format!("llama.{k}"), v);
    use emberlm::format::gguf::GgufValue;
    let mut yarn = meta.clone();
    set(
        &mut yarn,
        "rope.scaling.type",
        GgufValue::String("yarn".into()),
    );
    set(&mut yarn, "rope.scaling.factor", GgufValue::F32(4.0));
    set(
        &mut yarn,
        "rope.scaling.original_context_length",
        GgufValue::U32(32),
    );
    let path = dir.join("yarn.gguf");
    std::fs::write(&path, gguf_meta::write_with_tensors(&yarn, &tensors)).unwrap();
    let files = ModelFiles::open(&path).unwrap();
    assert_eq!(files.weights().unwrap().config.rope_scaling, yarn_scaling());
    let (got, _) = logits(&path, &tokens).unwrap();
    let worst = common::model_forms::max_diff(&got, &want);
    assert!(worst < 1e-3, "yarn: max |Δ| {worst} against the HF form");
    // a form the engine does not implement is refused by name, not ignored
    set(
        &mut yarn,
        "rope.scaling.yarn_log_multiplier",
        GgufValue::F32(0.1),
    );
    std::fs::write(&path, gguf_meta::write_with_tensors(&yarn, &tensors)).unwrap();
    let err = ModelFiles::open(&path).and_then(|f| f.weights().map(|_| ()));
    let text = err.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(text.contains("yarn_log_multiplier"), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}
