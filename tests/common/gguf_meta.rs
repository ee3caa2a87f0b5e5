//! Metadata-only GGUF files for tokenizer and chat-template tests: take a fixture's metadata (or
//! none), change it, write it back as a GGUF v3 file without tensors, and parse that.

#![allow(dead_code)]

use std::path::Path;

use emberlm::format::gguf::{GgufArray, GgufHeader, GgufValue};

/// Metadata entries in file order.
pub type Metadata = Vec<(String, GgufValue)>;

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_u64(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn value_type(v: &GgufValue) -> u32 {
    match v {
        GgufValue::U8(_) => 0,
        GgufValue::I8(_) => 1,
        GgufValue::U16(_) => 2,
        GgufValue::I16(_) => 3,
        GgufValue::U32(_) => 4,
        GgufValue::I32(_) => 5,
        GgufValue::F32(_) => 6,
        GgufValue::Bool(_) => 7,
        GgufValue::String(_) => 8,
        GgufValue::Array(_) => 9,
        GgufValue::U64(_) => 10,
        GgufValue::I64(_) => 11,
        GgufValue::F64(_) => 12,
    }
}

fn array_type(a: &GgufArray) -> u32 {
    match a {
        GgufArray::U8(_) => 0,
        GgufArray::I8(_) => 1,
        GgufArray::U16(_) => 2,
        GgufArray::I16(_) => 3,
        GgufArray::U32(_) => 4,
        GgufArray::I32(_) => 5,
        GgufArray::F32(_) => 6,
        GgufArray::Bool(_) => 7,
        GgufArray::String(_) => 8,
        GgufArray::Array(_) => 9,
        GgufArray::U64(_) => 10,
        GgufArray::I64(_) => 11,
        GgufArray::F64(_) => 12,
    }
}

/// Element type, length and elements.
fn put_array(out: &mut Vec<u8>, a: &GgufArray) {
    put_u32(out, array_type(a));
    macro_rules! each {
        ($v:expr, $f:expr) => {{
            put_u64(out, $v.len() as u64);
            for x in $v {
                $f(&mut *out, x);
            }
        }};
    }
    match a {
        GgufArray::U8(v) => each!(v, |o: &mut Vec<u8>, x: &u8| o.push(*x)),
        GgufArray::I8(v) => each!(v, |o: &mut Vec<u8>, x: &i8| o.extend(x.to_le_bytes())),
        GgufArray::U16(v) => each!(v, |o: &mut Vec<u8>, x: &u16| o.extend(x.to_le_bytes())),
        GgufArray::I16(v) => each!(v, |o: &mut Vec<u8>, x: &i16| o.extend(x.to_le_bytes())),
        GgufArray::U32(v) => each!(v, |o: &mut Vec<u8>, x: &u32| o.extend(x.to_le_bytes())),
        GgufArray::I32(v) => each!(v, |o: &mut Vec<u8>, x: &i32| o.extend(x.to_le_bytes())),
        GgufArray::U64(v) => each!(v, |o: &mut Vec<u8>, x: &u64| o.extend(x.to_le_bytes())),
        GgufArray::I64(v) => each!(v, |o: &mut Vec<u8>, x: &i64| o.extend(x.to_le_bytes())),
        GgufArray::F32(v) => each!(v, |o: &mut Vec<u8>, x: &f32| o.extend(x.to_le_bytes())),
        GgufArray::F64(v) => each!(v, |o: &mut Vec<u8>, x: &f64| o.extend(x.to_le_bytes())),
        GgufArray::Bool(v) => each!(v, |o: &mut Vec<u8>, x: &bool| o.push(u8::from(*x))),
        GgufArray::String(v) => each!(v, |o: &mut Vec<u8>, x: &String| put_str(o, x)),
        GgufArray::Array(v) => each!(v, |o: &mut Vec<u8>, x: &GgufArray| put_array(o, x)),
    }
}

fn put_value(out: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.extend(x.to_le_bytes()),
        GgufValue::U16(x) => out.extend(x.to_le_bytes()),
        GgufValue::I16(x) => out.extend(x.to_le_bytes()),
        GgufValue::U32(x) => out.extend(x.to_le_bytes()),
        GgufValue::I32(x) => out.extend(x.to_le_bytes()),
        GgufValue::U64(x) => out.extend(x.to_le_bytes()),
        GgufValue::I64(x) => out.extend(x.to_le_bytes()),
        GgufValue::F32(x) => out.extend(x.to_le_bytes()),
        GgufValue::F64(x) => out.extend(x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(u8::from(*x)),
        GgufValue::String(s) => put_str(out, s),
        GgufValue::Array(a) => put_array(out, a),
    }
}

/// A GGUF v3 file holding `metadata` and no tensors.
pub fn write(metadata: &Metadata) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    put_u32(&mut out, 3);
    put_u64(&mut out, 0);
    put_u64(&mut out, metadata.len() as u64);
    for (key, value) in metadata {
        put_str(&mut out, key);
        put_u32(&mut out, value_type(value));
        put_value(&mut out, value);
    }
    while !out.len().is_multiple_of(32) {
        out.push(0);
    }
    out
}

/// The metadata of a GGUF file on disk.
pub fn read(path: &Path) -> Metadata {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let header = GgufHeader::parse(&bytes, &path.display().to_string())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    header.metadata().to_vec()
}

/// Parses `metadata` written as a GGUF file named `name`.
pub fn header(metadata: &Metadata, name: &str) -> GgufHeader {
    GgufHeader::parse(&write(metadata), name).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Sets `key` to `value`, replacing an existing entry in place or appending.
pub fn set(metadata: &mut Metadata, key: &str, value: GgufValue) {
    match metadata.iter_mut().find(|(k, _)| k == key) {
        Some(entry) => entry.1 = value,
        None => metadata.push((key.to_string(), value)),
    }
}

/// Removes `key` if present.
pub fn remove(metadata: &mut Metadata, key: &str) {
    metadata.retain(|(k, _)| k != key);
}

/// A string array value.
pub fn strings<S: AsRef<str>>(items: &[S]) -> GgufValue {
    GgufValue::Array(GgufArray::String(
        items.iter().map(|s| s.as_ref().to_string()).collect(),
    ))
}

/// One tensor to write: name, dims as stored (`dims[0]` fastest), GGML type id, bytes.
pub type TensorBytes = (String, Vec<u64>, u32, Vec<u8>);

/// Every tensor of a GGUF file on disk, in file order.
pub fn read_tensors(path: &Path) -> Vec<TensorBytes> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let header = GgufHeader::parse(&bytes, "t").unwrap_or_else(|e| panic!("{e}"));
    header
        .tensors()
        .iter()
        .map(|t| {
            let data = header.tensor_data(&bytes, t).unwrap().to_vec();
            (t.name.clone(), t.dims.clone(), t.dtype.ggml_id(), data)
        })
        .collect()
}

/// A GGUF v3 file holding `metadata` and `tensors` (data aligned to 32 bytes).
pub fn write_with_tensors(metadata: &Metadata, tensors: &[TensorBytes]) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    put_u32(&mut out, 3);
    put_u64(&mut out, tensors.len() as u64);
    put_u64(&mut out, metadata.len() as u64);
    for (key, value) in metadata {
        put_str(&mut out, key);
        put_u32(&mut out, value_type(value));
        put_value(&mut out, value);
    }
    let mut offset = 0u64;
    for (name, dims, dtype, data) in tensors {
        put_str(&mut out, name);
        put_u32(&mut out, dims.len() as u32);
        for &d in dims {
            put_u64(&mut out, d);
        }
        put_u32(&mut out, *dtype);
        put_u64(&mut out, offset);
        offset += (data.len() as u64).div_ceil(32) * 32;
    }
    while !out.len().is_multiple_of(32) {
        out.push(0);
    }
    for (_, _, _, data) in tensors {
        out.extend_from_slice(data);
        while !out.len().is_multiple_of(32) {
            out.push(0);
        }
    }
    out
}
