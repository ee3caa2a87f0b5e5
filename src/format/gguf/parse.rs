//! The header as a whole: the fixed fields, the metadata, the tensor infos and the data
//! section's layout, each count and range checked against the file.

use std::collections::HashMap;

use crate::dtype::{ggml_type_name, DType};
use crate::error::Error;

use super::reader::{Parse, Reader, Stop, ValueType};
use super::{
    GgufHeader, GgufTensorInfo, GgufValue, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS,
    MAX_METADATA_COUNT, MAX_NAME_LEN, MAX_TENSOR_COUNT,
};

/// Smallest metadata entry: key length, a one-byte key, value type, a one-byte value.
const MIN_KV_BYTES: u64 = 8 + 1 + 4 + 1;
/// Smallest tensor info: name length, a one-byte name, n_dims, one dim, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 1 + 4 + 8 + 4 + 8;

impl Reader<'_> {
    /// A tensor info (entry `index`); `alignment` is already known from the metadata.
    fn tensor_info(&mut self, index: u64, alignment: u64) -> Parse<GgufTensorInfo> {
        let at = self.at();
        let name_bytes =
            self.string_bytes(MAX_NAME_LEN, &|| format!("tensor info #{index} name"))?;
        let name = match std::str::from_utf8(name_bytes) {
            Ok("") => {
                return Err(self.fail(format!(
                    "tensor info #{index} at byte {at} has an empty name"
                )))
            }
            Ok(s) => s.to_owned(),
            Err(e) => {
                return Err(self.fail(format!(
                    "tensor info #{index} at byte {at}: name {:?} is not valid UTF-8 ({e})",
                    String::from_utf8_lossy(name_bytes)
                )))
            }
        };
        let n_dims = self.u32(|| format!("tensor info `{name}` n_dims"))?;
        if n_dims == 0 {
            return Err(Stop::Fail(Error::Unsupported {
                file: self.file.to_owned(),
                what: format!("0-dimensional (scalar) tensor `{name}` at byte {at}"),
            }));
        }
        if n_dims > MAX_DIMS {
            return Err(self.fail(format!(
                "tensor `{name}` at byte {at} has {n_dims} dimensions, over the limit of {MAX_DIMS}"
            )));
        }
        let mut dims = Vec::with_capacity(MAX_DIMS as usize);
        for i in 0..n_dims {
            let d = self.u64(|| format!("tensor info `{name}` dimension {i}"))?;
            if d == 0 {
                return Err(self.fail(format!(
                    "tensor `{name}` at byte {at}: dimension {i} is 0 (every dimension must be \
                     at least 1)"
                )));
            }
            dims.push(d);
        }
        let type_id = self.u32(|| format!("tensor info `{name}` type"))?;
        let offset = self.u64(|| format!("tensor info `{name}` offset"))?;

        let dtype = DType::from_ggml(type_id).ok_or_else(|| {
            Stop::Fail(Error::Unsupported {
                file: self.file.to_owned(),
                what: format!(
                    "tensor type {} ({type_id}) in tensor `{name}`",
                    ggml_type_name(type_id)
                ),
            })
        })?;
        let n_elements = dims
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .ok_or_else(|| {
                self.fail(format!(
                    "tensor `{name}` at byte {at}: element count of dims {dims:?} overflows u64"
                ))
            })?;
        let row = dims.first().copied().unwrap_or(1);
        let block = dtype.block_elements();
        if !row.is_multiple_of(block) {
            return Err(self.fail(format!(
                "tensor `{name}` at byte {at}: row length {row} (dims[0]) is not a multiple of \
                 the {dtype} block size {block}"
            )));
        }
        let n_bytes = dtype.bytes_for(n_elements, &name).map_err(|e| match e {
            Error::InvalidArgument { message, .. } => Error::format(self.file, message),
            other => other,
        })?;
        if !offset.is_multiple_of(alignment) {
            return Err(self.fail(format!(
                "tensor `{name}` at byte {at}: offset {offset} is not a multiple of the \
                 alignment {alignment}"
            )));
        }
        Ok(GgufTensorInfo {
            name,
            dims,
            dtype,
            offset,
            n_bytes,
        })
    }
}

/// Parses the header from `buf`, the first bytes of a file of `total` bytes named `file`.
pub(super) fn parse_header(buf: &[u8], total: u64, file: &str) -> Parse<GgufHeader> {
    let mut r = Reader {
        buf,
        pos: 0,
        total,
        file,
    };

    let magic = r.array::<4>(|| "header (magic)".into())?;
    if magic != GGUF_MAGIC {
        return Err(r.fail(format!(
            "not a GGUF file: it starts with \"{}\", not \"GGUF\"",
            magic.escape_ascii()
        )));
    }
    let version = r.u32(|| "header (version)".into())?;
    if version != 2 && version != 3 {
        let swapped = version.swap_bytes();
        let what = if (1..=3).contains(&swapped) {
            format!(
                "big-endian GGUF (version field is {version:#010x}, i.e. version {swapped} \
                 byte-swapped): only little-endian files are supported"
            )
        } else {
            format!("GGUF version {version} (only versions 2 and 3 are supported)")
        };
        return Err(Stop::Fail(Error::Unsupported {
            file: file.to_owned(),
            what,
        }));
    }
    let n_tensors = r.u64(|| "header (tensor count)".into())?;
    let n_kv = r.u64(|| "header (metadata count)".into())?;
    r.check_count("metadata", n_kv, MAX_METADATA_COUNT, MIN_KV_BYTES)?;
    r.check_count("tensor", n_tensors, MAX_TENSOR_COUNT, MIN_TENSOR_INFO_BYTES)?;
    let need = n_kv
        .saturating_mul(MIN_KV_BYTES)
        .saturating_add(n_tensors.saturating_mul(MIN_TENSOR_INFO_BYTES));
    if need > r.left_in_file() {
        return Err(r.fail(format!(
            "header: {n_kv} metadata entries and {n_tensors} tensor infos need at least {need} \
             bytes but only {} remain",
            r.left_in_file()
        )));
    }

    // Metadata.
    let cap = |n: u64, min: u64, r: &Reader| {
        usize::try_from(n.min(r.left_in_buf().checked_div(min).unwrap_or(0)))
    };
    let mut metadata = Vec::with_capacity(cap(n_kv, MIN_KV_BYTES, &r).unwrap_or(0));
    let mut metadata_index = HashMap::with_capacity(metadata.capacity());
    for i in 0..n_kv {
        let at = r.at();
        let key_bytes = r.string_bytes(MAX_NAME_LEN, &|| format!("metadata key #{i}"))?;
        let key = match std::str::from_utf8(key_bytes) {
            Ok("") => return Err(r.fail(format!("metadata key #{i} at byte {at} is empty"))),
            Ok(k) => k.to_owned(),
            Err(e) => {
                return Err(r.fail(format!(
                    "metadata key #{i} at byte {at} is not valid UTF-8 ({e}): {:?}",
                    String::from_utf8_lossy(key_bytes)
                )))
            }
        };
        if let Some(first) = metadata_index.get(&key) {
            return Err(r.fail(format!(
                "duplicate metadata key `{key}` (entries #{first} and #{i}, the second at byte \
                 {at})"
            )));
        }
        let ty_at = r.at();
        let ty_id = r.u32(|| format!("metadata value `{key}` type"))?;
        let ty = ValueType::from_id(ty_id).ok_or_else(|| {
            r.fail(format!(
                "metadata key `{key}` at byte {ty_at} has unknown value type {ty_id}"
            ))
        })?;
        let value = r.value(ty, &key)?;
        metadata_index.insert(key.clone(), metadata.len());
        metadata.push((key, value));
    }

    let alignment = match metadata_index
        .get("general.alignment")
        .and_then(|&i| metadata.get(i))
    {
        None => DEFAULT_ALIGNMENT,
        Some((_, GgufValue::U32(a))) if a.is_power_of_two() => u64::from(*a),
        Some((_, v)) => {
            let shown = match v {
                GgufValue::U32(a) => a.to_string(),
                other => format!("of type {}", other.type_name()),
            };
            return Err(r.fail(format!(
                "metadata key `general.alignment` is {shown}; it must be a u32 power of two"
            )));
        }
    };

    // Tensor infos.
    let mut tensors: Vec<GgufTensorInfo> =
        Vec::with_capacity(cap(n_tensors, MIN_TENSOR_INFO_BYTES, &r).unwrap_or(0));
    let mut tensor_index = HashMap::with_capacity(tensors.capacity());
    for i in 0..n_tensors {
        let at = r.at();
        let t = r.tensor_info(i, alignment)?;
        if let Some(first) = tensor_index.get(&t.name) {
            return Err(r.fail(format!(
                "duplicate tensor name `{}` (tensor infos #{first} and #{i}, the second at byte \
                 {at})",
                t.name
            )));
        }
        tensor_index.insert(t.name.clone(), tensors.len());
        tensors.push(t);
    }

    let header_end = r.at();
    let data_offset = header_end
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| {
            r.fail(format!(
                "data offset overflows aligning {header_end} to {alignment}"
            ))
        })?;
    let data_len = total.saturating_sub(data_offset);
    for t in &tensors {
        let end = t.offset.checked_add(t.n_bytes).ok_or_else(|| {
            r.fail(format!(
                "tensor `{}`: offset {} + size {} overflows",
                t.name, t.offset, t.n_bytes
            ))
        })?;
        if end > data_len {
            return Err(r.fail(format!(
                "tensor `{}` data at bytes {}..{} (offset {} in the data section at byte \
                 {data_offset}) runs past the end of the file ({total} bytes)",
                t.name,
                data_offset.saturating_add(t.offset),
                data_offset.saturating_add(end),
                t.offset
            )));
        }
    }

    Ok(GgufHeader {
        version,
        alignment,
        data_offset,
        metadata,
        metadata_index,
        tensors,
        tensor_index,
        file: file.to_owned(),
    })
}
