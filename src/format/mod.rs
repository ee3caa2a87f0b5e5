//! Bytes on disk to what the engine needs: model configuration, named tensors, tokenizer data.
//! Nothing here touches the GPU.

pub mod gguf;
pub mod hf_config;
pub mod safetensors;

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::model::config::ModelConfig;
use crate::model::weights::DType;

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

impl<'a> ModelWeights<'a> {
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
