//! A GGUF model (one file or a split set) read a byte range at a time, never held whole: the
//! headers are read first (a prefix of each file, doubled until the header is in it), then the
//! tensors a group at a time as a backend uploads them ([`TensorReader`]). What a GPU load in
//! the page holds in memory is then the headers and one group, not the files.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;

use super::gguf::GgufHeader;
use super::gguf_model::{GgufModel, ROPE_FREQS};
use super::gguf_split::GgufPart;
use crate::error::{Error, Result};
use crate::model::byte_source::{ByteSource, LocalFuture, TensorReader};
use crate::model::file_bytes::FileBytes;
use crate::model::weights::{fingerprint_sample, ModelWeights, Tensor};

/// Header bytes read first; each read that ends inside the header doubles it.
const FIRST_HEADER_READ: u64 = 64 * 1024;

/// A GGUF model whose files are read a range at a time from a [`ByteSource`].
pub struct RangedGguf {
    /// The parts in part order, each holding only the bytes its header took.
    model: GgufModel,
    /// For each part (in part order), its index among the source's files.
    file_of_part: Vec<usize>,
    source: Rc<dyn ByteSource>,
    /// Every tensor described, without bytes.
    layout: ModelWeights<'static>,
    /// What [`ModelWeights::fingerprint`] samples of each tensor read so far.
    samples: RefCell<BTreeMap<String, Vec<u8>>>,
    /// The most tensor bytes one read returned.
    largest_read: Cell<u64>,
}

impl std::fmt::Debug for RangedGguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RangedGguf")
            .field("file", &self.layout.file)
            .field("parts", &self.file_of_part.len())
            .finish()
    }
}

/// The header of file `index` of `source` (`name`, `total` bytes), read in growing prefixes.
async fn read_header(
    source: &dyn ByteSource,
    index: usize,
    name: &str,
    total: u64,
) -> Result<GgufPart> {
    let mut want = FIRST_HEADER_READ.min(total);
    loop {
        let prefix = source.read(index, 0..want).await?;
        if prefix.len() as u64 != want {
            return Err(Error::format(
                name,
                format!("{want} bytes were asked for, {} came", prefix.len()),
            ));
        }
        if let Some(header) = GgufHeader::parse_prefix(&prefix, total, name)? {
            return Ok(GgufPart {
                name: name.to_string(),
                bytes: FileBytes::heap(prefix),
                header,
            });
        }
        if want >= total {
            return Err(Error::format(name, "truncated header"));
        }
        want = want.saturating_mul(2).min(total);
    }
}

impl RangedGguf {
    /// Opens the files of one model, `(name, bytes)` each in the source's order (one file, or
    /// every part of a split set in any order, checked as a set): reads their headers and
    /// describes every tensor. The files' tensors are not read here.
    pub async fn open(source: Rc<dyn ByteSource>, files: &[(String, u64)]) -> Result<Self> {
        let mut parts = Vec::with_capacity(files.len());
        // each header's bytes, to find its file again once the parts are put in order
        let mut address = Vec::with_capacity(files.len());
        for (i, (name, total)) in files.iter().enumerate() {
            let part = read_header(source.as_ref(), i, name, *total).await?;
            address.push(part.bytes.as_ptr() as usize);
            parts.push(part);
        }
        let model = GgufModel::from_checked_parts(parts)?;
        let file_of_part = model
            .parts()
            .iter()
            .map(|p| {
                let at = p.bytes.as_ptr() as usize;
                address.iter().position(|&a| a == at).unwrap_or(0)
            })
            .collect::<Vec<_>>();
        let rope_freqs = match (model.tensor(ROPE_FREQS), model.part_of(ROPE_FREQS)) {
            (Some(info), Some(p)) => {
                let range = model.parts()[p].header.tensor_range(info);
                Some(source.read(file_of_part[p], range).await?)
            }
            _ => None,
        };
        let layout = model.layout(rope_freqs)?;
        Ok(Self {
            model,
            file_of_part,
            source,
            layout,
            samples: RefCell::new(BTreeMap::new()),
            largest_read: Cell::new(0),
        })
    }

    /// The model's files: headers only.
    pub fn model(&self) -> &GgufModel {
        &self.model
    }

    /// Configuration and every tensor described by shape and type, without bytes.
    pub fn layout(&self) -> &ModelWeights<'static> {
        &self.layout
    }

    /// The most bytes one [`TensorReader::read_tensors`] call has returned.
    pub fn largest_read(&self) -> u64 {
        self.largest_read.get()
    }

    /// [`ModelWeights::fingerprint`] of the model, from the bytes sampled as its tensors were
    /// read; an error when some tensor has not been read yet.
    pub fn fingerprint(&self) -> Result<String> {
        let samples = self.samples.borrow();
        self.layout.fingerprint_with(&mut |name, _| {
            samples.get(name).cloned().ok_or_else(|| {
                Error::invalid(
                    "model",
                    format!("tensor `{name}` was never read, so the model has no fingerprint yet"),
                )
            })
        })
    }

    async fn read_one(&self, name: &str) -> Result<Tensor<'static>> {
        let missing = || Error::format(self.layout.files(), format!("missing tensor `{name}`"));
        let described = self.layout.tensors.get(name).ok_or_else(missing)?;
        let part = self.model.part_of(name).ok_or_else(missing)?;
        let info = self.model.tensor(name).ok_or_else(missing)?;
        let header = &self.model.parts()[part].header;
        let range = header.tensor_range(info);
        let want = range.end.saturating_sub(range.start);
        let bytes = self.source.read(self.file_of_part[part], range).await?;
        if bytes.len() as u64 != want || want != described.stored_len() {
            return Err(Error::format(
                self.layout.file_of(name),
                format!(
                    "tensor `{name}`: {} bytes read where it holds {want}",
                    bytes.len()
                ),
            ));
        }
        self.samples
            .borrow_mut()
            .insert(name.to_string(), fingerprint_sample(&bytes));
        Ok(Tensor {
            shape: described.shape.clone(),
            dtype: described.dtype,
            data: bytes.into(),
        })
    }
}

impl TensorReader for RangedGguf {
    fn read_tensors<'a>(
        &'a self,
        names: &'a [String],
    ) -> LocalFuture<'a, Result<BTreeMap<String, Tensor<'static>>>> {
        Box::pin(async move {
            let mut out = BTreeMap::new();
            let mut bytes = 0u64;
            for name in names {
                let t = self.read_one(name).await?;
                bytes = bytes.saturating_add(t.data.len() as u64);
                out.insert(name.clone(), t);
            }
            self.largest_read.set(self.largest_read.get().max(bytes));
            Ok(out)
        })
    }
}
