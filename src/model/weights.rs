//! Host-side tensors and weights: what every loader produces, whatever the file format, and
//! what the GPU forward pass and the CPU reference read.

#![deny(clippy::arithmetic_side_effects)]

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::config::ModelConfig;
use crate::dtype::kv::KvKinds;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::model::file_bytes::{FileBytes, WeightBytes};

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

    /// Bytes as stored: the data's length, or for a tensor described without its bytes (a
    /// model whose files are read a group of tensors at a time) what its type and shape take.
    pub fn stored_len(&self) -> u64 {
        if self.data.is_empty() {
            self.dtype
                .bytes_for(self.n_elements() as u64, "tensor")
                .unwrap_or(0)
        } else {
            self.data.len() as u64
        }
    }
}

/// The bytes of `data` (a tensor's) that [`ModelWeights::fingerprint`] reads: up to 256 from
/// each of its start, middle and end, one after the other.
pub fn fingerprint_sample(data: &[u8]) -> Vec<u8> {
    let n = data.len();
    let rest = n.saturating_sub(256);
    let mut out = Vec::with_capacity(768.min(n.saturating_mul(3)));
    for at in [0, rest / 2, rest] {
        let from = data.get(at..).unwrap_or_default();
        out.extend_from_slice(from.get(..256).unwrap_or(from));
    }
    out
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
    /// The files the tensors borrow from, shared (empty when they borrow from nothing that a
    /// backend can keep: [`ModelWeights::keep`] then copies).
    pub sources: Vec<FileBytes>,
    /// The later parts of a split set (file names in part order; empty for one file): what
    /// [`ModelWeights::file_of`] names.
    pub later_files: Vec<String>,
    /// For each tensor read from a later part, its index in [`ModelWeights::later_files`].
    pub later_tensors: BTreeMap<String, usize>,
}

impl ModelWeights<'_> {
    /// `data` (a tensor's bytes) as a backend keeps them: the range of the source file it is
    /// borrowed from, without a copy; a copy when it is not a source's.
    pub fn keep(&self, data: &[u8]) -> WeightBytes {
        for file in &self.sources {
            if let Some(range) = file.range_of(data) {
                return WeightBytes::Shared(file.clone(), range);
            }
        }
        WeightBytes::Owned(data.to_vec())
    }
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
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MemoryEstimate {
    /// The context length the estimate is for.
    pub context: usize,
    /// Weights as stored (quantized stays quantized).
    pub weights: u64,
    /// K and V for every layer and position (a local layer's ring of its window and a chunk
    /// of positions), in [`MemoryEstimate::kv_kinds`].
    pub kv_cache: u64,
    /// How K and V are stored (`q8_0`, or `k q8_0 / v f16`).
    pub kv_kinds: String,
    /// Bytes of K and V per cached token, over the layers that keep every position (all of
    /// them unless the model has local layers, whose rings do not grow).
    pub kv_bytes_per_token: u64,
    /// Activations of one prefill chunk of [`PREFILL_CHUNK`] tokens, f32.
    pub activations: u64,
    /// Sequences decoded together: `kv_cache` holds a KV slot of `context` positions for each.
    pub batch: usize,
    /// The per-sequence candidate selections of a batched step beyond the first (a logits
    /// row of scratch and a result each).
    pub batch_select: u64,
    /// The sum.
    pub total: u64,
}

/// Tokens per prefill chunk: long prompts run through the forward pass this many at a time,
/// and [`ModelWeights::memory_estimate`] sizes the activations for one such chunk.
pub const PREFILL_CHUNK: usize = 64;

impl<'a> ModelWeights<'a> {
    /// Parameters: the values of every tensor (a tied LM head counted once).
    pub fn parameter_count(&self) -> u64 {
        self.tensors.values().map(|t| t.n_elements() as u64).sum()
    }

    /// GPU memory for running this model with `context` positions of f32 KV cache.
    pub fn memory_estimate(&self, context: usize) -> MemoryEstimate {
        self.memory_estimate_with(context, KvKinds::default())
    }

    /// GPU memory for running this model with `context` positions of KV cache in `kinds`.
    pub fn memory_estimate_with(&self, context: usize, kinds: KvKinds) -> MemoryEstimate {
        self.memory_estimate_batch(context, kinds, 1)
    }

    /// [`ModelWeights::memory_estimate_with`] for `batch` sequences decoded together, each
    /// with a KV slot of `context` positions.
    pub fn memory_estimate_batch(
        &self,
        context: usize,
        kinds: KvKinds,
        batch: usize,
    ) -> MemoryEstimate {
        let c = &self.config;
        let batch = batch.max(1);
        // u64 and saturating: a context asked for by the user may be absurd, and wasm32's usize
        // is 32 bits
        let chunk = PREFILL_CHUNK.min(context.max(1)) as u64;
        let sum = |xs: &[u64]| xs.iter().fold(0u64, |a, &x| a.saturating_add(x));
        let per_token = 2u64.saturating_mul(sum(&[
            c.hidden_size as u64,
            c.q_dim() as u64,
            c.kv_dim() as u64,
            c.ffn_size as u64,
        ]));
        let scores = (c.n_heads as u64).saturating_mul(context as u64);
        let activations = 4u64.saturating_mul(
            chunk
                .saturating_mul(per_token.saturating_add(scores))
                .saturating_add(c.vocab_size as u64),
        );
        let weights = self.weight_bytes();
        // local layers keep rings of their window and a chunk, not the context
        let layout = crate::config::KvLayout::trained(c, context.max(1), chunk as usize);
        let kv_bytes_per_token = layout.position_bytes(kinds.row_bytes(c.kv_dim()));
        let kv_cache = layout
            .sequence_bytes(kinds.row_bytes(c.kv_dim()))
            .saturating_mul(batch as u64);
        // the adjusted-row scratch and the constraint's bitset scale with the vocabulary
        let vocab = c.vocab_size as u64;
        let per_select = sum(&[
            vocab.saturating_mul(4),
            vocab.div_ceil(32).saturating_mul(4),
            crate::candidates::SELECT_BUFFER_BYTES,
        ]);
        let batch_select = per_select.saturating_mul((batch as u64).saturating_sub(1));
        MemoryEstimate {
            context,
            weights,
            kv_cache,
            kv_kinds: kinds.to_string(),
            kv_bytes_per_token,
            activations,
            batch,
            batch_select,
            total: sum(&[weights, kv_cache, activations, batch_select]),
        }
    }

    /// The tensor `name`, or an error naming it (and every file it was looked for in).
    pub fn tensor(&self, name: &str) -> Result<&Tensor<'a>> {
        self.tensors
            .get(name)
            .ok_or_else(|| Error::format(self.files(), format!("missing tensor `{name}`")))
    }

    /// The file that holds tensor `name`: its part of a split set, otherwise
    /// [`ModelWeights::file`].
    pub fn file_of(&self, name: &str) -> &str {
        self.later_tensors
            .get(name)
            .and_then(|&i| self.later_files.get(i))
            .map_or(&self.file, String::as_str)
    }

    /// The files the weights were read from, for a message about all of them: the file, or a
    /// split set's first part and how many others.
    pub fn files(&self) -> String {
        match self.later_files.len() {
            0 => self.file.clone(),
            n => format!("{} (and the {n} other part(s) of its set)", self.file),
        }
    }

    /// Checks that every tensor the forward pass reads exists with the shape the config needs;
    /// an error names the file of a misshapen tensor (its part of a split set).
    pub fn check_shapes(&self) -> Result<()> {
        crate::model::arch::check_tensors(&self.config, &self.files(), |n| {
            self.tensors
                .get(n)
                .map(|t| (t.shape.as_slice(), self.file_of(n)))
        })
    }

    /// Tensor count and bytes per storage type.
    pub fn tally(&self) -> BTreeMap<&'static str, TypeTally> {
        let mut out: BTreeMap<&'static str, TypeTally> = BTreeMap::new();
        for t in self.tensors.values() {
            let e = out.entry(t.dtype.name()).or_default();
            e.tensors = e.tensors.saturating_add(1);
            e.bytes = e.bytes.saturating_add(t.data.len() as u64);
        }
        out
    }

    /// What identifies this model for a saved conversation, as 64 hex digits: a SHA-256 over
    /// the configuration and, for every tensor in name order, its name, type, shape and up to
    /// 256 bytes from each of its start, middle and end. Two loads of one file agree; two
    /// files that differ in shape, type or (all but surely) weights do not. Reading samples
    /// keeps it cheap for a model of gigabytes.
    pub fn fingerprint(&self) -> String {
        self.fingerprint_with(&mut |_, t| Ok(fingerprint_sample(&t.data)))
            .unwrap_or_default()
    }

    /// [`ModelWeights::fingerprint`] with each tensor's sampled bytes from `sample(name,
    /// tensor)` ([`fingerprint_sample`] of its data, for weights read a group at a time).
    pub fn fingerprint_with(
        &self,
        sample: &mut dyn FnMut(&str, &Tensor<'_>) -> Result<Vec<u8>>,
    ) -> Result<String> {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(serde_json::to_vec(&self.config).unwrap_or_default());
        for (name, t) in &self.tensors {
            h.update(name.as_bytes());
            h.update([0]);
            h.update(t.dtype.name().as_bytes());
            for d in &t.shape {
                h.update((*d as u64).to_le_bytes());
            }
            h.update(sample(name, t)?);
        }
        Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
    }

    /// Total bytes of all tensors as stored (what the GPU holds for the weights).
    pub fn weight_bytes(&self) -> u64 {
        self.tensors.values().map(Tensor::stored_len).sum()
    }
}
