//! A GGUF file as a model: metadata to [`ModelConfig`], tensor infos to [`ModelWeights`]
//! borrowing the file's bytes (quantized tensors stay quantized).

use std::borrow::Cow;
use std::collections::BTreeMap;

use super::gguf::GgufHeader;
use crate::config::{
    Activation, Architecture, LocalAttention, ModelConfig, NormKind, RopeLayout, RopeScaling,
    GEMMA3_LOCAL_ROPE_THETA, GEMMA3_PATTERN,
};

/// Gemma 3's sliding window where a file does not give one.
const GEMMA3_WINDOW: usize = 512;
use crate::error::{Error, Result};
use crate::model::weights::{ModelWeights, Tensor};

/// A GGUF file held in memory with its parsed header.
#[derive(Debug)]
pub struct GgufModel {
    bytes: Vec<u8>,
    header: GgufHeader,
}

impl GgufModel {
    /// Parses the header of a whole GGUF file held in memory; `name` names it in errors.
    pub fn from_bytes(bytes: Vec<u8>, name: &str) -> Result<Self> {
        let header = GgufHeader::parse(&bytes, name)?;
        Ok(Self { bytes, header })
    }

    /// Reads and parses a GGUF file from disk.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read(path: &std::path::Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Self::from_bytes(bytes, &path.display().to_string())
    }

    /// The parsed header (metadata and tensor infos).
    pub fn header(&self) -> &GgufHeader {
        &self.header
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The normalised configuration.
    pub fn config(&self) -> Result<ModelConfig> {
        config_from_gguf(&self.header)
    }

    /// Configuration and tensors (borrowed from the file), shape-checked against the config.
    pub fn weights(&self) -> Result<ModelWeights<'_>> {
        weights_from_gguf(&self.header, &self.bytes)
    }
}

/// YaRN from llama.cpp's keys (`rope.scaling.original_context_length`, else the model's
/// context; `yarn_beta_fast` 32 and `yarn_beta_slow` 1 by default; `attn_factor`, 1 by
/// default, times `0.1 · ln(factor) + 1`, as llama.cpp scales the rotation). An extrapolation
/// mix other than 1 or a log multiplier (DeepSeek's form) is refused by name.
fn yarn(
    h: &GgufHeader,
    key: &dyn Fn(&str) -> String,
    factor: f32,
    file: &str,
) -> Result<RopeScaling> {
    let f32_or =
        |k: &str, default: f32| -> Result<f32> { Ok(h.get_f32(&key(k))?.unwrap_or(default)) };
    for (k, neutral) in [
        ("rope.scaling.yarn_ext_factor", 1.0),
        ("rope.scaling.yarn_log_multiplier", 0.0),
    ] {
        let v = f32_or(k, neutral)?;
        if v != neutral {
            return Err(Error::Unsupported {
                file: file.to_string(),
                what: format!("YaRN with `{}` = {v}", key(k)),
            });
        }
    }
    let original = match h.get_u64(&key("rope.scaling.original_context_length"))? {
        Some(v) => to_usize(v, "rope.scaling.original_context_length", file)?,
        None => match h.get_u64(&key("context_length"))? {
            Some(v) => to_usize(v, "context_length", file)?,
            None => 0,
        },
    };
    Ok(RopeScaling::Yarn {
        factor,
        original_context: original,
        beta_fast: f32_or("rope.scaling.yarn_beta_fast", 32.0)?,
        beta_slow: f32_or("rope.scaling.yarn_beta_slow", 1.0)?,
        attention_factor: f32_or("rope.scaling.attn_factor", 1.0)?
            * crate::config::yarn_default_attention_factor(factor),
    })
}

fn to_usize(v: u64, key: &str, file: &str) -> Result<usize> {
    usize::try_from(v).map_err(|_| Error::format(file, format!("`{key}` = {v} is too large")))
}

/// Reads the model configuration from GGUF metadata (`general.architecture` and the
/// `{arch}.*` keys) and the shape of `token_embd.weight`.
pub fn config_from_gguf(h: &GgufHeader) -> Result<ModelConfig> {
    let file = h.file();
    let arch_name = h.architecture()?;
    let (arch, rope_layout, qkv_bias) = match arch_name {
        // llama.cpp's converter permutes llama's Q/K rows for interleaved-pair RoPE ...
        "llama" => (Architecture::Llama, RopeLayout::Interleaved, false),
        // ... but not Qwen2's, which keeps the rotate-half pairing (and has q/k/v biases).
        "qwen2" => (Architecture::Llama, RopeLayout::RotateHalf, true),
        // Qwen3: Qwen2 without the biases, with QK-norm
        "qwen3" => (Architecture::Llama, RopeLayout::RotateHalf, false),
        // Phi-3: the Llama graph with fused qkv and gate|up matrices (split on load) and
        // rotate-half RoPE, unpermuted
        "phi3" => (Architecture::Llama, RopeLayout::RotateHalf, false),
        "gpt2" => (Architecture::Gpt2, RopeLayout::None, true),
        // Gemma 3: rotate-half RoPE, unpermuted
        "gemma3" => (Architecture::Gemma3, RopeLayout::RotateHalf, false),
        other => {
            return Err(Error::Unsupported {
                file: file.to_string(),
                what: format!("architecture `{other}`"),
            })
        }
    };
    let key = |k: &str| format!("{arch_name}.{k}");
    let optional = |k: &str| -> Result<Option<usize>> {
        let k = key(k);
        h.get_u64(&k)?.map(|v| to_usize(v, &k, file)).transpose()
    };
    let required = |k: &str| -> Result<usize> {
        optional(k)?.ok_or_else(|| Error::format(file, format!("missing metadata `{}`", key(k))))
    };
    let hidden = required("embedding_length")?;
    let n_heads = required("attention.head_count")?;
    if n_heads == 0 {
        return Err(Error::format(
            file,
            format!("`{}` is 0", key("attention.head_count")),
        ));
    }
    // Llama 3's scaling comes as the `rope_freqs.weight` tensor (read with the weights)
    let mut rope_scaling = RopeScaling::None;
    if let Some(kind) = h.get_str(&key("rope.scaling.type"))? {
        let factor = h.get_f32(&key("rope.scaling.factor"))?.unwrap_or(1.0);
        match kind {
            _ if factor == 1.0 => {}
            "none" => {}
            "linear" => rope_scaling = RopeScaling::Linear { factor },
            "yarn" => rope_scaling = yarn(h, &key, factor, file)?,
            _ => {
                return Err(Error::Unsupported {
                    file: file.to_string(),
                    what: format!("RoPE scaling `{kind}` with factor {factor} (supported: linear, yarn, and Llama 3's rope_freqs)"),
                })
            }
        }
    }
    let embd = h.tensor("token_embd.weight").ok_or_else(|| {
        Error::format(
            file,
            "missing tensor `token_embd.weight` (needed for the vocabulary size)",
        )
    })?;
    let vocab = match embd.shape()[..] {
        [v, _] => to_usize(v, "token_embd.weight rows", file)?,
        _ => {
            return Err(Error::format(
                file,
                format!(
                    "tensor `token_embd.weight` should be 2-D, has shape {:?}",
                    embd.shape()
                ),
            ))
        }
    };
    let (norm, eps_key, activation) = match arch {
        Architecture::Llama => (
            NormKind::RmsNorm,
            "attention.layer_norm_rms_epsilon",
            Activation::SwiGlu,
        ),
        Architecture::Gpt2 => (
            NormKind::LayerNorm,
            "attention.layer_norm_epsilon",
            Activation::GeluTanh,
        ),
        Architecture::Gemma3 => (
            NormKind::RmsNorm,
            "attention.layer_norm_rms_epsilon",
            Activation::GeGlu,
        ),
    };
    let sliding_window = optional("attention.sliding_window")?.filter(|&w| w > 0);
    // Gemma 3 interleaves local layers (the window) with global ones; other models trained
    // with a window are exact only within it, so their context is capped there
    let (local_attention, context_cap) = match arch {
        Architecture::Gemma3 => (
            Some(LocalAttention {
                window: sliding_window.unwrap_or(GEMMA3_WINDOW),
                pattern: optional("attention.sliding_window_pattern")?.unwrap_or(GEMMA3_PATTERN),
                rope_theta: h
                    .get_f32(&key("rope.freq_base_swa"))?
                    .unwrap_or(GEMMA3_LOCAL_ROPE_THETA),
            }),
            usize::MAX,
        ),
        _ => (None, sliding_window.unwrap_or(usize::MAX)),
    };
    let bos_id = h.get_u32("tokenizer.ggml.bos_token_id")?;
    let mut eos_ids = Vec::new();
    for k in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"] {
        if let Some(id) = h.get_u32(k)? {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
    }
    let config = ModelConfig {
        arch,
        vocab_size: vocab,
        hidden_size: hidden,
        n_layers: required("block_count")?,
        n_heads,
        n_kv_heads: optional("attention.head_count_kv")?.unwrap_or(n_heads),
        // n_heads is not 0 (checked above); 0 here fails validation
        head_dim: optional("attention.key_length")?
            .unwrap_or(hidden.checked_div(n_heads).unwrap_or(0)),
        ffn_size: required("feed_forward_length")?,
        context_length: required("context_length")?.min(context_cap),
        norm,
        norm_eps: h.get_f32(&key(eps_key))?.unwrap_or(1e-5),
        rope_theta: if rope_layout == RopeLayout::None {
            0.0
        } else {
            h.get_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0)
        },
        rope_layout,
        rope_scaling,
        activation,
        tied_embeddings: h.tensor("output.weight").is_none(),
        qkv_bias,
        qk_norm: matches!(arch_name, "qwen3" | "gemma3"),
        bos_id,
        eos_ids,
        local_attention,
    };
    config.validate(file)?;
    Ok(config)
}

/// The tensor in which llama.cpp stores Llama 3.1's RoPE scaling: `[head_dim / 2]` divisors.
pub const ROPE_FREQS: &str = "rope_freqs.weight";

/// The configuration and every tensor of a GGUF file, borrowing `bytes` (the whole file).
pub fn weights_from_gguf<'a>(h: &GgufHeader, bytes: &'a [u8]) -> Result<ModelWeights<'a>> {
    let mut config = config_from_gguf(h)?;
    let mut tensors = BTreeMap::new();
    for info in h.tensors() {
        let shape = info
            .shape()
            .iter()
            .map(|&d| to_usize(d, &info.name, h.file()))
            .collect::<Result<Vec<_>>>()?;
        let data = h.tensor_data(bytes, info)?;
        tensors.insert(
            info.name.clone(),
            Tensor {
                shape,
                dtype: info.dtype,
                data: Cow::Borrowed(data),
            },
        );
    }
    if config.arch == crate::config::Architecture::Llama {
        crate::model::unfuse::split_fused(&config, &mut tensors)?;
    }
    // llama.cpp writes Llama 3.1's frequency scaling as one divisor per rotated pair
    if let Some(t) = tensors.get(ROPE_FREQS) {
        let values = crate::dtype::dequantize(
            t.dtype,
            &t.data,
            t.shape.iter().product::<usize>() as u64,
            ROPE_FREQS,
        )?;
        config.rope_scaling = RopeScaling::Factors(values);
        config.validate(h.file())?;
    }
    let weights = ModelWeights {
        file: h.file().to_string(),
        config,
        tensors,
    };
    weights.check_shapes()?;
    Ok(weights)
}
