//! GGUF (versions 2 and 3, little-endian) header reader: metadata, tensor descriptions and where
//! each tensor's bytes lie. Every count, length and offset in the file is treated as hostile:
//! lengths are capped and checked against the bytes that remain before anything is allocated,
//! arithmetic is checked, and errors name the key, tensor or byte offset at fault.
//!
//! Layout (all integers little-endian): `"GGUF"`, `u32` version, `u64` tensor count, `u64`
//! metadata count; metadata entries (`string` key, `u32` value type, value); tensor infos
//! (`string` name, `u32` n_dims, `n_dims × u64` dims, `u32` GGML type, `u64` offset); padding to
//! `general.alignment`; the data section. A `string` is a `u64` byte length and UTF-8 bytes.
//!
//! [`GgufHeader::parse_prefix`] works on the first bytes of a file so that a browser can stream a
//! model: it asks for more bytes (`Ok(None)`) until the header is complete, and then the tensor
//! ranges tell it where each upload comes from.

mod parse;
mod reader;
mod value;

use std::collections::HashMap;
use std::ops::Range;

use crate::dtype::DType;
use crate::error::{Error, Result};

use parse::parse_header;
use reader::Stop;
pub use value::{GgufArray, GgufValue};

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Data-section alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Longest metadata key or tensor name, in bytes (the spec's limit for keys).
pub const MAX_NAME_LEN: u64 = 65_535;
/// Longest string value, in bytes (chat templates, the longest strings in practice, are ~10 KiB).
pub const MAX_STRING_LEN: u64 = 16 << 20;
/// Most elements in one array (vocabularies and merge lists run to a few hundred thousand).
pub const MAX_ARRAY_LEN: u64 = 1 << 24;
/// Deepest array nesting: an array of arrays is depth 2.
pub const MAX_ARRAY_DEPTH: u32 = 4;
/// Most metadata entries in one file.
pub const MAX_METADATA_COUNT: u64 = 1 << 20;
/// Most tensors in one file.
pub const MAX_TENSOR_COUNT: u64 = 1 << 20;
/// Most dimensions of one tensor (GGML's limit).
pub const MAX_DIMS: u32 = 4;

/// One tensor's description from the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions as stored: `dims[0]` varies fastest (the row length of a matrix).
    pub dims: Vec<u64>,
    /// Storage type.
    pub dtype: DType,
    /// Offset of the first byte relative to the start of the data section, as stored.
    pub offset: u64,
    /// Size of the tensor's data in bytes.
    pub n_bytes: u64,
}

impl GgufTensorInfo {
    /// The shape outermost first (`dims` reversed): `[rows, cols]` for a matrix.
    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }

    /// Number of values (the product of the dimensions; checked against overflow at parse time,
    /// saturating for a hand-built info).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |n, &d| n.saturating_mul(d))
    }
}

/// A parsed GGUF header: metadata in file order, tensor descriptions and the data-section layout.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufHeader {
    /// Format version (2 or 3).
    pub version: u32,
    /// Data-section alignment (`general.alignment`, default 32); a power of two.
    pub alignment: u64,
    /// Absolute file offset of the data section: the header's end rounded up to `alignment`.
    pub data_offset: u64,
    metadata: Vec<(String, GgufValue)>,
    metadata_index: HashMap<String, usize>,
    tensors: Vec<GgufTensorInfo>,
    tensor_index: HashMap<String, usize>,
    file: String,
}

impl GgufHeader {
    /// Parse from a prefix of a file whose total length is `total_len`; Ok(None) when the prefix
    /// ends before the header does (caller supplies more bytes: the streaming path in the
    /// browser), Err when malformed.
    ///
    /// Lengths are checked against `total_len`, so a malformed header is reported as soon as the
    /// bytes that show it are in `prefix`; allocations are bounded by the bytes in `prefix`.
    pub fn parse_prefix(prefix: &[u8], total_len: u64, file: &str) -> Result<Option<GgufHeader>> {
        let have = u64::try_from(prefix.len()).unwrap_or(u64::MAX);
        if have > total_len {
            return Err(Error::invalid(
                "total_len",
                format!("{file}: prefix has {have} bytes but the file is said to be {total_len}"),
            ));
        }
        match parse_header(prefix, total_len, file) {
            Ok(h) => Ok(Some(h)),
            Err(Stop::NeedMore) => Ok(None),
            Err(Stop::Fail(e)) => Err(e),
        }
    }

    /// Parse a whole file held in memory (a truncated header is an error here).
    pub fn parse(bytes: &[u8], file: &str) -> Result<GgufHeader> {
        let total = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
        match parse_header(bytes, total, file) {
            Ok(h) => Ok(h),
            Err(Stop::Fail(e)) => Err(e),
            // Unreachable when the prefix is the whole file, but never worth a panic.
            Err(Stop::NeedMore) => Err(Error::format(file, "truncated header")),
        }
    }

    /// The file name given to `parse`, used in error messages.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// All metadata entries in file order.
    pub fn metadata(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }

    /// The value of metadata key `key`, if present.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        let i = *self.metadata_index.get(key)?;
        self.metadata.get(i).map(|(_, v)| v)
    }

    /// A string value; Err when `key` holds another type.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(GgufValue::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.type_error(key, "string", v)),
        }
    }

    /// A non-negative value of any integer type.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let n = v
            .as_integer()
            .ok_or_else(|| self.type_error(key, "an integer", v))?;
        u64::try_from(n).map(Some).map_err(|_| {
            Error::format(
                &self.file,
                format!("metadata key `{key}` is {n}, expected a non-negative integer"),
            )
        })
    }

    /// A value of any integer type that fits in `u32`.
    pub fn get_u32(&self, key: &str) -> Result<Option<u32>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let n = v
            .as_integer()
            .ok_or_else(|| self.type_error(key, "an integer", v))?;
        u32::try_from(n).map(Some).map_err(|_| {
            Error::format(
                &self.file,
                format!("metadata key `{key}` is {n}, which does not fit in u32"),
            )
        })
    }

    /// An `f32` value, or an `f64` one that is within `f32` range.
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>> {
        match self.get(key) {
            None => Ok(None),
            Some(GgufValue::F32(x)) => Ok(Some(*x)),
            Some(GgufValue::F64(x)) => {
                let y = *x as f32;
                if x.is_finite() && !y.is_finite() {
                    return Err(Error::format(
                        &self.file,
                        format!("metadata key `{key}` is {x}, outside the range of f32"),
                    ));
                }
                Ok(Some(y))
            }
            Some(v) => Err(self.type_error(key, "f32 or f64", v)),
        }
    }

    /// A `bool` value.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(GgufValue::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.type_error(key, "bool", v)),
        }
    }

    /// An array of any element type.
    pub fn get_array(&self, key: &str) -> Result<Option<&GgufArray>> {
        match self.get(key) {
            None => Ok(None),
            Some(GgufValue::Array(a)) => Ok(Some(a)),
            Some(v) => Err(self.type_error(key, "an array", v)),
        }
    }

    /// An array of strings (e.g. `tokenizer.ggml.tokens`).
    pub fn get_str_array(&self, key: &str) -> Result<Option<&[String]>> {
        match self.get(key) {
            None => Ok(None),
            Some(GgufValue::Array(GgufArray::String(v))) => Ok(Some(v)),
            Some(v) => Err(self.type_error(key, "array<string>", v)),
        }
    }

    /// An array of `f32` (e.g. `tokenizer.ggml.scores`).
    pub fn get_f32_array(&self, key: &str) -> Result<Option<&[f32]>> {
        match self.get(key) {
            None => Ok(None),
            Some(GgufValue::Array(GgufArray::F32(v))) => Ok(Some(v)),
            Some(v) => Err(self.type_error(key, "array<f32>", v)),
        }
    }

    /// An array of `i32` (e.g. `tokenizer.ggml.token_type`).
    pub fn get_i32_array(&self, key: &str) -> Result<Option<&[i32]>> {
        match self.get(key) {
            None => Ok(None),
            Some(GgufValue::Array(GgufArray::I32(v))) => Ok(Some(v)),
            Some(v) => Err(self.type_error(key, "array<i32>", v)),
        }
    }

    /// `general.architecture` (`llama`, `gpt2`, ...), which every GGUF model must have.
    pub fn architecture(&self) -> Result<&str> {
        self.get_str("general.architecture")?.ok_or_else(|| {
            Error::format(
                &self.file,
                "missing required metadata key `general.architecture`",
            )
        })
    }

    /// All tensor descriptions in file order.
    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        let i = *self.tensor_index.get(name)?;
        self.tensors.get(i)
    }

    /// The bytes of `t` inside `file_bytes` (the whole file), range-checked.
    pub fn tensor_data<'a>(&self, file_bytes: &'a [u8], t: &GgufTensorInfo) -> Result<&'a [u8]> {
        let range = self.tensor_range(t);
        let slice = usize::try_from(range.start)
            .ok()
            .zip(usize::try_from(range.end).ok())
            .and_then(|(start, end)| file_bytes.get(start..end));
        slice.ok_or_else(|| {
            Error::format(
                &self.file,
                format!(
                    "tensor `{}` data (bytes {}..{}) lies outside the {} bytes given",
                    t.name,
                    range.start,
                    range.end,
                    file_bytes.len()
                ),
            )
        })
    }

    /// Absolute byte range of `t` in the file (for streaming uploads).
    ///
    /// Exact for the tensors of this header (checked at parse time); saturates rather than
    /// overflowing for a hand-built `t`, so [`GgufHeader::tensor_data`] then reports it.
    pub fn tensor_range(&self, t: &GgufTensorInfo) -> Range<u64> {
        let start = self.data_offset.saturating_add(t.offset);
        start..start.saturating_add(t.n_bytes)
    }

    fn type_error(&self, key: &str, expected: &str, found: &GgufValue) -> Error {
        Error::format(
            &self.file,
            format!(
                "metadata key `{key}` has type {}, expected {expected}",
                found.type_name()
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_reverses_dims() {
        let t = GgufTensorInfo {
            name: "w".into(),
            dims: vec![64, 3],
            dtype: DType::F32,
            offset: 0,
            n_bytes: 768,
        };
        assert_eq!(t.shape(), vec![3, 64]);
        assert_eq!(t.n_elements(), 192);
    }

    #[test]
    fn short_inputs_never_panic() {
        for n in 0..64u8 {
            let bytes: Vec<u8> = b"GGUF\x03\0\0\0".iter().copied().chain(0..n).collect();
            let _ = GgufHeader::parse(&bytes, "t");
            let _ = GgufHeader::parse_prefix(&bytes, 1 << 20, "t");
        }
    }

    #[test]
    fn foreign_tensor_info_is_range_checked() {
        let mut bytes = b"GGUF\x03\0\0\0".to_vec();
        bytes.extend([0u8; 16]);
        let h = GgufHeader::parse(&bytes, "t").unwrap();
        assert_eq!(h.data_offset, 32);
        let t = GgufTensorInfo {
            name: "w".into(),
            dims: vec![1],
            dtype: DType::F32,
            offset: u64::MAX,
            n_bytes: 4,
        };
        assert_eq!(h.tensor_range(&t).end, u64::MAX);
        assert!(h.tensor_data(&bytes, &t).is_err());
    }
}
