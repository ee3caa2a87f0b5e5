//! The normalised model description every loader produces, whatever the file format. The
//! tensors (names and shapes) a model with that description must have are its architecture's
//! ([`crate::model::arch`]).
//!
//! Tensor names are the GGUF ones (`token_embd.weight`, `blk.{i}.attn_q.weight`, ...), which
//! are short and architecture-neutral; the Hugging Face loader renames to them.

use serde::Serialize;

use crate::error::{Error, Result};

mod kv_layout;
mod local_attention;
mod pooling;
mod rope_scaling;
pub use kv_layout::{FillMark, KvLayout};
pub use local_attention::{LocalAttention, GEMMA3_LOCAL_ROPE_THETA, GEMMA3_PATTERN};
pub use pooling::Pooling;
pub use rope_scaling::{yarn_default_attention_factor, RopeFreqs, RopeScaling};

/// The transformer family, which fixes the forward graph: one file of [`crate::model::arch`]
/// each (Llama and its kin, GPT-2, Gemma 3), named by its own GGUF name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Architecture(&'static str);

impl Architecture {
    /// The architecture called `name`: only the file of [`crate::model::arch`] that declares
    /// it makes one (its `ARCH`), and the module's registry lists every such file.
    pub(crate) const fn named(name: &'static str) -> Self {
        Architecture(name)
    }

    /// Its own name, as GGUF's `general.architecture` spells it (`llama`, `gpt2`, `gemma3`).
    pub fn name(self) -> &'static str {
        self.0
    }
}

impl Serialize for Architecture {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
    }
}

/// Normalisation layer type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NormKind {
    /// `x / sqrt(mean(x²) + eps) · g`.
    RmsNorm,
    /// `(x − mean) / sqrt(var + eps) · g + b`.
    LayerNorm,
}

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RopeLayout {
    /// Rotates pairs `(2i, 2i+1)`: GGUF llama files, whose Q/K rows were permuted to match.
    Interleaved,
    /// Rotates pairs `(i, i + head_dim/2)`: Hugging Face checkpoints.
    RotateHalf,
    /// No rotary embedding (GPT-2 uses learned positions).
    None,
}

/// Feed-forward activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Activation {
    /// `down(silu(gate(x)) · up(x))`.
    SwiGlu,
    /// `down(gelu_tanh(up(x)))`.
    GeluTanh,
    /// `down(gelu(up(x)))` with the exact GELU, `x · Φ(x)` through `erf` (BERT).
    GeluErf,
    /// `down(gelu_tanh(gate(x)) · up(x))`.
    GeGlu,
}

/// Everything the engine needs to know about a model's shape and numerics.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelConfig {
    /// Transformer family.
    pub arch: Architecture,
    /// Rows of the token embedding (and of the LM head).
    pub vocab_size: usize,
    /// Model width `d`.
    pub hidden_size: usize,
    /// Transformer blocks.
    pub n_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (`n_heads` without grouped-query attention).
    pub n_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Feed-forward inner width.
    pub ffn_size: usize,
    /// Longest sequence the model was trained for.
    pub context_length: usize,
    /// Normalisation type.
    pub norm: NormKind,
    /// Normalisation epsilon.
    pub norm_eps: f32,
    /// RoPE base frequency (unused without RoPE).
    pub rope_theta: f32,
    /// RoPE pairing.
    pub rope_layout: RopeLayout,
    /// RoPE frequency scaling for contexts past the original training length.
    pub rope_scaling: RopeScaling,
    /// Feed-forward activation.
    pub activation: Activation,
    /// The LM head reuses the token embedding.
    pub tied_embeddings: bool,
    /// Q, K and V projections have biases (Qwen2).
    pub qkv_bias: bool,
    /// Each query and key head is RMS-normalised before RoPE, with gains `attn_q_norm` and
    /// `attn_k_norm` of `[head_dim]` (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// Beginning-of-sequence token.
    pub bos_id: Option<u32>,
    /// End-of-sequence tokens (several allowed, e.g. `<|im_end|>` and `<|endoftext|>`).
    pub eos_ids: Vec<u32>,
    /// Local (sliding-window) layers between global ones, for models trained that way.
    pub local_attention: Option<LocalAttention>,
    /// Every token attends to every position of its text, later ones too (an encoder such
    /// as BERT, which embeds text and does not generate); `false` for causal decoders.
    pub bidirectional: bool,
    /// The pooling the model's embeddings were trained with, where its file names one
    /// (BERT's `pooling_type`); `None` leaves it to the caller (mean by default).
    pub pooling: Option<Pooling>,
}

/// Largest value accepted for any dimension, a guard against absurd metadata.
const MAX_DIM: usize = 1 << 24;

impl ModelConfig {
    /// The RoPE base and scaling.
    pub fn rope(&self) -> RopeFreqs {
        RopeFreqs {
            theta: self.rope_theta,
            scaling: self.rope_scaling.clone(),
        }
    }

    /// The RoPE of `layer`: a local layer's own base, or the model's.
    pub fn layer_rope(&self, layer: usize) -> RopeFreqs {
        match &self.local_attention {
            Some(l) if l.is_local(layer) => l.rope(),
            _ => self.rope(),
        }
    }

    /// The factor on `layer`'s attention scores beyond `1 / √head_dim`: its RoPE's attention
    /// factor squared (YaRN multiplies the rotated queries and keys by it; 1 otherwise).
    pub fn layer_score_scale(&self, layer: usize) -> f32 {
        let m = f64::from(self.layer_rope(layer).scaling.attention_factor());
        (m * m) as f32
    }

    /// The keys `layer` was trained to read: its window for a local layer, `None` (every key)
    /// otherwise.
    pub fn layer_window(&self, layer: usize) -> Option<u32> {
        match &self.local_attention {
            Some(l) if l.is_local(layer) => Some(u32::try_from(l.window).unwrap_or(u32::MAX)),
            _ => None,
        }
    }

    /// Width of the K (and V) projection: `n_kv_heads · head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Width of the Q projection: `n_heads · head_dim`.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Checks that the numbers describe a model the engine can run, whatever its architecture;
    /// `file` names the source. [`crate::model::arch::validate`] adds the architecture's own
    /// rules, and is what the loaders call.
    pub fn validate(&self, file: &str) -> Result<()> {
        let bad = |m: String| Err(Error::format(file, m));
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("n_kv_heads", self.n_kv_heads),
            ("head_dim", self.head_dim),
            ("ffn_size", self.ffn_size),
            ("context_length", self.context_length),
        ] {
            if v == 0 || v > MAX_DIM {
                return bad(format!("{name} = {v} is outside 1..={MAX_DIM}"));
            }
        }
        for (name, heads) in [("n_heads", self.n_heads), ("n_kv_heads", self.n_kv_heads)] {
            if heads.checked_mul(self.head_dim).is_none_or(|n| n > MAX_DIM) {
                return bad(format!(
                    "{name} · head_dim = {heads} · {} is over {MAX_DIM}",
                    self.head_dim
                ));
            }
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad(format!(
                "n_heads = {} is not a multiple of n_kv_heads = {}",
                self.n_heads, self.n_kv_heads
            ));
        }
        if self.rope_layout != RopeLayout::None && !self.head_dim.is_multiple_of(2) {
            return bad(format!(
                "head_dim = {} must be even for RoPE",
                self.head_dim
            ));
        }
        if !(self.norm_eps.is_finite() && self.norm_eps >= 0.0) {
            return bad(format!(
                "norm epsilon {} must be finite and >= 0",
                self.norm_eps
            ));
        }
        if self.rope_layout != RopeLayout::None
            && !(self.rope_theta.is_finite() && self.rope_theta > 0.0)
        {
            return bad(format!(
                "rope theta {} must be finite and > 0",
                self.rope_theta
            ));
        }
        if self.rope_layout != RopeLayout::None {
            self.rope_scaling
                .check(self.head_dim)
                .map_err(|e| Error::format(file, e.to_string()))?;
        }
        if let Some(problem) = self
            .local_attention
            .as_ref()
            .and_then(LocalAttention::problem)
        {
            return bad(problem);
        }
        for &id in self.bos_id.iter().chain(&self.eos_ids) {
            if id as usize >= self.vocab_size {
                return bad(format!(
                    "special token id {id} is outside the vocabulary of {}",
                    self.vocab_size
                ));
            }
        }
        Ok(())
    }
}

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
/// and at most what one layer's K or V buffer (`context` rows of `row_bytes`, the larger of a
/// K and a V row in the cache's kinds: `kv_dim × 4` for f32) may hold under the device's
/// `maxStorageBufferBindingSize` and `maxBufferSize`.
pub fn auto_context(
    config: &ModelConfig,
    row_bytes: u64,
    max_binding: u64,
    max_buffer: u64,
) -> ContextChoice {
    let row = row_bytes.max(1);
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn tiny_llama() -> ModelConfig {
        ModelConfig {
            arch: Architecture::named("llama"),
            vocab_size: 512,
            hidden_size: 64,
            n_layers: 2,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 16,
            ffn_size: 160,
            context_length: 128,
            norm: NormKind::RmsNorm,
            norm_eps: 1e-5,
            rope_theta: 10000.0,
            rope_layout: RopeLayout::RotateHalf,
            rope_scaling: RopeScaling::None,
            activation: Activation::SwiGlu,
            tied_embeddings: false,
            qkv_bias: false,
            qk_norm: false,
            bos_id: Some(0),
            eos_ids: vec![0],
            local_attention: None,
            bidirectional: false,
            pooling: None,
        }
    }

    #[test]
    fn validation_names_the_field() {
        assert!(tiny_llama().validate("m").is_ok());
        type Mutation = fn(&mut ModelConfig);
        let cases: Vec<(Mutation, &str)> = vec![
            (|c| c.n_kv_heads = 3, "not a multiple of n_kv_heads"),
            (|c| c.hidden_size = 0, "hidden_size = 0"),
            (|c| c.head_dim = 15, "must be even"),
            (|c| c.norm_eps = f32::NAN, "epsilon"),
            (|c| c.rope_theta = 0.0, "rope theta"),
            (|c| c.eos_ids = vec![512], "outside the vocabulary"),
            (|c| c.n_layers = 1 << 30, "n_layers"),
            (
                |c| {
                    (c.n_heads, c.n_kv_heads, c.head_dim) = (1 << 16, 1 << 16, 1 << 10);
                },
                "n_heads · head_dim",
            ),
        ];
        for (mutate, needle) in cases {
            let mut c = tiny_llama();
            mutate(&mut c);
            let err = c.validate("m.gguf").unwrap_err().to_string();
            assert!(err.contains(needle) && err.starts_with("m.gguf"), "{err}");
        }
    }

    #[test]
    fn auto_context_names_what_bounds_it() {
        let sized = |context_length: usize, kv_dim: usize| {
            let mut c = tiny_llama();
            c.context_length = context_length;
            c.n_kv_heads = kv_dim / c.head_dim;
            c
        };
        let big = 1 << 30;
        let f32_row = 64 * 4;
        let c = sized(2048, 64);
        assert_eq!(auto_context(&c, f32_row, big, big).context, 2048);
        assert!(auto_context(&c, f32_row, big, big)
            .reason
            .contains("trained"));
        let c = sized(32768, 64);
        let choice = auto_context(&c, f32_row, big, big);
        assert_eq!(choice.context, DEFAULT_CONTEXT_CAP);
        assert!(choice.reason.contains("32768"), "{}", choice.reason);
        // 64 KiB of binding holds 256 rows of 64 f32
        let choice = auto_context(&c, f32_row, 1 << 16, big);
        assert_eq!(choice.context, 256);
        // and about 3.8 times as many q8_0 rows (two blocks of 34 bytes: 68 bytes)
        assert_eq!(auto_context(&c, 68, 1 << 16, big).context, 963);
        assert!(choice.reason.contains("65536"), "{}", choice.reason);
    }
}
