//! The architectures, one file each ([`llama`], [`gpt2`], [`gemma3`], [`bert`]). Each declares an
//! [`ArchSpec`]: the names its GGUF and Hugging Face forms go by, the metadata and
//! `config.json` fields it reads, how its Hugging Face tensor names map to the GGUF ones, the
//! tensors it must have, what the loader may fuse, and the [`Graph`] it builds. The config
//! checks, the formats, the backends and the reference read an architecture through this
//! module; nothing else branches on [`Architecture`].
//!
//! Adding an architecture is one file here with its `ARCH` and `SPEC`, its `mod` line and its
//! entry in [`REGISTRY`] (and its case in the registry's tests).

use crate::config::{Activation, Architecture, ModelConfig, NormKind, Pooling, RopeLayout};
use crate::error::{Error, Result};
use crate::model::graph::{EmbedScale, Graph, Lookup, WeightIndex};

pub mod bert;
pub mod gemma3;
pub mod gpt2;
pub mod hf;
pub mod llama;

pub use hf::HfConfig;

/// One value of GGUF's `general.architecture` an architecture reads, and what a file under
/// that name implies beyond its metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgufName {
    /// The value (`llama`, `qwen2`, ...); also the prefix of its metadata keys.
    pub name: &'static str,
    /// How the file's Q and K rows pair RoPE's dimensions.
    pub rope_layout: RopeLayout,
    /// Q, K and V projections have biases.
    pub qkv_bias: bool,
    /// Each query and key head is RMS-normalised before RoPE.
    pub qk_norm: bool,
}

/// How an architecture's models treat a sliding window given in the file.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Window {
    /// Every layer was trained within the window: the model is exact only inside it, so the
    /// context is capped there.
    CapsContext,
    /// Local (windowed) layers between global ones, with these defaults where a file gives
    /// none: the window, the period of the pattern (a global layer every `pattern`), and the
    /// local layers' RoPE base.
    Interleaved {
        /// Keys a local layer reads.
        window: usize,
        /// Every `pattern`-th layer is global.
        pattern: usize,
        /// RoPE base of the local layers.
        rope_theta: f32,
    },
}

/// What a Hugging Face tensor needs before it is a GGUF one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HfFix {
    /// Stored `[in, out]` (GPT-2's Conv1D): transposed to `[out, in]`.
    Transpose,
    /// A norm gain stored as `w` for `1 + w` (Gemma): `1 + w` as f32.
    PlusOne,
}

/// Which of a layer's matrices the loader may fuse (when their types and widths agree and the
/// model has no QK-norm between the projection and RoPE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fusion {
    /// Q, K and V stacked into one matrix.
    pub qkv: bool,
    /// Gate and up interleaved into one matrix.
    pub gate_up: bool,
}

/// Calls its argument on each expected tensor, `(name, shape)`, stopping at the first error.
pub type TensorVisitor<'a> = &'a mut dyn FnMut(String, Vec<usize>) -> Result<()>;

/// Everything the engine knows about one architecture.
#[derive(Debug)]
pub struct ArchSpec {
    /// The architecture.
    pub arch: Architecture,
    /// The `general.architecture` values read as this architecture (the first is its own).
    pub gguf_names: &'static [GgufName],
    /// Normalisation, and the GGUF metadata key of its epsilon (after `{name}.`).
    pub norm: NormKind,
    /// GGUF metadata key of the norm epsilon, after the `{name}.` prefix.
    pub gguf_eps_key: &'static str,
    /// Feed-forward activation.
    pub activation: Activation,
    /// What a sliding window in the file means.
    pub window: Window,
    /// What the embedding rows are multiplied by.
    pub embedding_scale: EmbedScale,
    /// Attention reads every position of the text, later ones too: an encoder, which embeds
    /// and does not generate ([`ModelConfig::bidirectional`]).
    pub bidirectional: bool,
    /// The pooling of its embeddings where a file names none ([`ModelConfig::pooling`]).
    pub pooling: Option<Pooling>,
    /// The loader may fuse these (see [`crate::model::fuse`]).
    pub fusion: Fusion,
    /// A file may store Q/K/V or gate/up stacked, to be split on load
    /// ([`crate::model::unfuse`], Phi-3).
    pub splits_stacked: bool,
    /// The `model_type` values of `config.json` read as this architecture.
    pub hf_model_types: &'static [&'static str],
    /// The configuration from a parsed `config.json` (named `file` in errors), without the
    /// special tokens (the caller reads them) and before [`validate`].
    pub hf_config: fn(&HfConfig, &str) -> Result<ModelConfig>,
    /// The GGUF name of a Hugging Face tensor, or `None` for one the engine does not read.
    pub hf_tensor: fn(&str) -> Option<String>,
    /// What a Hugging Face tensor (by its GGUF and Hugging Face names) needs on load.
    pub hf_fix: fn(&str, &str) -> Option<HfFix>,
    /// A rule of the architecture `config` breaks, in words (`None` when it keeps them all).
    pub check: fn(&ModelConfig) -> Option<String>,
    /// Visits every tensor the forward pass reads, with its logical shape (outermost first;
    /// matrices `[out, in]`), in order.
    pub tensors: fn(&ModelConfig, TensorVisitor<'_>) -> Result<()>,
    /// The graph over the tensors `Lookup` finds.
    pub build: fn(&ModelConfig, &Lookup<'_>) -> Result<Graph>,
}

/// Every architecture, in the order errors list them.
pub static REGISTRY: [&ArchSpec; 4] = [&llama::SPEC, &gpt2::SPEC, &gemma3::SPEC, &bert::SPEC];

/// The spec of `arch`.
pub fn spec(arch: Architecture) -> &'static ArchSpec {
    REGISTRY
        .iter()
        .copied()
        .find(|s| s.arch == arch)
        // an Architecture is made only by the file that declares it (its `ARCH`, read
        // through its `SPEC`), and the registry lists every such file (its tests hold it)
        .expect("every architecture is in the registry")
}

/// The architecture a GGUF file's `general.architecture` names, with what the name implies.
pub fn by_gguf_name(name: &str) -> Option<(&'static ArchSpec, &'static GgufName)> {
    REGISTRY
        .iter()
        .find_map(|s| Some((*s, s.gguf_names.iter().find(|g| g.name == name)?)))
}

/// The architecture a `config.json`'s `model_type` names.
pub fn by_hf_model_type(model_type: &str) -> Option<&'static ArchSpec> {
    REGISTRY
        .iter()
        .copied()
        .find(|s| s.hf_model_types.contains(&model_type))
}

/// The GGUF `general.architecture` values the engine reads, for messages (`llama, qwen2, ...`).
pub fn gguf_names() -> String {
    let names: Vec<&str> = REGISTRY
        .iter()
        .flat_map(|s| s.gguf_names.iter().map(|g| g.name))
        .collect();
    names.join(", ")
}

/// The `model_type` values the engine reads, for messages.
pub fn hf_model_types() -> String {
    let names: Vec<&str> = REGISTRY
        .iter()
        .flat_map(|s| s.hf_model_types.iter().copied())
        .collect();
    names.join(", ")
}

/// Checks that `config` describes a model the engine can run: the numbers
/// ([`ModelConfig::validate`]) and its architecture's own rules; `file` names the source.
pub fn validate(config: &ModelConfig, file: &str) -> Result<()> {
    config.validate(file)?;
    match (spec(config.arch).check)(config) {
        Some(problem) => Err(Error::format(file, problem)),
        None => Ok(()),
    }
}

/// Every tensor the forward pass of `config`'s model reads, with its logical shape (outermost
/// first; matrices are `[out, in]`).
pub fn expected_tensors(config: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let mut out = Vec::new();
    // the visitor never fails, so neither does the visit
    let _ = (spec(config.arch).tensors)(config, &mut |name, shape| {
        out.push((name, shape));
        Ok(())
    });
    out
}

/// Checks that `shape_of(name)` gives the expected shape for every tensor the forward pass
/// reads, with the name of the file that holds it; errors name the first missing tensor (in
/// `file`) or misshapen one (in its own file). A hostile layer count costs nothing past the
/// first missing tensor.
pub fn check_tensors<'s>(
    config: &ModelConfig,
    file: &str,
    shape_of: impl Fn(&str) -> Option<(&'s [usize], &'s str)>,
) -> Result<()> {
    (spec(config.arch).tensors)(config, &mut |name, want| match shape_of(&name) {
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

/// The graph of `config`'s architecture over the tensors of `index` (`file` names the model in
/// errors).
pub fn build(config: &ModelConfig, index: &dyn WeightIndex, file: &str) -> Result<Graph> {
    (spec(config.arch).build)(config, &Lookup::new(index, file))
}

/// The output head's tensor and the final norm, shared by every architecture's list:
/// `output_norm` (with a bias for LayerNorm) and, untied, `output.weight` `[vocab, d]`.
pub(crate) fn head_tensors(c: &ModelConfig, f: TensorVisitor<'_>) -> Result<()> {
    let d = c.hidden_size;
    f("output_norm.weight".into(), vec![d])?;
    if c.norm == NormKind::LayerNorm {
        f("output_norm.bias".into(), vec![d])?;
    }
    if !c.tied_embeddings {
        f("output.weight".into(), vec![c.vocab_size, d])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
