//! A cursor over the bytes of a GGUF file held so far, and the metadata values read with it.

use crate::error::Error;

use super::{GgufArray, GgufValue, MAX_ARRAY_DEPTH, MAX_ARRAY_LEN, MAX_STRING_LEN};

/// Why parsing stopped: the prefix ran out before the header did, or the file is bad.
pub(super) enum Stop {
    NeedMore,
    Fail(Error),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Self {
        Stop::Fail(e)
    }
}

/// The outcome of one parsing step.
pub(super) type Parse<T> = std::result::Result<T, Stop>;

/// Metadata value types as numbered in the file.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum ValueType {
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
    pub(super) fn from_id(id: u32) -> Option<ValueType> {
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
pub(super) struct Reader<'a> {
    pub(super) buf: &'a [u8],
    pub(super) pos: usize,
    pub(super) total: u64,
    pub(super) file: &'a str,
}

impl<'a> Reader<'a> {
    /// Absolute offset of the next byte.
    pub(super) fn at(&self) -> u64 {
        self.pos as u64
    }

    /// Bytes left in the whole file.
    pub(super) fn left_in_file(&self) -> u64 {
        self.total.saturating_sub(self.at())
    }

    /// Bytes left in the prefix held: the bound for any allocation.
    pub(super) fn left_in_buf(&self) -> u64 {
        self.buf.len().saturating_sub(self.pos) as u64
    }

    pub(super) fn fail(&self, message: String) -> Stop {
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

    pub(super) fn array<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Parse<[u8; N]> {
        Ok(le::<N>(self.take(N as u64, what)?))
    }

    pub(super) fn u32(&mut self, what: impl FnOnce() -> String) -> Parse<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub(super) fn u64(&mut self, what: impl FnOnce() -> String) -> Parse<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A length-prefixed byte string of at most `max` bytes, borrowed from the input.
    pub(super) fn string_bytes(&mut self, max: u64, what: &dyn Fn() -> String) -> Parse<&'a [u8]> {
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
    pub(super) fn value(&mut self, ty: ValueType, key: &str) -> Parse<GgufValue> {
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
        let cap =
            usize::try_from(n.min(self.left_in_buf().checked_div(ty.min_bytes()).unwrap_or(0)))
                .unwrap_or(0);
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
    pub(super) fn check_count(&self, what: &str, n: u64, max: u64, min_bytes: u64) -> Parse<()> {
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
}
