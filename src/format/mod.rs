//! Bytes on disk to what the engine needs: model configuration, named tensors, tokenizer data.
//! Nothing here touches the GPU.

pub mod gguf;
pub mod gguf_model;
pub mod gguf_stream;
pub mod hf_config;
pub mod safetensors;

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::chat::ChatTemplate;
use crate::error::{Error, Result};
use crate::model::config::ModelConfig;
use crate::model::weights::DType;
use crate::tokenizer::Tokenizer;

/// One tensor as stored: logical shape (outermost first; matrices are `[out, in]`), storage
/// type, and its bytes (borrowed from the file where possible).
#[derive(Debug, Clone)]
pub struct Tensor<'a> {
    /// Logical shape, outermost first.
    pub shape: Vec<usize>,
    /// Storage type.
    pub dtype: DType,
    /// The stored bytes (`dtype.bytes_for(n_elements)` of them).
    pub data: Cow<'a, [u8]>,
}

impl Tensor<'_> {
    /// Number of values.
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A model's configuration and its tensors, keyed by GGUF tensor name.
#[derive(Debug)]
pub struct ModelWeights<'a> {
    /// Where the weights came from, for messages.
    pub file: String,
    /// The normalised configuration.
    pub config: ModelConfig,
    /// Tensors by GGUF name (`token_embd.weight`, `blk.0.attn_q.weight`, ...).
    pub tensors: BTreeMap<String, Tensor<'a>>,
}

/// Per storage type: how many tensors and how many bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TypeTally {
    /// Tensors of this type.
    pub tensors: usize,
    /// Their bytes.
    pub bytes: u64,
}

/// GPU memory a model needs, by kind, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct MemoryEstimate {
    /// The context length the estimate is for.
    pub context: usize,
    /// Weights as stored (quantized stays quantized).
    pub weights: u64,
    /// f32 K and V for every layer and position.
    pub kv_cache: u64,
    /// Activations of one prefill chunk of [`PREFILL_CHUNK`] tokens, f32.
    pub activations: u64,
    /// The sum.
    pub total: u64,
}

/// Tokens per prefill chunk assumed by [`ModelWeights::memory_estimate`].
pub const PREFILL_CHUNK: usize = 128;

/// The default context length: the model's, capped at 4096.
pub fn default_context(config: &ModelConfig) -> usize {
    config.context_length.min(DEFAULT_CONTEXT_CAP)
}

/// The longest context [`default_context`] picks.
pub const DEFAULT_CONTEXT_CAP: usize = 4096;

/// A context length picked for a model on a device, and why.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ContextChoice {
    /// Positions of KV cache.
    pub context: usize,
    /// What bounded it, in words ("the model's trained context", ...).
    pub reason: String,
}

/// The context to use when the caller gives none: the model's trained context, at most 4096,
/// and at most what one layer's KV buffer (`context × kv_dim` f32) may hold under the device's
/// `maxStorageBufferBindingSize` and `maxBufferSize`.
pub fn auto_context(config: &ModelConfig, max_binding: u64, max_buffer: u64) -> ContextChoice {
    let row = (config.kv_dim().max(1) as u64) * 4;
    let by_device = (max_binding.min(max_buffer) / row).min(usize::MAX as u64) as usize;
    let mut choice = ContextChoice {
        context: config.context_length,
        reason: "the model's trained context".into(),
    };
    if DEFAULT_CONTEXT_CAP < choice.context {
        choice = ContextChoice {
            context: DEFAULT_CONTEXT_CAP,
            reason: format!(
                "the default cap of {DEFAULT_CONTEXT_CAP} (the model was trained on {})",
                config.context_length
            ),
        };
    }
    if by_device < choice.context {
        choice = ContextChoice {
            context: by_device.max(1),
            reason: format!(
                "the device's largest storage buffer ({} bytes) holds one layer's K or V for {by_device} positions",
                max_binding.min(max_buffer)
            ),
        };
    }
    choice
}

impl<'a> ModelWeights<'a> {
    /// GPU memory for running this model with `context` positions of KV cache.
    pub fn memory_estimate(&self, context: usize) -> MemoryEstimate {
        let c = &self.config;
        let chunk = PREFILL_CHUNK.min(context.max(1)) as u64;
        let per_token =
            (2 * c.hidden_size + 2 * c.q_dim() + 2 * c.kv_dim() + 2 * c.ffn_size) as u64;
        let scores = (c.n_heads * context) as u64;
        let activations = 4 * (chunk * (per_token + scores) + c.vocab_size as u64);
        let weights = self.weight_bytes();
        let kv_cache = c.kv_cache_bytes(context);
        MemoryEstimate {
            context,
            weights,
            kv_cache,
            activations,
            total: weights + kv_cache + activations,
        }
    }

    /// The tensor `name`, or an error naming it.
    pub fn tensor(&self, name: &str) -> Result<&Tensor<'a>> {
        self.tensors
            .get(name)
            .ok_or_else(|| Error::format(&self.file, format!("missing tensor `{name}`")))
    }

    /// Checks that every tensor the forward pass reads exists with the shape the config needs.
    pub fn check_shapes(&self) -> Result<()> {
        self.config.check_tensors(&self.file, |n| {
            self.tensors.get(n).map(|t| t.shape.as_slice())
        })
    }

    /// Tensor count and bytes per storage type.
    pub fn tally(&self) -> BTreeMap<&'static str, TypeTally> {
        let mut out: BTreeMap<&'static str, TypeTally> = BTreeMap::new();
        for t in self.tensors.values() {
            let e = out.entry(t.dtype.name()).or_default();
            e.tensors += 1;
            e.bytes += t.data.len() as u64;
        }
        out
    }

    /// Total bytes of all tensors as stored (what the GPU holds for the weights).
    pub fn weight_bytes(&self) -> u64 {
        self.tensors.values().map(|t| t.data.len() as u64).sum()
    }
}

/// A model as the user supplied it: one GGUF file, or a Hugging Face folder.
#[derive(Debug)]
pub enum ModelFiles {
    /// A GGUF file.
    Gguf(gguf_model::GgufModel),
    /// A Hugging Face folder.
    Hf(safetensors::HfFolder),
}

/// GGUF's magic bytes.
const GGUF_MAGIC: &[u8; 4] = b"GGUF";

impl ModelFiles {
    /// Opens `path`: a folder is read as a Hugging Face model, a file as GGUF.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open(path: &std::path::Path) -> Result<Self> {
        let meta = std::fs::metadata(path).map_err(|e| Error::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        if meta.is_dir() {
            return Ok(ModelFiles::Hf(safetensors::HfFolder::read(path)?));
        }
        let model = gguf_model::GgufModel::read(path)?;
        Ok(ModelFiles::Gguf(model))
    }

    /// Builds from the bytes of one file: GGUF when it starts with the GGUF magic.
    pub fn from_bytes(bytes: Vec<u8>, name: &str) -> Result<Self> {
        if bytes.starts_with(GGUF_MAGIC) {
            return Ok(ModelFiles::Gguf(gguf_model::GgufModel::from_bytes(
                bytes, name,
            )?));
        }
        Err(Error::format(
            name,
            "not a GGUF file (a Hugging Face model is a folder: config.json + *.safetensors)",
        ))
    }

    /// Where the model came from.
    pub fn name(&self) -> &str {
        match self {
            ModelFiles::Gguf(g) => g.header().file(),
            ModelFiles::Hf(h) => &h.name,
        }
    }

    /// Configuration and tensors, shape-checked.
    pub fn weights(&self) -> Result<ModelWeights<'_>> {
        match self {
            ModelFiles::Gguf(g) => g.weights(),
            ModelFiles::Hf(h) => h.load(),
        }
    }

    /// The tokenizer: from GGUF metadata, or from the folder's `tokenizer.json` (with
    /// `tokenizer_config.json` when present).
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        match self {
            ModelFiles::Gguf(g) => Tokenizer::from_gguf(g.header()),
            ModelFiles::Hf(h) => {
                let json = h.tokenizer_json.as_deref().ok_or_else(|| {
                    Error::format(&h.name, "no tokenizer.json in the model folder")
                })?;
                Tokenizer::from_json(
                    json,
                    h.tokenizer_config_json.as_deref(),
                    &format!("{}/tokenizer.json", h.name),
                )
            }
        }
    }

    /// The model's chat template (`tokenizer.chat_template` in GGUF, `chat_template` in
    /// `tokenizer_config.json`), or `None` when it has none (see [`ChatTemplate::fallback`]).
    pub fn chat_template(&self, tokenizer: &Tokenizer) -> Result<Option<ChatTemplate>> {
        match self {
            ModelFiles::Gguf(g) => ChatTemplate::from_gguf(g.header(), tokenizer),
            ModelFiles::Hf(h) => match &h.tokenizer_config_json {
                Some(json) => ChatTemplate::from_tokenizer_config(json, tokenizer),
                None => Ok(None),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::ModelConfig;

    fn config(context_length: usize, kv_dim: usize) -> ModelConfig {
        let mut c = crate::model::config::tests::tiny_llama();
        c.context_length = context_length;
        c.n_kv_heads = kv_dim / c.head_dim;
        c
    }

    #[test]
    fn auto_context_names_what_bounds_it() {
        let big = 1 << 30;
        let c = config(2048, 64);
        assert_eq!(auto_context(&c, big, big).context, 2048);
        assert!(auto_context(&c, big, big).reason.contains("trained"));
        let c = config(32768, 64);
        let choice = auto_context(&c, big, big);
        assert_eq!(choice.context, DEFAULT_CONTEXT_CAP);
        assert!(choice.reason.contains("32768"), "{}", choice.reason);
        // 64 KiB of binding holds 256 rows of 64 f32
        let choice = auto_context(&c, 1 << 16, big);
        assert_eq!(choice.context, 256);
        assert!(choice.reason.contains("65536"), "{}", choice.reason);
    }
}
