//! A model as the user supplied it (one GGUF file, a split GGUF set or a Hugging Face folder),
//! opened into what the engine needs: configuration and tensors, the tokenizer and the chat
//! template.

#![deny(clippy::arithmetic_side_effects)]

use crate::chat::ChatTemplate;
use crate::error::{Error, Result};
use crate::format::{gguf_model, gguf_ranged, safetensors};
use crate::model::weights::ModelWeights;
use crate::tokenizer::Tokenizer;

/// A model as the user supplied it: one GGUF file, or a Hugging Face folder.
#[derive(Debug)]
pub enum ModelFiles {
    /// A GGUF file.
    Gguf(gguf_model::GgufModel),
    /// A Hugging Face folder.
    Hf(safetensors::HfFolder),
    /// A GGUF file (or split set) read a range at a time, never held whole: only a GPU load
    /// takes it (the tensors go to the device a group at a time).
    Ranged(Box<gguf_ranged::RangedGguf>),
}

/// GGUF's magic bytes.
const GGUF_MAGIC: &[u8; 4] = b"GGUF";

impl ModelFiles {
    /// Opens `path`: a folder is read as a Hugging Face model, a file as GGUF (the first part of
    /// a split set brings the others from beside it).
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

    /// Builds from the bytes of one model's files, each `(bytes, name)`: one file as
    /// [`ModelFiles::from_bytes`], or every part of a split GGUF set (llama.cpp's
    /// `NAME-00001-of-0000N.gguf` layout) in any order, checked as a set.
    pub fn from_parts(mut files: Vec<(Vec<u8>, String)>) -> Result<Self> {
        if files.len() == 1 {
            if let Some((bytes, name)) = files.pop() {
                return Self::from_bytes(bytes, &name);
            }
        }
        if let Some((_, name)) = files.iter().find(|(b, _)| !b.starts_with(GGUF_MAGIC)) {
            return Err(Error::format(
                name,
                "not a GGUF file (only GGUF models come in several files here)",
            ));
        }
        Ok(ModelFiles::Gguf(gguf_model::GgufModel::from_parts(files)?))
    }

    /// How many files the model came in (the parts of a split GGUF set; 1 for one GGUF file or
    /// a Hugging Face folder).
    pub fn file_count(&self) -> usize {
        match self {
            ModelFiles::Gguf(g) => g.parts().len(),
            ModelFiles::Ranged(r) => r.model().parts().len(),
            ModelFiles::Hf(_) => 1,
        }
    }

    /// The bytes of each file of a GGUF model, in part order (none for a Hugging Face folder,
    /// whose files are read into tensors, or for files read a range at a time).
    pub fn file_data(&self) -> Vec<&[u8]> {
        match self {
            ModelFiles::Gguf(g) => g.parts().iter().map(|p| &p.bytes[..]).collect(),
            ModelFiles::Hf(_) | ModelFiles::Ranged(_) => Vec::new(),
        }
    }

    /// The tensors' bytes as stored, summed.
    pub fn weight_bytes(&self) -> Result<u64> {
        match self {
            ModelFiles::Ranged(r) => Ok(r.layout().weight_bytes()),
            _ => Ok(self.weights()?.weight_bytes()),
        }
    }

    /// Where the model came from.
    pub fn name(&self) -> &str {
        match self {
            ModelFiles::Gguf(g) => g.header().file(),
            ModelFiles::Ranged(r) => r.model().header().file(),
            ModelFiles::Hf(h) => &h.name,
        }
    }

    /// Configuration and tensors, shape-checked. Files read a range at a time have no tensors
    /// held (see [`ModelFiles::Ranged`]): an error says so.
    pub fn weights(&self) -> Result<ModelWeights<'_>> {
        match self {
            ModelFiles::Gguf(g) => g.weights(),
            ModelFiles::Hf(h) => h.load(),
            ModelFiles::Ranged(r) => Err(Error::Unsupported {
                file: r.layout().file.clone(),
                what: "this use of a model read a range at a time (its tensors are read as \
                       they go to the GPU; load its bytes for the CPU backend)"
                    .into(),
            }),
        }
    }

    /// The tokenizer: from GGUF metadata, or from the folder's `tokenizer.json` (with
    /// `tokenizer_config.json` when present).
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        match self {
            ModelFiles::Gguf(g) => Tokenizer::from_gguf(g.header()),
            ModelFiles::Ranged(r) => Tokenizer::from_gguf(r.model().header()),
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
            ModelFiles::Ranged(r) => ChatTemplate::from_gguf(r.model().header(), tokenizer),
            ModelFiles::Hf(h) => match &h.tokenizer_config_json {
                Some(json) => ChatTemplate::from_tokenizer_config(json, tokenizer),
                None => Ok(None),
            },
        }
    }
}
