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

use std::collections::HashMap;
use std::ops::Range;

use crate::error::{Error, Result};
use crate::model::weights::{ggml_type_name, DType};

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

/// Smallest metadata entry: key length, a one-byte key, value type, a one-byte value.
const MIN_KV_BYTES: u64 = 8 + 1 + 4 + 1;
/// Smallest tensor info: name length, a one-byte name, n_dims, one dim, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 1 + 4 + 8 + 4 + 8;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// Type 0.
    U8(u8),
    /// Type 1.
    I8(i8),
    /// Type 2.
    U16(u16),
    /// Type 3.
    I16(i16),
    /// Type 4.
    U32(u32),
    /// Type 5.
    I32(i32),
    /// Type 10.
    U64(u64),
    /// Type 11.
    I64(i64),
    /// Type 6.
    F32(f32),
    /// Type 12.
    F64(f64),
    /// Type 7: one byte, 0 or 1.
    Bool(bool),
    /// Type 8: UTF-8.
    String(String),
    /// Type 9: element type, length, elements.
    Array(GgufArray),
}

/// A metadata array: every element has the one type the array declares.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufArray {
    /// Array of `u8`.
    U8(Vec<u8>),
    /// Array of `i8`.
    I8(Vec<i8>),
    /// Array of `u16`.
    U16(Vec<u16>),
    /// Array of `i16`.
    I16(Vec<i16>),
    /// Array of `u32`.
    U32(Vec<u32>),
    /// Array of `i32`.
    I32(Vec<i32>),
    /// Array of `u64`.
    U64(Vec<u64>),
    /// Array of `i64`.
    I64(Vec<i64>),
    /// Array of `f32`.
    F32(Vec<f32>),
    /// Array of `f64`.
    F64(Vec<f64>),
    /// Array of `bool`.
    Bool(Vec<bool>),
    /// Array of strings.
    String(Vec<String>),
    /// Array of arrays; each inner array declares its own element type.
    Array(Vec<GgufArray>),
}

impl GgufValue {
    /// The type as it would be written in a message: `u32`, `string`, `array<string>`, ...
    pub fn type_name(&self) -> &'static str {
        match self {
            GgufValue::U8(_) => "u8",
            GgufValue::I8(_) => "i8",
            GgufValue::U16(_) => "u16",
            GgufValue::I16(_) => "i16",
            GgufValue::U32(_) => "u32",
            GgufValue::I32(_) => "i32",
            GgufValue::U64(_) => "u64",
            GgufValue::I64(_) => "i64",
            GgufValue::F32(_) => "f32",
            GgufValue::F64(_) => "f64",
            GgufValue::Bool(_) => "bool",
            GgufValue::String(_) => "string",
            GgufValue::Array(a) => a.type_name(),
        }
    }

    /// The value of any integer variant, widened.
    fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            GgufValue::U8(x) => x.into(),
            GgufValue::I8(x) => x.into(),
            GgufValue::U16(x) => x.into(),
            GgufValue::I16(x) => x.into(),
            GgufValue::U32(x) => x.into(),
            GgufValue::I32(x) => x.into(),
            GgufValue::U64(x) => x.into(),
            GgufValue::I64(x) => x.into(),
            _ => return None,
        })
    }
}

impl GgufArray {
    /// Number of elements (for an array of arrays, the number of inner arrays).
    pub fn len(&self) -> usize {
        match self {
            GgufArray::U8(v) => v.len(),
            GgufArray::I8(v) => v.len(),
            GgufArray::U16(v) => v.len(),
            GgufArray::I16(v) => v.len(),
            GgufArray::U32(v) => v.len(),
            GgufArray::I32(v) => v.len(),
            GgufArray::U64(v) => v.len(),
            GgufArray::I64(v) => v.len(),
            GgufArray::F32(v) => v.len(),
            GgufArray::F64(v) => v.len(),
            GgufArray::Bool(v) => v.len(),
            GgufArray::String(v) => v.len(),
            GgufArray::Array(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The array's type: `array<u32>`, `array<string>`, ...; `array<array>` for nested arrays,
    /// whose inner element types may differ from one inner array to the next.
    pub fn type_name(&self) -> &'static str {
        match self {
            GgufArray::U8(_) => "array<u8>",
            GgufArray::I8(_) => "array<i8>",
            GgufArray::U16(_) => "array<u16>",
            GgufArray::I16(_) => "array<i16>",
            GgufArray::U32(_) => "array<u32>",
            GgufArray::I32(_) => "array<i32>",
            GgufArray::U64(_) => "array<u64>",
            GgufArray::I64(_) => "array<i64>",
            GgufArray::F32(_) => "array<f32>",
            GgufArray::F64(_) => "array<f64>",
            GgufArray::Bool(_) => "array<bool>",
            GgufArray::String(_) => "array<string>",
            GgufArray::Array(_) => "array<array>",
        }
    }
}

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

// ---------------------------------------------------------------------------------------------
// Parsing

/// Why parsing stopped: the prefix ran out before the header did, or the file is bad.
enum Stop {
    NeedMore,
    Fail(Error),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Self {
        Stop::Fail(e)
    }
}

type Parse<T> = std::result::Result<T, Stop>;

/// Metadata value types as numbered in the file.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    fn from_id(id: u32) -> Option<ValueType> {
        Some(match id {
            0 => ValueType::U8,
            1 => ValueType::I8,
            2 => ValueType::U16,
            3 => ValueType::I16,
            4 => ValueType::U32,
            5 => ValueType::I32,
            6 => ValueType::F32,
            7 => ValueType::Bool,
            8 => ValueType::String,
            9 => ValueType::Array,
            10 => ValueType::U64,
            11 => ValueType::I64,
            12 => ValueType::F64,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            ValueType::U8 => "u8",
            ValueType::I8 => "i8",
            ValueType::U16 => "u16",
            ValueType::I16 => "i16",
            ValueType::U32 => "u32",
            ValueType::I32 => "i32",
            ValueType::F32 => "f32",
            ValueType::Bool => "bool",
            ValueType::String => "string",
            ValueType::Array => "array",
            ValueType::U64 => "u64",
            ValueType::I64 => "i64",
            ValueType::F64 => "f64",
        }
    }

    /// Fewest bytes one value of this type takes: its size for fixed-size types, the length
    /// field for a string, element type and length for an array.
    fn min_bytes(self) -> u64 {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => 1,
            ValueType::U16 | ValueType::I16 => 2,
            ValueType::U32 | ValueType::I32 | ValueType::F32 => 4,
            ValueType::U64 | ValueType::I64 | ValueType::F64 | ValueType::String => 8,
            ValueType::Array => 4 + 8,
        }
    }
}

/// Copies up to `N` bytes into an array (callers pass exactly `N`; shorter input is zero-filled
/// rather than a panic).
fn le<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    for (o, b) in out.iter_mut().zip(bytes) {
        *o = *b;
    }
    out
}

/// A cursor over the bytes held so far of a file of known total length.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    total: u64,
    file: &'a str,
}

impl<'a> Reader<'a> {
    /// Absolute offset of the next byte.
    fn at(&self) -> u64 {
        self.pos as u64
    }

    /// Bytes left in the whole file.
    fn left_in_file(&self) -> u64 {
        self.total.saturating_sub(self.at())
    }

    /// Bytes left in the prefix held: the bound for any allocation.
    fn left_in_buf(&self) -> u64 {
        self.buf.len().saturating_sub(self.pos) as u64
    }

    fn fail(&self, message: String) -> Stop {
        Stop::Fail(Error::format(self.file, message))
    }

    /// The next `n` bytes. Past the end of the file: an error naming `what`; past the end of
    /// the prefix only: `NeedMore`.
    fn take(&mut self, n: u64, what: impl FnOnce() -> String) -> Parse<&'a [u8]> {
        let start = self.at();
        let end = match start.checked_add(n) {
            Some(end) if end <= self.total => end,
            _ => {
                return Err(self.fail(format!(
                    "truncated {}: needs {n} bytes at byte {start} but the file ends at byte {}",
                    what(),
                    self.total
                )))
            }
        };
        let end = usize::try_from(end).map_err(|_| {
            self.fail(format!(
                "{} at byte {start} lies beyond what this platform can address",
                what()
            ))
        })?;
        let bytes = self.buf.get(self.pos..end).ok_or(Stop::NeedMore)?;
        self.pos = end;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self, what: impl FnOnce() -> String) -> Parse<[u8; N]> {
        Ok(le::<N>(self.take(N as u64, what)?))
    }

    fn u32(&mut self, what: impl FnOnce() -> String) -> Parse<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: impl FnOnce() -> String) -> Parse<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A length-prefixed byte string of at most `max` bytes, borrowed from the input.
    fn string_bytes(&mut self, max: u64, what: &dyn Fn() -> String) -> Parse<&'a [u8]> {
        let at = self.at();
        let len = self.u64(|| format!("{} length", what()))?;
        if len > max {
            return Err(self.fail(format!(
                "{} at byte {at} has length {len}, over the limit of {max} bytes",
                what()
            )));
        }
        if len > self.left_in_file() {
            return Err(self.fail(format!(
                "truncated {}: length {len} at byte {at} runs past the end of the file ({} \
                 bytes)",
                what(),
                self.total
            )));
        }
        self.take(len, what)
    }

    /// A string value of metadata key `key` (`what` says which, for arrays).
    fn string_value(&mut self, what: &dyn Fn() -> String) -> Parse<String> {
        let at = self.at().saturating_add(8);
        let bytes = self.string_bytes(MAX_STRING_LEN, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(self.fail(format!("{} at byte {at} is not valid UTF-8 ({e})", what()))),
        }
    }

    /// A value of type `ty` for metadata key `key`.
    fn value(&mut self, ty: ValueType, key: &str) -> Parse<GgufValue> {
        let what = || format!("metadata value `{key}`");
        Ok(match ty {
            ValueType::U8 => GgufValue::U8(u8::from_le_bytes(self.array(what)?)),
            ValueType::I8 => GgufValue::I8(i8::from_le_bytes(self.array(what)?)),
            ValueType::U16 => GgufValue::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => GgufValue::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => GgufValue::U32(u32::from_le_bytes(self.array(what)?)),
            ValueType::I32 => GgufValue::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::U64 => GgufValue::U64(u64::from_le_bytes(self.array(what)?)),
            ValueType::I64 => GgufValue::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F32 => GgufValue::F32(f32::from_le_bytes(self.array(what)?)),
            ValueType::F64 => GgufValue::F64(f64::from_le_bytes(self.array(what)?)),
            ValueType::Bool => {
                let at = self.at();
                let [b] = self.array(what)?;
                GgufValue::Bool(self.bool(b, at, key)?)
            }
            ValueType::String => GgufValue::String(self.string_value(&what)?),
            ValueType::Array => GgufValue::Array(self.array_value(key, 1)?),
        })
    }

    fn bool(&self, b: u8, at: u64, key: &str) -> Parse<bool> {
        match b {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(self.fail(format!(
                "metadata value `{key}`: bool at byte {at} is {b}, expected 0 or 1"
            ))),
        }
    }

    /// `n` fixed-size elements of `size` bytes, decoded by `f`.
    fn fixed<T>(&mut self, n: u64, size: u64, key: &str, f: impl Fn(&[u8]) -> T) -> Parse<Vec<T>> {
        let len = n
            .checked_mul(size)
            .ok_or_else(|| self.fail(format!("array `{key}`: byte length overflows")))?;
        let size = usize::try_from(size).unwrap_or(1).max(1);
        let bytes = self.take(len, || format!("array `{key}` body"))?;
        Ok(bytes.chunks_exact(size).map(f).collect())
    }

    /// An array (element type, length, elements) at nesting depth `depth` (1 = a top-level
    /// array value).
    fn array_value(&mut self, key: &str, depth: u32) -> Parse<GgufArray> {
        let at = self.at();
        if depth > MAX_ARRAY_DEPTH {
            return Err(self.fail(format!(
                "array `{key}` at byte {at}: arrays nested deeper than the limit of \
                 {MAX_ARRAY_DEPTH} levels"
            )));
        }
        let ty_id = self.u32(|| format!("array `{key}` element type"))?;
        let ty = ValueType::from_id(ty_id).ok_or_else(|| {
            self.fail(format!(
                "array `{key}` at byte {at} has unknown element type {ty_id}"
            ))
        })?;
        let n = self.u64(|| format!("array `{key}` length"))?;
        if n > MAX_ARRAY_LEN {
            return Err(self.fail(format!(
                "array `{key}` at byte {at} has {n} elements, over the limit of {MAX_ARRAY_LEN}"
            )));
        }
        let min_len = n.saturating_mul(ty.min_bytes());
        if min_len > self.left_in_file() {
            return Err(self.fail(format!(
                "truncated array `{key}`: {n} {} elements at byte {at} need at least {min_len} \
                 bytes but only {} remain in the file",
                ty.name(),
                self.left_in_file()
            )));
        }
        // Reserve only what the bytes actually held could contain.
        let cap = usize::try_from(n.min(self.left_in_buf() / ty.min_bytes())).unwrap_or(0);
        Ok(match ty {
            ValueType::U8 => GgufArray::U8(self.fixed(n, 1, key, |c| u8::from_le_bytes(le(c)))?),
            ValueType::I8 => GgufArray::I8(self.fixed(n, 1, key, |c| i8::from_le_bytes(le(c)))?),
            ValueType::U16 => GgufArray::U16(self.fixed(n, 2, key, |c| u16::from_le_bytes(le(c)))?),
            ValueType::I16 => GgufArray::I16(self.fixed(n, 2, key, |c| i16::from_le_bytes(le(c)))?),
            ValueType::U32 => GgufArray::U32(self.fixed(n, 4, key, |c| u32::from_le_bytes(le(c)))?),
            ValueType::I32 => GgufArray::I32(self.fixed(n, 4, key, |c| i32::from_le_bytes(le(c)))?),
            ValueType::U64 => GgufArray::U64(self.fixed(n, 8, key, |c| u64::from_le_bytes(le(c)))?),
            ValueType::I64 => GgufArray::I64(self.fixed(n, 8, key, |c| i64::from_le_bytes(le(c)))?),
            ValueType::F32 => GgufArray::F32(self.fixed(n, 4, key, |c| f32::from_le_bytes(le(c)))?),
            ValueType::F64 => GgufArray::F64(self.fixed(n, 8, key, |c| f64::from_le_bytes(le(c)))?),
            ValueType::Bool => {
                let body = self.at();
                let bytes = self.fixed(n, 1, key, |c| c.first().copied().unwrap_or(0))?;
                let mut out = Vec::with_capacity(bytes.len());
                for (i, b) in (0u64..).zip(bytes) {
                    out.push(self.bool(b, body.saturating_add(i), key)?);
                }
                GgufArray::Bool(out)
            }
            ValueType::String => {
                let mut out = Vec::with_capacity(cap);
                for i in 0..n {
                    out.push(self.string_value(&|| format!("array `{key}` string #{i}"))?);
                }
                GgufArray::String(out)
            }
            ValueType::Array => {
                let mut out = Vec::with_capacity(cap);
                for _ in 0..n {
                    out.push(self.array_value(key, depth.saturating_add(1))?);
                }
                GgufArray::Array(out)
            }
        })
    }

    /// Checks a count from the fixed header against its cap and against the bytes left.
    fn check_count(&self, what: &str, n: u64, max: u64, min_bytes: u64) -> Parse<()> {
        if n > max {
            return Err(self.fail(format!(
                "header: {what} count {n} is over the limit of {max}"
            )));
        }
        let need = n.saturating_mul(min_bytes);
        if need > self.left_in_file() {
            return Err(self.fail(format!(
                "header: {what} count {n} needs at least {need} bytes but only {} remain after \
                 byte {}",
                self.left_in_file(),
                self.at()
            )));
        }
        Ok(())
    }

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

fn parse_header(buf: &[u8], total: u64, file: &str) -> Parse<GgufHeader> {
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
    let cap = |n: u64, min: u64, r: &Reader| usize::try_from(n.min(r.left_in_buf() / min));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_names() {
        assert_eq!(GgufValue::U32(1).type_name(), "u32");
        assert_eq!(GgufValue::String(String::new()).type_name(), "string");
        let a = GgufArray::String(vec!["a".into()]);
        assert_eq!(a.type_name(), "array<string>");
        assert_eq!(GgufValue::Array(a.clone()).type_name(), "array<string>");
        assert_eq!(GgufArray::Array(vec![a]).type_name(), "array<array>");
        assert!(GgufArray::F32(vec![]).is_empty());
    }

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
