//! Model forms built from the tiny Llama for loader tests (Qwen2, Phi-3, RoPE scaling): its
//! Hugging Face tensors, a folder or a GGUF of other tensors under another architecture name,
//! and every row's logits from the GPU and from the CPU reference.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use emberlm::backend::gpu::Forward;
use emberlm::backend::gpu::KernelCache;
use emberlm::backend::DEFAULT_CHUNK;
use emberlm::format::gguf::GgufValue;
use emberlm::format::safetensors::gguf_name;
use emberlm::loader::ModelFiles;
use emberlm::model::reference::ReferenceModel;
use emberlm::GpuOptions;
use safetensors::tensor::{Dtype, TensorView};

/// Tensors by Hugging Face name: shape and f32 values.
pub type Tensors = BTreeMap<String, (Vec<usize>, Vec<f32>)>;

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The tiny Llama's Hugging Face tensors.
pub fn tiny_llama_tensors() -> Tensors {
    let bytes = std::fs::read(fixtures().join("tiny-llama/model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, v)| {
            (
                n,
                (v.shape().to_vec(), bytemuck::pod_collect_to_vec(v.data())),
            )
        })
        .collect()
}

/// A folder of `tensors` with the tiny Llama's tokenizer and its config edited by `config`.
pub fn write_folder(tensors: &Tensors, dir: &Path, config: impl Fn(String) -> String) {
    std::fs::create_dir_all(dir).unwrap();
    let src = fixtures().join("tiny-llama");
    std::fs::copy(src.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    let json = config(std::fs::read_to_string(src.join("config.json")).unwrap());
    std::fs::write(dir.join("config.json"), json).unwrap();
    let raw: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, (s, v))| (n.clone(), s.clone(), bytemuck::cast_slice(v).to_vec()))
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
    std::fs::write(
        dir.join("model.safetensors"),
        safetensors::serialize(views, None).unwrap(),
    )
    .unwrap();
}

/// A folder of `tensors` whose config says `model_type` instead of `llama`.
pub fn hf_folder(tensors: &Tensors, dir: &Path, model_type: &str) {
    write_folder(tensors, dir, |c| {
        c.replace(
            "\"model_type\": \"llama\"",
            &format!("\"model_type\": \"{model_type}\""),
        )
    });
}

/// A GGUF of `tensors` (unpermuted, as for rotate-half architectures) under architecture
/// `arch`, with the tiny Llama's metadata renamed; matrices stored by `matrix` as
/// (GGML type id, bytes).
pub fn write_gguf(
    tensors: &Tensors,
    path: &Path,
    arch: &str,
    matrix: impl Fn(&[f32]) -> (u32, Vec<u8>),
) {
    write_gguf_with(tensors, &Tensors::new(), path, arch, matrix, |_| {});
}

/// [`write_gguf`] plus `extra` tensors already under their GGUF names, with the metadata
/// edited by `edit` last.
pub fn write_gguf_with(
    tensors: &Tensors,
    extra: &Tensors,
    path: &Path,
    arch: &str,
    matrix: impl Fn(&[f32]) -> (u32, Vec<u8>),
    edit: impl Fn(&mut super::gguf_meta::Metadata),
) {
    let mut meta: super::gguf_meta::Metadata =
        super::gguf_meta::read(&fixtures().join("tiny-llama-f32.gguf"))
            .into_iter()
            .map(|(k, v)| match k.strip_prefix("llama.") {
                Some(rest) => (format!("{arch}.{rest}"), v),
                None if k == "general.architecture" => (k, GgufValue::String(arch.into())),
                None => (k, v),
            })
            .collect();
    edit(&mut meta);
    let renamed = tensors
        .iter()
        .filter_map(|(n, t)| Some((gguf_name(emberlm::model::arch::llama::ARCH, n)?, t)));
    let out: Vec<super::gguf_meta::TensorBytes> = renamed
        .chain(extra.iter().map(|(n, t)| (n.clone(), t)))
        .map(|(name, (s, v))| {
            let dims = s.iter().rev().map(|&d| d as u64).collect();
            let (dtype, bytes) = if s.len() == 2 {
                matrix(v)
            } else {
                (0, bytemuck::cast_slice(v).to_vec())
            };
            (name, dims, dtype, bytes)
        })
        .collect();
    std::fs::write(path, super::gguf_meta::write_with_tensors(&meta, &out)).unwrap();
}

/// F32 bytes, for [`write_gguf`].
pub fn as_f32(v: &[f32]) -> (u32, Vec<u8>) {
    (0, bytemuck::cast_slice(v).to_vec())
}

/// Every row's logits for `tokens` through the model at `path`: from the GPU, and from the
/// CPU reference; `None` without a GPU.
pub fn logits(path: &Path, tokens: &[u32]) -> Option<(Vec<f32>, Vec<Vec<f32>>)> {
    let ctx = super::native_gpu(GpuOptions::default())?;
    let files = ModelFiles::open(path).unwrap();
    let weights = files.weights().unwrap();
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
    Some((gpu, want))
}

/// Largest `|a − b|`.
pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
