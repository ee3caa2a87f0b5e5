//! The normalised model description every loader produces, whatever the file format, and the
//! tensors (names and shapes) a model with that description must have.
//!
//! Tensor names are the GGUF ones (`token_embd.weight`, `blk.{i}.attn_q.weight`, ...), which
//! are short and architecture-neutral; the Hugging Face loader renames to them.

use serde::Serialize;

use crate::error::{Error, Result};

mod kv_layout;
mod local_attention;
mod rope_scaling;
pub use kv_layout::{FillMark, KvLayout};
pub use local_attention::{LocalAttention, GEMMA3_LOCAL_ROPE_THETA, GEMMA3_PATTERN};
pub use rope_scaling::{yarn_default_attention_factor, RopeFreqs, RopeScaling};

/// The transformer family, which fixes the forward graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// Llama 2/3, SmolLM/SmolLM2, TinyLlama, Mistral, Qwen2 (with q/k/v biases), Qwen3 (with
    /// QK-norm): RMSNorm, RoPE, grouped-query attention, SwiGLU feed-forward.
    Llama,
    /// GPT-2: LayerNorm with bias, learned position embeddings, fused QKV with bias, GELU.
    Gpt2,
    /// Gemma 3: the embedding scaled by √d, RMSNorm before and after attention and the
    /// feed-forward, RMSNorm of each query and key head (QK-norm), GeGLU, and local
    /// (sliding-window) layers between global ones ([`LocalAttention`]).
    Gemma3,
}

impl Architecture {
    /// The name used in GGUF's `general.architecture`.
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Gpt2 => "gpt2",
            Architecture::Gemma3 => "gemma3",
        }
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

    /// Checks that the numbers describe a model the engine can run; `file` names the source.
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
        if self.arch == Architecture::Gpt2 && self.q_dim() != self.hidden_size {
            return bad(format!(
                "GPT-2 needs n_heads · head_dim = hidden_size, got {} · {} != {}",
                self.n_heads, self.head_dim, self.hidden_size
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
        if self.arch == Architecture::Gemma3 && !self.qk_norm {
            return bad("Gemma 3 normalises its query and key heads: qk_norm must be set".into());
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

    /// Every tensor the forward pass reads, with its logical shape (outermost first; matrices
    /// are `[out, in]`).
    pub fn expected_tensors(&self) -> Vec<(String, Vec<usize>)> {
        let mut t = Vec::new();
        let all: Result<(), std::convert::Infallible> = self.visit_expected(&mut |name, shape| {
            t.push((name, shape));
            Ok(())
        });
        let Ok(()) = all;
        t
    }

    /// Calls `f` on each of [`expected_tensors`](Self::expected_tensors) in order, stopping at
    /// its first error: checking a layer count from a hostile file costs nothing past the first
    /// tensor that is missing.
    fn visit_expected<E>(
        &self,
        f: &mut dyn FnMut(String, Vec<usize>) -> Result<(), E>,
    ) -> Result<(), E> {
        let (d, ff, v) = (self.hidden_size, self.ffn_size, self.vocab_size);
        f("token_embd.weight".into(), vec![v, d])?;
        match self.arch {
            Architecture::Llama | Architecture::Gemma3 => {
                let (q, kv) = (self.q_dim(), self.kv_dim());
                // Gemma 3 also normalises each sub-layer's output before the residual
                let post_norms = self.arch == Architecture::Gemma3;
                for i in 0..self.n_layers {
                    let b = |s: &str| format!("blk.{i}.{s}");
                    f(b("attn_norm.weight"), vec![d])?;
                    f(b("attn_q.weight"), vec![q, d])?;
                    f(b("attn_k.weight"), vec![kv, d])?;
                    f(b("attn_v.weight"), vec![kv, d])?;
                    if self.qkv_bias {
                        f(b("attn_q.bias"), vec![q])?;
                        f(b("attn_k.bias"), vec![kv])?;
                        f(b("attn_v.bias"), vec![kv])?;
                    }
                    if self.qk_norm {
                        f(b("attn_q_norm.weight"), vec![self.head_dim])?;
                        f(b("attn_k_norm.weight"), vec![self.head_dim])?;
                    }
                    f(b("attn_output.weight"), vec![d, q])?;
                    if post_norms {
                        f(b("post_attention_norm.weight"), vec![d])?;
                    }
                    f(b("ffn_norm.weight"), vec![d])?;
                    f(b("ffn_gate.weight"), vec![ff, d])?;
                    f(b("ffn_up.weight"), vec![ff, d])?;
                    f(b("ffn_down.weight"), vec![d, ff])?;
                    if post_norms {
                        f(b("post_ffw_norm.weight"), vec![d])?;
                    }
                }
                f("output_norm.weight".into(), vec![d])?;
            }
            Architecture::Gpt2 => {
                f("position_embd.weight".into(), vec![self.context_length, d])?;
                for i in 0..self.n_layers {
                    let b = |s: &str| format!("blk.{i}.{s}");
                    f(b("attn_norm.weight"), vec![d])?;
                    f(b("attn_norm.bias"), vec![d])?;
                    f(b("attn_qkv.weight"), vec![3 * d, d])?;
                    f(b("attn_qkv.bias"), vec![3 * d])?;
                    f(b("attn_output.weight"), vec![d, d])?;
                    f(b("attn_output.bias"), vec![d])?;
                    f(b("ffn_norm.weight"), vec![d])?;
                    f(b("ffn_norm.bias"), vec![d])?;
                    f(b("ffn_up.weight"), vec![ff, d])?;
                    f(b("ffn_up.bias"), vec![ff])?;
                    f(b("ffn_down.weight"), vec![d, ff])?;
                    f(b("ffn_down.bias"), vec![d])?;
                }
                f("output_norm.weight".into(), vec![d])?;
                f("output_norm.bias".into(), vec![d])?;
            }
        }
        if !self.tied_embeddings {
            f("output.weight".into(), vec![v, d])?;
        }
        Ok(())
    }

    /// Checks that `shape_of(name)` gives the expected shape for every tensor the forward
    /// pass reads, with the name of the file that holds it; errors name the first missing
    /// tensor (in `file`) or misshapen one (in its own file).
    pub fn check_tensors<'s>(
        &self,
        file: &str,
        shape_of: impl Fn(&str) -> Option<(&'s [usize], &'s str)>,
    ) -> Result<()> {
        self.visit_expected(&mut |name, want| match shape_of(&name) {
            None => Err(Error::format(
                file,
                format!("missing tensor `{name}` (expected shape {want:?})"),
            )),
            Some((got, held_in)) if got != want.as_slice() => Err(Error::format(
                held_in,
                format!("tensor `{name}` has shape {got:?}, but the config needs {want:?}"),
            )),
            Some(_) => Ok(()),
        })
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
            arch: Architecture::Llama,
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
    fn expected_tensors_cover_every_layer() {
        let c = tiny_llama();
        let t = c.expected_tensors();
        // embedding + 9 per layer + output norm + untied head
        assert_eq!(t.len(), 1 + 9 * 2 + 1 + 1);
        assert!(t.contains(&("blk.1.attn_k.weight".into(), vec![32, 64])));
        let mut tied = c.clone();
        tied.tied_embeddings = true;
        assert_eq!(tied.expected_tensors().len(), t.len() - 1);
    }

    #[test]
    fn check_tensors_reports_missing_and_misshapen() {
        let c = tiny_llama();
        let shapes: std::collections::HashMap<String, Vec<usize>> =
            c.expected_tensors().into_iter().collect();
        assert!(c
            .check_tensors("f", |n| shapes.get(n).map(|s| (s.as_slice(), "f")))
            .is_ok());
        let mut missing = shapes.clone();
        missing.remove("blk.1.ffn_up.weight");
        let err = c
            .check_tensors("f", |n| missing.get(n).map(|s| (s.as_slice(), "f")))
            .unwrap_err();
        assert!(err
            .to_string()
            .contains("missing tensor `blk.1.ffn_up.weight`"));
        let mut wrong = shapes;
        wrong.insert("blk.0.attn_q.weight".into(), vec![64, 65]);
        let err = c
            .check_tensors("f", |n| wrong.get(n).map(|s| (s.as_slice(), "f")))
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("`blk.0.attn_q.weight` has shape [64, 65]"),
            "{err}"
        );
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
