//! Qwen2 (Llama's graph with biases on the Q, K and V projections and rotate-half RoPE) in
//! both forms the engine loads: the tiny Llama's Hugging Face folder given `model_type:
//! qwen2` and random q/k/v biases, and the same weights written as a `qwen2` GGUF (tensors
//! unpermuted, as llama.cpp's converter leaves Qwen2's). Both run on the GPU within rounding
//! of the CPU reference, agree with each other, and the biases change the logits (a loader
//! that dropped them would fail).

#![cfg(not(target_arch = "wasm32"))]

mod common;
#[path = "common/gguf_meta.rs"]
mod gguf_meta;

use std::path::{Path, PathBuf};

use emberlm::config::Architecture;
use emberlm::format::gguf::GgufValue;
use emberlm::format::safetensors::gguf_name;
use emberlm::forward::{Forward, DEFAULT_CHUNK};
use emberlm::gpu::KernelCache;
use emberlm::loader::ModelFiles;
use emberlm::model::reference::ReferenceModel;
use emberlm::GpuOptions;
use rand::{Rng, SeedableRng};
use safetensors::tensor::{Dtype, TensorView};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The tiny Llama's tensors as (HF name, shape, f32 values), plus q/k/v biases.
fn qwen2_tensors() -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(fixtures().join("tiny-llama/model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<(String, Vec<usize>, Vec<f32>)> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let values = bytemuck::pod_collect_to_vec::<u8, f32>(view.data());
            (name, view.shape().to_vec(), values)
        })
        .collect();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x0_2e2);
    for layer in 0..2 {
        for (proj, n) in [("q_proj", 64), ("k_proj", 32), ("v_proj", 32)] {
            let values = (0..n).map(|_| rng.random_range(-0.5f32..0.5)).collect();
            out.push((
                format!("model.layers.{layer}.self_attn.{proj}.bias"),
                vec![n],
                values,
            ));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn hf_folder(tensors: &[(String, Vec<usize>, Vec<f32>)], dir: &Path, model_type: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let src = fixtures().join("tiny-llama");
    std::fs::copy(src.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    let config = std::fs::read_to_string(src.join("config.json"))
        .unwrap()
        .replace(
            "\"model_type\": \"llama\"",
            &format!("\"model_type\": \"{model_type}\""),
        );
    assert!(config.contains(model_type));
    std::fs::write(dir.join("config.json"), config).unwrap();
    let raw: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, s, v)| (n.clone(), s.clone(), bytemuck::cast_slice(v).to_vec()))
        .collect();
    let views: Vec<(String, TensorView<'_>)> = raw
        .iter()
        .map(|(n, s, b)| {
            (
                n.clone(),
                TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
            )
        })
        .collect();
    let data = safetensors::serialize(views, None).unwrap();
    std::fs::write(dir.join("model.safetensors"), data).unwrap();
}

/// The same tensors as a `qwen2` GGUF with the tiny Llama's tokenizer metadata.
fn gguf_file(tensors: &[(String, Vec<usize>, Vec<f32>)], path: &Path) {
    let meta: gguf_meta::Metadata = gguf_meta::read(&fixtures().join("tiny-llama-f32.gguf"))
        .into_iter()
        .map(|(k, v)| match k.strip_prefix("llama.") {
            Some(rest) => (format!("qwen2.{rest}"), v),
            None if k == "general.architecture" => (k, GgufValue::String("qwen2".into())),
            None => (k, v),
        })
        .collect();
    let gguf_tensors: Vec<gguf_meta::TensorBytes> = tensors
        .iter()
        .filter_map(|(n, s, v)| {
            let name = gguf_name(Architecture::Llama, n)?;
            let dims = s.iter().rev().map(|&d| d as u64).collect();
            Some((name, dims, 0, bytemuck::cast_slice(v).to_vec()))
        })
        .collect();
    std::fs::write(path, gguf_meta::write_with_tensors(&meta, &gguf_tensors)).unwrap();
}

/// Every row's logits on the GPU and from the reference for `tokens`.
fn run(path: &Path, tokens: &[u32]) -> Option<(Vec<f32>, Vec<Vec<f32>>, bool)> {
    let ctx = common::native_gpu(GpuOptions::default())?;
    let files = ModelFiles::open(path).unwrap();
    let weights = files.weights().unwrap();
    let bias = weights.config.qkv_bias && weights.tensors.contains_key("blk.1.attn_v.bias");
    let cache = KernelCache::new();
    let mut fwd = pollster::block_on(Forward::new(
        &ctx,
        &cache,
        &weights,
        tokens.len(),
        DEFAULT_CHUNK,
    ))
    .unwrap();
    let gpu = pollster::block_on(fwd.forward(&ctx, tokens, true)).unwrap();
    let reference = ReferenceModel::new(&weights).unwrap();
    let want = reference
        .forward(&mut reference.new_cache(), tokens)
        .unwrap();
    Some((gpu, want, bias))
}

#[test]
fn qwen2_folders_and_ggufs_run_as_the_reference_with_their_biases() {
    let tensors = qwen2_tensors();
    let dir = std::env::temp_dir().join(format!("emberlm-qwen2-{}", std::process::id()));
    let (hf, plain, gguf) = (dir.join("hf"), dir.join("llama"), dir.join("qwen2.gguf"));
    hf_folder(&tensors, &hf, "qwen2");
    gguf_file(&tensors, &gguf);
    let tokens: Vec<u32> = (0..48u32).map(|i| (i * 53 + 7) % 512).collect();
    let Some((from_hf, reference, bias)) = run(&hf, &tokens) else {
        return;
    };
    assert!(bias, "the folder's config says qwen2 and its biases load");
    let vocab = 512;
    let close = |got: &[f32], want: &[Vec<f32>], what: &str| {
        for (t, row) in want.iter().enumerate() {
            for (i, (&g, &r)) in got[t * vocab..][..vocab].iter().zip(row).enumerate() {
                assert!(
                    (g - r).abs() <= 2e-3 + 1e-3 * r.abs(),
                    "{what}: token {t} logit {i}: {g} vs {r}"
                );
            }
        }
    };
    close(&from_hf, &reference, "HF qwen2 vs reference");
    let (from_gguf, gguf_reference, gguf_bias) = run(&gguf, &tokens).unwrap();
    assert!(
        gguf_bias,
        "the GGUF's architecture is qwen2 and its biases load"
    );
    close(&from_gguf, &gguf_reference, "GGUF qwen2 vs reference");
    close(&from_gguf, &reference, "GGUF vs HF qwen2");
    // without the biases (a llama folder ignores them: they are not part of its graph), the
    // logits move
    let no_bias: Vec<_> = tensors
        .iter()
        .filter(|(n, _, _)| !n.ends_with("_proj.bias"))
        .cloned()
        .collect();
    hf_folder(&no_bias, &plain, "llama");
    let (from_llama, _, _) = run(&plain, &tokens).unwrap();
    let moved = from_llama
        .iter()
        .zip(&from_hf)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(moved > 0.05, "the q/k/v biases changed nothing: {moved}");
    std::fs::remove_dir_all(&dir).ok();
}
