//! A GGUF file (or a split set of them) as a model: metadata to [`ModelConfig`], tensor infos
//! to [`ModelWeights`] borrowing the files' bytes (quantized tensors stay quantized).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use super::gguf::{GgufHeader, GgufTensorInfo};
use super::gguf_split::{order_parts, GgufPart};
use crate::config::{LocalAttention, ModelConfig, Pooling, RopeLayout, RopeScaling};
use crate::error::{Error, Result};
use crate::model::arch::{self, Window};
use crate::model::weights::{ModelWeights, Tensor};

/// A GGUF model: one file, or every part of a split set (in part order), each held in memory or
/// (natively) mapped, with their parsed headers. The first file's header holds the model's
/// metadata.
#[derive(Debug)]
pub struct GgufModel {
    parts: Vec<GgufPart>,
    /// Tensor name → (part, index among that part's tensors).
    index: HashMap<String, (usize, usize)>,
}

impl GgufModel {
    /// Parses the header of a whole GGUF file held in memory; `name` names it in errors. A part
    /// of a split set of two or more is refused here (see [`GgufModel::from_parts`]).
    pub fn from_bytes(bytes: Vec<u8>, name: &str) -> Result<Self> {
        Self::from_parts(vec![(bytes, name.to_string())])
    }

    /// The files of one model, each `(bytes, name)`: one file, or every part of a split set in
    /// any order (checked as a set: see [`order_parts`]).
    pub fn from_parts(files: Vec<(Vec<u8>, String)>) -> Result<Self> {
        let parts = files
            .into_iter()
            .map(|(bytes, name)| GgufPart::parse(bytes, &name))
            .collect::<Result<Vec<_>>>()?;
        Self::from_ordered(order_parts(parts)?)
    }

    fn from_ordered(parts: Vec<GgufPart>) -> Result<Self> {
        let mut index = HashMap::new();
        for (p, part) in parts.iter().enumerate() {
            for (i, t) in part.header.tensors().iter().enumerate() {
                index.insert(t.name.clone(), (p, i));
            }
        }
        if parts.is_empty() {
            return Err(Error::invalid("source", "no model file was given"));
        }
        Ok(Self { parts, index })
    }

    /// Maps and parses a GGUF file on disk. The first part of a split set
    /// (`NAME-00001-of-0000N.gguf`) brings the other parts from the same folder; any other part
    /// is refused with the first part's name.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read(path: &std::path::Path) -> Result<Self> {
        use super::gguf_split::{PartName, SplitInfo};

        let read = |path: &std::path::Path, what: &str| -> Result<GgufPart> {
            let bytes = crate::model::file_bytes::FileBytes::map(path).map_err(|e| match e {
                Error::Io { path, message } => Error::Io {
                    path,
                    message: format!("{what}{message}"),
                },
                other => other,
            })?;
            GgufPart::new(bytes, &path.display().to_string())
        };
        let first = read(path, "")?;
        let info = match SplitInfo::of(&first.header)? {
            Some(info) if info.is_split() && info.no == 0 => info,
            _ => return Self::from_ordered(order_parts(vec![first])?),
        };
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(PartName::parse)
            .filter(|n| n.no == 0 && n.count == info.count)
            .ok_or_else(|| {
                Error::format(
                    &first.name,
                    format!(
                        "the first part of a {}-part split GGUF set, but its name does not end in \
                         `-00001-of-{:05}.gguf`, so the other parts cannot be found beside it",
                        info.count, info.count
                    ),
                )
            })?;
        let mut parts = vec![first];
        for k in 1..info.count {
            let sibling = path.with_file_name(name.sibling(k));
            let what = format!(
                "part {} of the {}-part split set of `{}`: ",
                k.saturating_add(1),
                info.count,
                path.display()
            );
            parts.push(read(&sibling, &what)?);
        }
        Self::from_ordered(order_parts(parts)?)
    }

    /// The files of one model, each `part` holding its header (and possibly only that), checked
    /// as a set and put in part order (see [`order_parts`]).
    pub(crate) fn from_checked_parts(parts: Vec<GgufPart>) -> Result<Self> {
        Self::from_ordered(order_parts(parts)?)
    }

    /// The part (in part order) that holds tensor `name`.
    pub fn part_of(&self, name: &str) -> Option<usize> {
        self.index.get(name).map(|&(p, _)| p)
    }

    /// Every tensor described by shape and type, without its bytes (see
    /// [`layout_from_parts`]); `rope_freqs`: the bytes of [`ROPE_FREQS`] where the model has it.
    pub fn layout(&self, rope_freqs: Option<Vec<u8>>) -> Result<ModelWeights<'static>> {
        layout_from_parts(
            self.header(),
            &self.parts,
            &|name| self.tensor(name),
            rope_freqs,
        )
    }

    /// The first file's parsed header: the model's metadata (and that file's tensor infos).
    pub fn header(&self) -> &GgufHeader {
        &self.parts[0].header
    }

    /// The files, in part order (one for a file that is not split).
    pub fn parts(&self) -> &[GgufPart] {
        &self.parts
    }

    /// The description of tensor `name`, in whichever part holds it.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        let &(p, i) = self.index.get(name)?;
        self.parts.get(p)?.header.tensors().get(i)
    }

    /// The normalised configuration.
    pub fn config(&self) -> Result<ModelConfig> {
        config_from_header(self.header(), &|name| self.tensor(name))
    }

    /// Configuration and tensors (borrowed from the files), shape-checked against the config.
    pub fn weights(&self) -> Result<ModelWeights<'_>> {
        weights_from_parts(self.header(), &self.parts, &|name| self.tensor(name))
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
/// `{arch}.*` keys) and the shape of `token_embd.weight`, for a file that holds every tensor.
pub fn config_from_gguf(h: &GgufHeader) -> Result<ModelConfig> {
    config_from_header(h, &|name| h.tensor(name))
}

/// A tensor's description by name, in whichever file of the model holds it.
type TensorLookup<'a> = dyn Fn(&str) -> Option<&'a GgufTensorInfo> + 'a;

/// [`config_from_gguf`] with the tensors found through `tensor` (a split set's parts).
fn config_from_header<'a>(h: &GgufHeader, tensor: &TensorLookup<'a>) -> Result<ModelConfig> {
    let file = h.file();
    let arch_name = h.architecture()?;
    let (spec, flavour) = arch::by_gguf_name(arch_name).ok_or_else(|| Error::Unsupported {
        file: file.to_string(),
        what: format!(
            "architecture `{arch_name}` (supported: {})",
            arch::gguf_names()
        ),
    })?;
    let rope_layout = flavour.rope_layout;
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
    let embd = tensor("token_embd.weight").ok_or_else(|| {
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
    let sliding_window = optional("attention.sliding_window")?.filter(|&w| w > 0);
    // local layers between global ones (the window), or a window over every layer, within
    // which alone the model is exact: its context is capped there
    let (local_attention, context_cap) = match spec.window {
        Window::Interleaved {
            window,
            pattern,
            rope_theta,
        } => (
            Some(LocalAttention {
                window: sliding_window.unwrap_or(window),
                pattern: optional("attention.sliding_window_pattern")?.unwrap_or(pattern),
                rope_theta: h.get_f32(&key("rope.freq_base_swa"))?.unwrap_or(rope_theta),
            }),
            usize::MAX,
        ),
        Window::CapsContext => (None, sliding_window.unwrap_or(usize::MAX)),
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
        arch: spec.arch,
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
        norm: spec.norm,
        norm_eps: h.get_f32(&key(spec.gguf_eps_key))?.unwrap_or(1e-5),
        rope_theta: if rope_layout == RopeLayout::None {
            0.0
        } else {
            h.get_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0)
        },
        rope_layout,
        rope_scaling,
        activation: spec.activation,
        tied_embeddings: tensor("output.weight").is_none(),
        qkv_bias: flavour.qkv_bias,
        qk_norm: flavour.qk_norm,
        bos_id,
        eos_ids,
        local_attention,
        bidirectional: spec.bidirectional,
        pooling: match optional("pooling_type")? {
            None => spec.pooling,
            Some(kind) => pooling_type(kind, spec.bidirectional, file)?,
        },
    };
    arch::validate(&config, file)?;
    Ok(config)
}

/// The pooling a GGUF `{arch}.pooling_type` names, as llama.cpp numbers them: 0 none (the
/// caller's choice), 1 mean, 2 the first token (`[CLS]`), 3 the last. Another value (4, a
/// reranker's score) leaves a decoder's default alone (it still generates; its embeddings
/// pool as the caller says) and refuses an `encoder`, whose embeddings it would make
/// meaningless, naming the value.
fn pooling_type(kind: usize, encoder: bool, file: &str) -> Result<Option<Pooling>> {
    Ok(match kind {
        0 => None,
        1 => Some(Pooling::Mean),
        2 => Some(Pooling::Cls),
        3 => Some(Pooling::Last),
        _ if !encoder => None,
        _ => {
            return Err(Error::Unsupported {
                file: file.to_string(),
                what: format!(
                    "pooling_type {kind} (embeddings pool by mean (1), first token (2) or last \
                     token (3); 4 is a reranker's score)"
                ),
            })
        }
    })
}

/// The tensor in which llama.cpp stores Llama 3.1's RoPE scaling: `[head_dim / 2]` divisors.
pub const ROPE_FREQS: &str = "rope_freqs.weight";

/// How [`Error::Unsupported`] starts for a file that can be loaded, but only whole (not read a
/// tensor at a time): see [`must_read_whole`].
const READ_WHOLE: &str = "reading this file a tensor at a time";

/// Whether `e`, from describing a file's tensors without their bytes, means only that the file
/// must be read whole to load (its stacked matrices are split on load), not that it cannot load.
pub fn must_read_whole(e: &Error) -> bool {
    matches!(e, Error::Unsupported { what, .. } if what.starts_with(READ_WHOLE))
}

/// The configuration and every tensor of the files of one model in part order (`h` is the
/// first one's header), borrowing their bytes.
fn weights_from_parts<'a>(
    h: &GgufHeader,
    parts: &'a [GgufPart],
    tensor: &TensorLookup<'a>,
) -> Result<ModelWeights<'a>> {
    let sources = parts.iter().map(|p| p.bytes.clone()).collect();
    build_weights(h, parts, tensor, sources, &mut |part, info| {
        Ok(Cow::Borrowed(part.header.tensor_data(&part.bytes, info)?))
    })
}

/// Every tensor of the files of one model described by shape and type, without its bytes
/// (see [`Tensor::stored_len`]): what a backend that reads the tensors a group at a time plans
/// with. `rope_freqs` is the bytes of [`ROPE_FREQS`] where the model has it (the configuration
/// reads its values). A file that stacks matrices the model keeps apart (Phi-3's `attn_qkv`)
/// is refused here: it is split as it is loaded whole.
pub(crate) fn layout_from_parts(
    h: &GgufHeader,
    parts: &[GgufPart],
    tensor: &TensorLookup<'_>,
    rope_freqs: Option<Vec<u8>>,
) -> Result<ModelWeights<'static>> {
    let mut rope_freqs = rope_freqs;
    build_weights(h, parts, tensor, Vec::new(), &mut |_, info| {
        Ok(match info.name == ROPE_FREQS {
            true => Cow::Owned(rope_freqs.take().unwrap_or_default()),
            false => Cow::Owned(Vec::new()),
        })
    })
}

/// [`weights_from_parts`] with each tensor's bytes from `data(part, info)`.
fn build_weights<'p, 'w>(
    h: &GgufHeader,
    parts: &'p [GgufPart],
    tensor: &TensorLookup<'_>,
    sources: Vec<crate::model::file_bytes::FileBytes>,
    data: &mut dyn FnMut(&'p GgufPart, &'p GgufTensorInfo) -> Result<Cow<'w, [u8]>>,
) -> Result<ModelWeights<'w>> {
    let mut config = config_from_header(h, tensor)?;
    let mut tensors = BTreeMap::new();
    let mut later_tensors = BTreeMap::new();
    // each part with its index among the later parts (none for the first)
    let later = std::iter::once(None).chain((0..).map(Some));
    for (part, later_index) in parts.iter().zip(later) {
        for info in part.header.tensors() {
            if let Some(i) = later_index {
                later_tensors.insert(info.name.clone(), i);
            }
            let shape = info
                .shape()
                .iter()
                .map(|&d| to_usize(d, &info.name, &part.name))
                .collect::<Result<Vec<_>>>()?;
            tensors.insert(
                info.name.clone(),
                Tensor {
                    shape,
                    dtype: info.dtype,
                    data: data(part, info)?,
                },
            );
        }
    }
    let described_only = sources.is_empty();
    if arch::spec(config.arch).splits_stacked {
        if described_only && crate::model::unfuse::stacks_any(&config, &tensors) {
            return Err(Error::Unsupported {
                file: h.file().to_string(),
                what: format!(
                    "{READ_WHOLE}: it stacks matrices (`attn_qkv`, or `ffn_up` with the gate) \
                     that are split as the whole file is loaded"
                ),
            });
        }
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
        arch::validate(&config, h.file())?;
    }
    let weights = ModelWeights {
        file: h.file().to_string(),
        config,
        tensors,
        sources,
        later_files: parts.iter().skip(1).map(|p| p.name.clone()).collect(),
        later_tensors,
    };
    weights.check_shapes()?;
    Ok(weights)
}
