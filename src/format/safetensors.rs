//! Hugging Face model folders: `config.json` + `model.safetensors` (or shards listed in
//! `model.safetensors.index.json`) + tokenizer files, to [`ModelWeights`] under GGUF tensor
//! names.
//!
//! Tensors are borrowed from the file bytes, except GPT-2's Conv1D matrices, which are stored
//! `[in, out]` and are transposed once here to the `[out, in]` every kernel expects.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use super::hf_config;
use crate::config::Architecture;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::model::arch::{self, HfFix};
use crate::model::weights::{ModelWeights, Tensor};

/// Name of the single-file checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";
/// Name of the shard index.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// sentence-transformers' pooling module config (which pooling the embeddings were trained
/// with).
pub const POOLING_FILE: &str = "1_Pooling/config.json";

/// The files of a Hugging Face model folder, held in memory.
#[derive(Debug, Default)]
pub struct HfFolder {
    /// Folder name, for messages.
    pub name: String,
    /// `config.json`.
    pub config_json: Vec<u8>,
    /// `generation_config.json`, when present.
    pub generation_config_json: Option<Vec<u8>>,
    /// `tokenizer.json`, when present.
    pub tokenizer_json: Option<Vec<u8>>,
    /// `tokenizer_config.json`, when present.
    pub tokenizer_config_json: Option<Vec<u8>>,
    /// `1_Pooling/config.json` ([`POOLING_FILE`]), when present.
    pub pooling_config_json: Option<Vec<u8>>,
    /// Safetensors files by file name.
    pub shards: BTreeMap<String, Vec<u8>>,
}

#[derive(Debug, Deserialize)]
struct ShardIndex {
    weight_map: BTreeMap<String, String>,
}

/// Rejects shard names that would leave the folder.
fn check_shard_name(name: &str, index: &str) -> Result<()> {
    if name.is_empty()
        || name.contains('/')
        || name.contains('\\')
        || name.starts_with('.')
        || !name.ends_with(".safetensors")
    {
        return Err(Error::format(
            index,
            format!("shard name `{name}` must be a plain `*.safetensors` file name in the folder"),
        ));
    }
    Ok(())
}

impl HfFolder {
    /// Builds a folder from `(file name, bytes)` pairs, e.g. the files a user picked in the
    /// browser. Unknown files are ignored; shards are the files the index names, or
    /// `model.safetensors`.
    pub fn from_files(name: &str, files: Vec<(String, Vec<u8>)>) -> Result<Self> {
        let mut files: BTreeMap<String, Vec<u8>> = files.into_iter().collect();
        let config_json = files
            .remove("config.json")
            .ok_or_else(|| Error::format(name, "no config.json in the model folder"))?;
        let mut folder = HfFolder {
            name: name.to_string(),
            config_json,
            generation_config_json: files.remove("generation_config.json"),
            tokenizer_json: files.remove("tokenizer.json"),
            tokenizer_config_json: files.remove("tokenizer_config.json"),
            pooling_config_json: files.remove(POOLING_FILE),
            shards: BTreeMap::new(),
        };
        for shard in Self::shard_names(name, files.get(INDEX_FILE).map(Vec::as_slice))? {
            let bytes = files.remove(&shard).ok_or_else(|| {
                Error::format(name, format!("safetensors file `{shard}` is missing"))
            })?;
            folder.shards.insert(shard, bytes);
        }
        Ok(folder)
    }

    /// Reads a model folder from disk.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read(dir: &std::path::Path) -> Result<Self> {
        let name = dir.display().to_string();
        let read = |file: &str| -> Result<Option<Vec<u8>>> {
            let path = dir.join(file);
            match std::fs::read(&path) {
                Ok(bytes) => Ok(Some(bytes)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(Error::Io {
                    path: path.display().to_string(),
                    message: e.to_string(),
                }),
            }
        };
        let mut files = Vec::new();
        for file in [
            "config.json",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            POOLING_FILE,
        ] {
            if let Some(bytes) = read(file)? {
                files.push((file.to_string(), bytes));
            }
        }
        let index = read(INDEX_FILE)?;
        for shard in Self::shard_names(&name, index.as_deref())? {
            let bytes = read(&shard)?.ok_or_else(|| {
                Error::format(&name, format!("safetensors file `{shard}` is missing"))
            })?;
            files.push((shard, bytes));
        }
        if let Some(index) = index {
            files.push((INDEX_FILE.to_string(), index));
        }
        Self::from_files(&name, files)
    }

    fn shard_names(folder: &str, index: Option<&[u8]>) -> Result<BTreeSet<String>> {
        let Some(index) = index else {
            return Ok(BTreeSet::from([SINGLE_FILE.to_string()]));
        };
        let index: ShardIndex = serde_json::from_slice(index)
            .map_err(|e| Error::format(INDEX_FILE, format!("invalid JSON: {e}")))?;
        let names: BTreeSet<String> = index.weight_map.into_values().collect();
        if names.is_empty() {
            return Err(Error::format(
                folder,
                format!("{INDEX_FILE} lists no tensors"),
            ));
        }
        for n in &names {
            check_shard_name(n, INDEX_FILE)?;
        }
        Ok(names)
    }

    /// Parses the configuration and every shard into tensors under GGUF names, and checks
    /// that every tensor the forward pass needs is there with the right shape.
    pub fn load(&self) -> Result<ModelWeights<'_>> {
        let mut config = hf_config::parse_config(
            &self.config_json,
            self.generation_config_json.as_deref(),
            &format!("{}/config.json", self.name),
        )?;
        if let Some(json) = &self.pooling_config_json {
            let file = format!("{}/{POOLING_FILE}", self.name);
            config.pooling = hf_config::sentence_pooling(json, &file)?.or(config.pooling);
        }
        let spec = arch::spec(config.arch);
        let mut tensors: BTreeMap<String, Tensor<'_>> = BTreeMap::new();
        for (file, bytes) in &self.shards {
            let st = safetensors::SafeTensors::deserialize(bytes)
                .map_err(|e| Error::format(file, format!("invalid safetensors file: {e}")))?;
            for (hf_name, view) in st.iter() {
                let Some(name) = (spec.hf_tensor)(hf_name) else {
                    continue;
                };
                if name == "output.weight" && config.tied_embeddings {
                    continue;
                }
                let dtype = match view.dtype() {
                    safetensors::Dtype::F32 => DType::F32,
                    safetensors::Dtype::F16 => DType::F16,
                    safetensors::Dtype::BF16 => DType::BF16,
                    other => {
                        return Err(Error::Unsupported {
                            file: file.clone(),
                            what: format!("tensor type {other:?} in tensor `{hf_name}`"),
                        })
                    }
                };
                let mut tensor = Tensor {
                    shape: view.shape().to_vec(),
                    dtype,
                    data: Cow::Borrowed(view.data()),
                };
                tensor = match (spec.hf_fix)(&name, hf_name) {
                    Some(HfFix::Transpose) => transpose_2d(&tensor, file, hf_name)?,
                    Some(HfFix::PlusOne) => plus_one(&tensor, file, hf_name)?,
                    None => tensor,
                };
                if tensors.insert(name.clone(), tensor).is_some() {
                    return Err(Error::format(
                        file,
                        format!("tensor `{hf_name}` (`{name}`) appears more than once"),
                    ));
                }
            }
        }
        if spec.splits_stacked {
            crate::model::unfuse::split_fused(&config, &mut tensors)?;
        }
        let weights = ModelWeights {
            file: self.name.clone(),
            config,
            tensors,
            sources: Vec::new(),
            later_files: Vec::new(),
            later_tensors: BTreeMap::new(),
        };
        weights.check_shapes()?;
        Ok(weights)
    }
}

/// Gemma's RMSNorm multiplies by `1 + w` and its checkpoints store `w`; the graph (and GGUF,
/// whose converter adds the 1) takes the gain itself: `1 + w` as f32.
fn plus_one<'a>(t: &Tensor<'a>, file: &str, name: &str) -> Result<Tensor<'a>> {
    let n = t.shape.iter().product::<usize>();
    let mut gains = crate::dtype::dequantize(t.dtype, &t.data, n as u64, name)
        .map_err(|e| Error::format(file, e.to_string()))?;
    gains.iter_mut().for_each(|g| *g += 1.0);
    Ok(Tensor {
        shape: t.shape.clone(),
        dtype: DType::F32,
        data: Cow::Owned(bytemuck::cast_slice(&gains).to_vec()),
    })
}

/// Transposes a 2-D float tensor `[r, c]` to `[c, r]`.
fn transpose_2d<'a>(t: &Tensor<'a>, file: &str, name: &str) -> Result<Tensor<'a>> {
    let [rows, cols] = t.shape[..] else {
        return Err(Error::format(
            file,
            format!("tensor `{name}` should be 2-D, has shape {:?}", t.shape),
        ));
    };
    let size = t.dtype.block_bytes() as usize; // float types: one value per block
    if rows.checked_mul(cols).and_then(|n| n.checked_mul(size)) != Some(t.data.len()) {
        return Err(Error::format(
            file,
            format!(
                "tensor `{name}` of shape {:?} holds {} bytes",
                t.shape,
                t.data.len()
            ),
        ));
    }
    let mut out = vec![0u8; t.data.len()];
    // rows · cols · size is the data's length (checked above): no index below overflows
    #[allow(clippy::arithmetic_side_effects)]
    for r in 0..rows {
        for c in 0..cols {
            let from = (r * cols + c) * size;
            let to = (c * rows + r) * size;
            out[to..to + size].copy_from_slice(&t.data[from..from + size]);
        }
    }
    Ok(Tensor {
        shape: vec![cols, rows],
        dtype: t.dtype,
        data: Cow::Owned(out),
    })
}

/// Maps a Hugging Face tensor name to its GGUF name as `arch` reads it; `None` for tensors the
/// engine does not read (GPT-2's causal-mask buffers, rotary caches).
pub fn gguf_name(arch: Architecture, hf_name: &str) -> Option<String> {
    (arch::spec(arch).hf_tensor)(hf_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_gguf() {
        let l = crate::model::arch::llama::ARCH;
        assert_eq!(
            gguf_name(l, "model.layers.11.self_attn.k_proj.weight").as_deref(),
            Some("blk.11.attn_k.weight")
        );
        assert_eq!(
            gguf_name(l, "model.layers.0.self_attn.q_proj.bias").as_deref(),
            Some("blk.0.attn_q.bias")
        );
        assert_eq!(
            gguf_name(l, "model.layers.0.self_attn.rotary_emb.inv_freq"),
            None
        );
        assert_eq!(gguf_name(l, "model.layers.x.mlp.up_proj.weight"), None);
        let g = crate::model::arch::gpt2::ARCH;
        assert_eq!(
            gguf_name(g, "transformer.h.1.mlp.c_fc.bias").as_deref(),
            Some("blk.1.ffn_up.bias")
        );
        assert_eq!(gguf_name(g, "h.0.attn.bias"), None, "causal mask buffer");
        assert_eq!(
            gguf_name(g, "wpe.weight").as_deref(),
            Some("position_embd.weight")
        );
    }

    #[test]
    fn transpose_moves_elements() {
        let v: Vec<f32> = (0..6).map(|i| i as f32).collect();
        let t = Tensor {
            shape: vec![2, 3],
            dtype: DType::F32,
            data: Cow::Owned(bytemuck::cast_slice(&v).to_vec()),
        };
        let tt = transpose_2d(&t, "f", "w").unwrap();
        assert_eq!(tt.shape, vec![3, 2]);
        let got: Vec<f32> = bytemuck::pod_collect_to_vec(&tt.data);
        assert_eq!(got, vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    }

    #[test]
    fn shard_names_cannot_escape_the_folder() {
        for bad in [
            "../x.safetensors",
            "a/b.safetensors",
            ".hidden.safetensors",
            "x.bin",
            "",
        ] {
            let index = format!(r#"{{"weight_map": {{"w": "{bad}"}}}}"#);
            let err = HfFolder::shard_names("m", Some(index.as_bytes())).unwrap_err();
            assert!(err.to_string().contains("shard name"), "{bad}: {err}");
        }
    }
}
