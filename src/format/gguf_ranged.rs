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

    /// Where tensor `name`'s bytes lie: the source's file and the byte range in it.
    fn locate(&self, name: &str) -> Result<(usize, std::ops::Range<u64>)> {
        let missing = || Error::format(self.layout.files(), format!("missing tensor `{name}`"));
        self.layout.tensors.get(name).ok_or_else(missing)?;
        let part = self.model.part_of(name).ok_or_else(missing)?;
        let info = self.model.tensor(name).ok_or_else(missing)?;
        let header = &self.model.parts()[part].header;
        Ok((self.file_of_part[part], header.tensor_range(info)))
    }

    /// Tensor `name` from the bytes read for it, checked against its description.
    fn tensor_from(&self, name: &str, bytes: Vec<u8>) -> Result<Tensor<'static>> {
        let missing = || Error::format(self.layout.files(), format!("missing tensor `{name}`"));
        let described = self.layout.tensors.get(name).ok_or_else(missing)?;
        if bytes.len() as u64 != described.stored_len() {
            return Err(Error::format(
                self.layout.file_of(name),
                format!(
                    "tensor `{name}`: {} bytes read where it holds {}",
                    bytes.len(),
                    described.stored_len()
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

/// The most bytes between two tensors that a merged read also reads (GGUF pads each tensor to
/// its alignment, 32 bytes by default; files may use more).
const MERGE_GAP: u64 = 64 * 1024;

/// One read that serves several tensors: file `file`, bytes `range`, and each tensor's name and
/// range (inside `range`).
#[derive(Debug, PartialEq)]
struct Run {
    file: usize,
    range: std::ops::Range<u64>,
    tensors: Vec<(String, std::ops::Range<u64>)>,
}

/// `wanted` (name, file, range) grouped into reads: neighbours in one file, at most
/// [`MERGE_GAP`] apart, together while a read stays within `merge_up_to` bytes (a tensor larger
/// than that is read alone). In file order.
fn plan_runs(mut wanted: Vec<(String, usize, std::ops::Range<u64>)>, merge_up_to: u64) -> Vec<Run> {
    wanted.sort_by_key(|(_, file, range)| (*file, range.start));
    let mut runs: Vec<Run> = Vec::new();
    for (name, file, range) in wanted {
        if let Some(run) = runs.last_mut() {
            let joins = run.file == file
                && range.start >= run.range.end
                && range.start.saturating_sub(run.range.end) <= MERGE_GAP
                && range.end.saturating_sub(run.range.start) <= merge_up_to;
            if joins {
                run.range.end = range.end;
                run.tensors.push((name, range));
                continue;
            }
        }
        runs.push(Run {
            file,
            range: range.clone(),
            tensors: vec![(name, range)],
        });
    }
    runs
}

impl TensorReader for RangedGguf {
    fn read_tensors<'a>(
        &'a self,
        names: &'a [String],
    ) -> LocalFuture<'a, Result<BTreeMap<String, Tensor<'static>>>> {
        Box::pin(async move {
            let wanted = names
                .iter()
                .map(|n| self.locate(n).map(|(file, range)| (n.clone(), file, range)))
                .collect::<Result<Vec<_>>>()?;
            let mut out = BTreeMap::new();
            let mut bytes = 0u64;
            for run in plan_runs(wanted, self.source.merge_up_to()) {
                let want = run.range.end.saturating_sub(run.range.start);
                let read = self.source.read(run.file, run.range.clone()).await?;
                if read.len() as u64 != want {
                    let (name, _) = &run.tensors[0];
                    return Err(Error::format(
                        self.layout.file_of(name),
                        format!(
                            "bytes {:?} (tensor `{name}` on) were asked for and {} came",
                            run.range,
                            read.len()
                        ),
                    ));
                }
                if let [(name, _)] = run.tensors.as_slice() {
                    bytes = bytes.saturating_add(read.len() as u64);
                    out.insert(name.clone(), self.tensor_from(name, read)?);
                    continue;
                }
                for (name, range) in &run.tensors {
                    let index = |at: u64| {
                        usize::try_from(at.saturating_sub(run.range.start)).unwrap_or(usize::MAX)
                    };
                    let slice = read
                        .get(index(range.start)..index(range.end))
                        .unwrap_or_default()
                        .to_vec();
                    bytes = bytes.saturating_add(slice.len() as u64);
                    out.insert(name.clone(), self.tensor_from(name, slice)?);
                }
            }
            self.largest_read.set(self.largest_read.get().max(bytes));
            Ok(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(list: &[(&str, usize, u64, u64)]) -> Vec<(String, usize, std::ops::Range<u64>)> {
        list.iter()
            .map(|&(n, f, a, b)| (n.to_string(), f, a..b))
            .collect()
    }

    #[test]
    fn neighbours_in_one_file_are_read_together_within_the_limit() {
        // out of order, two files, one gap too wide, one tensor past the limit
        let w = wanted(&[
            ("c", 0, 200, 300),
            ("a", 0, 0, 100),
            ("b", 0, 132, 200),
            ("far", 0, 300 + MERGE_GAP + 1, 400 + MERGE_GAP),
            ("other", 1, 300, 400),
            ("big", 1, 400, 2_000),
        ]);
        let runs = plan_runs(w, 1_000);
        let shape: Vec<(usize, std::ops::Range<u64>, Vec<&str>)> = runs
            .iter()
            .map(|r| {
                let names = r.tensors.iter().map(|(n, _)| n.as_str()).collect();
                (r.file, r.range.clone(), names)
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                (0, 0..300, vec!["a", "b", "c"]),
                (0, 300 + MERGE_GAP + 1..400 + MERGE_GAP, vec!["far"]),
                (1, 300..400, vec!["other"]),
                (1, 400..2_000, vec!["big"]),
            ]
        );
        // a limit of 0 reads every tensor alone
        let alone = plan_runs(wanted(&[("a", 0, 0, 100), ("b", 0, 100, 200)]), 0);
        assert_eq!(alone.len(), 2);
    }
}
