//! Gemma 3's graph on a tiny model: the tiny Llama's weights written as a `gemma3` GGUF with
//! random QK-norm and post-norm gains, a tied Q8_0 embedding, a sliding window of 5 keys on
//! every other layer with its own RoPE base. The GPU agrees with the CPU reference through
//! prefill (whole and in chunks) and decode, in both kernel shapes (the random gains make a
//! skipped norm fail); the window and the local RoPE base each change the logits; and the
//! matrices split across bindings by a forced-low binding cap (the tied embedding and head,
//! the interleaved gate and up, the down projection) give bit-identical logits.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use std::path::{Path, PathBuf};

use common::gguf_meta::{self, Metadata};
use common::model_forms::{
    as_f32, max_diff, tiny_llama_tensors, write_folder, write_gguf_with, Tensors,
};
use emberlm::backend::gpu::Forward;
use emberlm::backend::gpu::{KernelCache, KernelOverrides, Variant};
use emberlm::format::gguf::GgufValue;
use emberlm::loader::ModelFiles;
use emberlm::model::reference::ReferenceModel;
use emberlm::GpuOptions;
use rand::{Rng, SeedableRng};

const VOCAB: usize = 512;
const WINDOW: u32 = 5;

/// Q8_0 bytes of `v` (blocks of 32: an f16 scale, then 32 signed bytes).
fn q8_0(v: &[f32]) -> (u32, Vec<u8>) {
    let mut out = Vec::new();
    for block in v.chunks(32) {
        let amax = block.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let d = amax / 127.0;
        out.extend(half::f16::from_f32(d).to_le_bytes());
        for &x in block {
            let q = if d == 0.0 { 0.0 } else { (x / d).round() };
            out.push(q.clamp(-127.0, 127.0) as i8 as u8);
        }
    }
    (8, out)
}

/// Random gains around 1 for `[n]`.
fn gains(rng: &mut impl Rng, n: usize) -> (Vec<usize>, Vec<f32>) {
    (
        vec![n],
        (0..n).map(|_| rng.random_range(0.5f32..1.5)).collect(),
    )
}

/// The Gemma-only tensors, by GGUF name.
fn gemma_extra() -> Tensors {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x6e33a);
    let mut out = Tensors::new();
    for layer in 0..2 {
        let b = |s: &str| format!("blk.{layer}.{s}.weight");
        out.insert(b("attn_q_norm"), gains(&mut rng, 16));
        out.insert(b("attn_k_norm"), gains(&mut rng, 16));
        out.insert(b("post_attention_norm"), gains(&mut rng, 64));
        out.insert(b("post_ffw_norm"), gains(&mut rng, 64));
    }
    out
}

/// Writes the tiny Gemma 3 into `dir`: tied (no `lm_head`), Q8_0 matrices, layer 0 local.
fn write_model(dir: &Path, edit: impl Fn(&mut Metadata)) -> PathBuf {
    write_model_with(dir, q8_0, edit)
}

/// [`write_model`] with the matrices stored by `matrix`.
fn write_model_with(
    dir: &Path,
    matrix: impl Fn(&[f32]) -> (u32, Vec<u8>),
    edit: impl Fn(&mut Metadata),
) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let mut tensors = tiny_llama_tensors();
    tensors.remove("lm_head.weight");
    let path = dir.join("gemma3.gguf");
    write_gguf_with(&tensors, &gemma_extra(), &path, "gemma3", matrix, |m| {
        gguf_meta::set(m, "gemma3.attention.sliding_window", GgufValue::U32(WINDOW));
        gguf_meta::set(
            m,
            "gemma3.attention.sliding_window_pattern",
            GgufValue::U32(2),
        );
        gguf_meta::set(m, "gemma3.rope.freq_base_swa", GgufValue::F32(100.0));
        gguf_meta::set(m, "gemma3.attention.key_length", GgufValue::U32(16));
        edit(m);
    });
    path
}

fn temp_dir(what: &str) -> PathBuf {
    std::env::temp_dir().join(format!("emberlm-gemma3-{what}-{}", std::process::id()))
}

fn tokens() -> Vec<u32> {
    (0..23u32).map(|i| (i * 61 + 5) % VOCAB as u32).collect()
}

/// The reference's logits for every token.
fn reference(path: &Path, tokens: &[u32]) -> Vec<Vec<f32>> {
    let files = ModelFiles::open(path).unwrap();
    let weights = files.weights().unwrap();
    let model = ReferenceModel::new(&weights).unwrap();
    model.forward(&mut model.new_cache(), tokens).unwrap()
}

/// Every row's logits on the GPU: prefill in chunks of `chunk`, or (`decode`) one token a step.
fn gpu(
    options: GpuOptions,
    path: &Path,
    tokens: &[u32],
    chunk: usize,
    decode: bool,
) -> Option<Vec<f32>> {
    let ctx = common::native_gpu(options)?;
    let files = ModelFiles::open(path).unwrap();
    let weights = files.weights().unwrap();
    let cache = KernelCache::new();
    let mut fwd =
        pollster::block_on(Forward::new(&ctx, &cache, &weights, tokens.len(), chunk)).unwrap();
    let mut rows = Vec::new();
    let steps: Vec<&[u32]> = match decode {
        true => tokens.chunks(1).collect(),
        false => vec![tokens],
    };
    for step in steps {
        rows.extend(pollster::block_on(fwd.forward(&ctx, step, true)).unwrap());
    }
    Some(rows)
}

fn assert_close(got: &[f32], want: &[Vec<f32>], what: &str) {
    for (t, row) in want.iter().enumerate() {
        for (i, (&g, &r)) in got[t * VOCAB..][..VOCAB].iter().zip(row).enumerate() {
            assert!(
                (g - r).abs() <= 2e-3 + 1e-3 * r.abs(),
                "{what}: token {t} logit {i}: {g} vs {r}"
            );
        }
    }
}

#[test]
fn tiny_gemma3_runs_as_the_reference_in_every_shape() {
    let dir = temp_dir("shapes");
    let path = write_model(&dir, |_| {});
    let files = ModelFiles::open(&path).unwrap();
    let config = files.weights().unwrap().config.clone();
    assert_eq!(config.arch.name(), "gemma3");
    assert_eq!(config.layer_window(0), Some(WINDOW));
    assert_eq!(config.layer_window(1), None);
    let tokens = tokens();
    let want = reference(&path, &tokens);
    for variant in Variant::EVERY_FAMILY {
        let options = GpuOptions {
            kernels: KernelOverrides::all(variant),
            ..GpuOptions::default()
        };
        for (chunk, decode) in [(64, false), (4, false), (64, true)] {
            let Some(got) = gpu(options.clone(), &path, &tokens, chunk, decode) else {
                return;
            };
            let what = format!("{variant}, chunk {chunk}, decode {decode}");
            assert_close(&got, &want, &what);
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn every_gemma3_feature_changes_the_logits() {
    let dir = temp_dir("features");
    let tokens = tokens();
    let base = reference(&write_model(&dir.join("base"), |_| {}), &tokens);
    let flat = |want: &[Vec<f32>]| want.concat();
    // the window: with one RoPE base for all layers, making every layer global changes only
    // the positions past the window
    let one_base =
        |m: &mut Metadata| gguf_meta::set(m, "gemma3.rope.freq_base_swa", GgufValue::F32(10_000.0));
    let local = reference(&write_model(&dir.join("local"), one_base), &tokens);
    let global = reference(
        &write_model(&dir.join("global"), |m| {
            one_base(m);
            gguf_meta::set(
                m,
                "gemma3.attention.sliding_window_pattern",
                GgufValue::U32(1),
            )
        }),
        &tokens,
    );
    let first = WINDOW as usize;
    assert_eq!(
        max_diff(&flat(&local[..first]), &flat(&global[..first])),
        0.0,
        "within the window local and global attention agree"
    );
    assert!(max_diff(&flat(&local[first..]), &flat(&global[first..])) > 1e-2);
    // the local RoPE base
    let same_base = reference(
        &write_model(&dir.join("rope"), |m| {
            gguf_meta::remove(m, "gemma3.rope.freq_base_swa")
        }),
        &tokens,
    );
    assert!(max_diff(&flat(&base), &flat(&same_base)) > 1e-2);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn an_embedding_split_across_bindings_gives_the_same_logits() {
    let dir = temp_dir("split");
    let path = write_model(&dir, |_| {});
    let tokens = tokens();
    let Some(whole) = gpu(GpuOptions::default(), &path, &tokens, 8, false) else {
        return;
    };
    // 512 rows of 68 bytes: a cap of 10,000 bytes gives parts of 146 rows (the last 74), so
    // the tokens and the tied head read several parts
    let capped = GpuOptions {
        binding_cap: Some(10_000),
        ..GpuOptions::default()
    };
    let split = gpu(capped.clone(), &path, &tokens, 8, false).unwrap();
    assert_eq!(whole, split, "prefill, split vs whole");
    let decoded = gpu(capped, &path, &tokens, 8, true).unwrap();
    assert!(
        max_diff(&whole, &decoded) < 1e-3,
        "decode, split vs prefill"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// The tiny Gemma 3 as a Hugging Face folder (`gemma3_text`: Gemma's tensor names, norms stored
/// as `gain − 1`, the window, pattern and local base in `config.json`) gives the logits of its
/// f32 GGUF, on the reference and on the GPU. A multimodal `gemma3` config and soft-capping
/// are refused by name.
#[test]
fn a_hugging_face_folder_runs_as_its_gguf() {
    let dir = temp_dir("hf");
    let gguf = write_model_with(&dir, as_f32, |_| {});
    let minus_one = |(shape, v): (Vec<usize>, Vec<f32>)| {
        (shape, v.iter().map(|g| g - 1.0).collect::<Vec<f32>>())
    };
    let mut hf = Tensors::new();
    for (name, t) in tiny_llama_tensors() {
        if name == "lm_head.weight" {
            continue;
        }
        // the Llama's norm before the feed-forward is Gemma's pre-feed-forward norm
        let name = name.replace("post_attention_layernorm", "pre_feedforward_layernorm");
        let t = if name.ends_with("norm.weight") {
            minus_one(t)
        } else {
            t
        };
        hf.insert(name, t);
    }
    for (name, t) in gemma_extra() {
        let (layer, what) = name
            .strip_prefix("blk.")
            .and_then(|n| n.strip_suffix(".weight"))
            .and_then(|n| n.split_once('.'))
            .unwrap();
        let module = match what {
            "attn_q_norm" => "self_attn.q_norm",
            "attn_k_norm" => "self_attn.k_norm",
            "post_attention_norm" => "post_attention_layernorm",
            "post_ffw_norm" => "post_feedforward_layernorm",
            other => panic!("{other}"),
        };
        hf.insert(
            format!("model.layers.{layer}.{module}.weight"),
            minus_one(t),
        );
    }
    let gemma_config = |extra: &'static str| {
        move |c: String| {
            c.replace("\"model_type\": \"llama\"", "\"model_type\": \"gemma3_text\"")
                .replace("\"tie_word_embeddings\": false", "\"tie_word_embeddings\": true")
                .replace(
                    "\"hidden_act\"",
                    &format!(
                        "\"head_dim\": 16, \"sliding_window\": {WINDOW}, \"sliding_window_pattern\": 2, \"rope_local_base_freq\": 100.0, \"query_pre_attn_scalar\": 16, \"hidden_activation\": \"gelu_pytorch_tanh\", {extra}\"hidden_act\""
                    ),
                )
        }
    };
    let folder = dir.join("hf");
    write_folder(&hf, &folder, gemma_config(""));
    let files = ModelFiles::open(&folder).unwrap();
    let config = files.weights().unwrap().config.clone();
    assert_eq!(config.arch.name(), "gemma3");
    assert_eq!(config.layer_window(0), Some(WINDOW));
    assert_eq!(config.layer_window(1), None);
    let tokens = tokens();
    let want = reference(&gguf, &tokens);
    let got = reference(&folder, &tokens);
    let worst = max_diff(&want.concat(), &got.concat());
    assert!(worst < 1e-4, "HF folder vs GGUF on the reference: {worst}");
    if let Some(on_gpu) = gpu(GpuOptions::default(), &folder, &tokens, 64, false) {
        assert_close(&on_gpu, &want, "HF folder on the GPU");
    }
    // the same layers named by layer_types load alike; a pattern it cannot express is refused
    let typed = dir.join("typed");
    write_folder(
        &hf,
        &typed,
        gemma_config(r#""layer_types": ["sliding_attention", "full_attention"], "#),
    );
    let c = ModelFiles::open(&typed)
        .unwrap()
        .weights()
        .unwrap()
        .config
        .clone();
    assert_eq!(c.local_attention, config.local_attention);
    for (extra, needle) in [
        (
            r#""layer_types": ["full_attention", "sliding_attention"], "#,
            "layer_types",
        ),
        (
            r#""final_logit_softcapping": 30.0, "#,
            "final_logit_softcapping",
        ),
    ] {
        let bad = dir.join("bad");
        write_folder(&hf, &bad, gemma_config(extra));
        let err = ModelFiles::open(&bad).and_then(|f| f.weights().map(|_| ()));
        let text = err.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains(needle), "{extra}: {text}");
    }
    let multimodal = dir.join("multimodal");
    write_folder(&hf, &multimodal, |c| {
        c.replace("\"model_type\": \"llama\"", "\"model_type\": \"gemma3\"")
    });
    let err = ModelFiles::open(&multimodal).and_then(|f| f.weights().map(|_| ()));
    let text = err.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(text.contains("gemma3_text"), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}
