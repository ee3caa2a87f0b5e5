//! The GGUF reader against hostile input: files built byte by byte here (a small writer), then
//! broken one way at a time, each of which must be refused with a message that says what and
//! where; every prefix of a valid file; and random byte flips, which must never panic.

#![cfg(not(target_arch = "wasm32"))]

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/peak_alloc.rs"]
mod peak_alloc;

use std::time::{Duration, Instant};

use emberlm::dtype::DType;
use emberlm::format::gguf::{
    GgufArray, GgufHeader, GgufValue, MAX_ARRAY_DEPTH, MAX_ARRAY_LEN, MAX_DIMS, MAX_METADATA_COUNT,
    MAX_NAME_LEN, MAX_STRING_LEN, MAX_TENSOR_COUNT,
};
use emberlm::Error;
use rand::Rng;

// ---------------------------------------------------------------------------------------------
// A GGUF writer

const T_U8: u32 = 0;
const T_I8: u32 = 1;
const T_U16: u32 = 2;
const T_I16: u32 = 3;
const T_U32: u32 = 4;
const T_I32: u32 = 5;
const T_F32: u32 = 6;
const T_BOOL: u32 = 7;
const T_STRING: u32 = 8;
const T_ARRAY: u32 = 9;
const T_U64: u32 = 10;
const T_I64: u32 = 11;
const T_F64: u32 = 12;

/// A metadata value to write. `Bool` takes the raw byte, `Arr` an element type and elements
/// (written without their type tags), `Raw` any type id with any payload.
#[derive(Clone, Debug)]
enum V {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(u8),
    Str(Vec<u8>),
    Arr(u32, Vec<V>),
    Raw(u32, Vec<u8>),
}

fn s(text: &str) -> V {
    V::Str(text.as_bytes().to_vec())
}

fn put_str(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend((bytes.len() as u64).to_le_bytes());
    out.extend(bytes);
}

impl V {
    fn ty(&self) -> u32 {
        match self {
            V::U8(_) => T_U8,
            V::I8(_) => T_I8,
            V::U16(_) => T_U16,
            V::I16(_) => T_I16,
            V::U32(_) => T_U32,
            V::I32(_) => T_I32,
            V::U64(_) => T_U64,
            V::I64(_) => T_I64,
            V::F32(_) => T_F32,
            V::F64(_) => T_F64,
            V::Bool(_) => T_BOOL,
            V::Str(_) => T_STRING,
            V::Arr(..) => T_ARRAY,
            V::Raw(t, _) => *t,
        }
    }

    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            V::U8(x) => out.extend(x.to_le_bytes()),
            V::I8(x) => out.extend(x.to_le_bytes()),
            V::U16(x) => out.extend(x.to_le_bytes()),
            V::I16(x) => out.extend(x.to_le_bytes()),
            V::U32(x) => out.extend(x.to_le_bytes()),
            V::I32(x) => out.extend(x.to_le_bytes()),
            V::U64(x) => out.extend(x.to_le_bytes()),
            V::I64(x) => out.extend(x.to_le_bytes()),
            V::F32(x) => out.extend(x.to_le_bytes()),
            V::F64(x) => out.extend(x.to_le_bytes()),
            V::Bool(b) => out.push(*b),
            V::Str(b) => put_str(out, b),
            V::Arr(ty, items) => {
                out.extend(ty.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for item in items {
                    item.encode(out);
                }
            }
            V::Raw(_, b) => out.extend(b),
        }
    }
}

#[derive(Clone, Debug)]
struct Tensor {
    name: Vec<u8>,
    dims: Vec<u64>,
    ty: u32,
    /// Bytes laid out in the data section for this tensor.
    n_bytes: u64,
    /// Written instead of the offset the layout gives.
    offset: Option<u64>,
}

fn tensor(name: &str, dims: &[u64], dtype: DType) -> Tensor {
    let n: u64 = dims.iter().product();
    Tensor {
        name: name.as_bytes().to_vec(),
        dims: dims.to_vec(),
        ty: dtype.ggml_id(),
        n_bytes: dtype.bytes_for(n, name).unwrap(),
        offset: None,
    }
}

/// An F32 tensor with hand-picked dims and type id (no size computation).
fn raw_tensor(name: &[u8], dims: &[u64], ty: u32) -> Tensor {
    Tensor {
        name: name.to_vec(),
        dims: dims.to_vec(),
        ty,
        n_bytes: 4,
        offset: None,
    }
}

#[derive(Clone, Debug)]
struct Gguf {
    magic: [u8; 4],
    version: u32,
    n_tensors: Option<u64>,
    n_kv: Option<u64>,
    kvs: Vec<(Vec<u8>, V)>,
    tensors: Vec<Tensor>,
    /// Alignment used to lay out the data section (set `general.alignment` separately).
    alignment: u64,
}

/// Written bytes and where each part starts.
struct Built {
    bytes: Vec<u8>,
    key_at: Vec<usize>,
    value_at: Vec<usize>,
    info_at: Vec<usize>,
    header_end: usize,
    data_offset: usize,
}

impl Gguf {
    fn new() -> Self {
        Gguf {
            magic: *b"GGUF",
            version: 3,
            n_tensors: None,
            n_kv: None,
            kvs: Vec::new(),
            tensors: Vec::new(),
            alignment: 32,
        }
    }

    fn kv(self, key: &str, v: V) -> Self {
        self.kv_raw(key.as_bytes(), v)
    }

    fn kv_raw(mut self, key: &[u8], v: V) -> Self {
        self.kvs.push((key.to_vec(), v));
        self
    }

    fn tensor(mut self, t: Tensor) -> Self {
        self.tensors.push(t);
        self
    }

    fn build(&self) -> Built {
        let mut out = Vec::new();
        out.extend(self.magic);
        out.extend(self.version.to_le_bytes());
        let n_tensors = self.n_tensors.unwrap_or(self.tensors.len() as u64);
        out.extend(n_tensors.to_le_bytes());
        out.extend(self.n_kv.unwrap_or(self.kvs.len() as u64).to_le_bytes());
        let (mut key_at, mut value_at, mut info_at) = (Vec::new(), Vec::new(), Vec::new());
        for (key, v) in &self.kvs {
            key_at.push(out.len());
            put_str(&mut out, key);
            out.extend(v.ty().to_le_bytes());
            value_at.push(out.len());
            v.encode(&mut out);
        }
        let mut offsets = Vec::new();
        let mut next = 0u64;
        for t in &self.tensors {
            let at = next.next_multiple_of(self.alignment);
            offsets.push(at);
            next = at + t.n_bytes;
            info_at.push(out.len());
            put_str(&mut out, &t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.ty.to_le_bytes());
            out.extend(t.offset.unwrap_or(at).to_le_bytes());
        }
        let header_end = out.len();
        let data_offset = header_end.next_multiple_of(self.alignment as usize);
        if !self.tensors.is_empty() {
            out.resize(data_offset, 0);
        }
        for (i, (t, at)) in self.tensors.iter().zip(offsets).enumerate() {
            out.resize(data_offset + at as usize, 0);
            out.extend((0..t.n_bytes).map(|j| (i as u64 * 31 + j) as u8));
        }
        Built {
            bytes: out,
            key_at,
            value_at,
            info_at,
            header_end,
            data_offset,
        }
    }

    fn bytes(&self) -> Vec<u8> {
        self.build().bytes
    }
}

/// A file using every value type, nested arrays and tensors of several types, whose last
/// tensor ends at the end of the file (so every shorter prefix is truncated).
fn valid() -> Gguf {
    Gguf::new()
        .kv("general.architecture", s("llama"))
        .kv("general.name", s("tiny ünïcode"))
        .kv("llama.block_count", V::U32(2))
        .kv("test.u8", V::U8(200))
        .kv("test.i8", V::I8(-5))
        .kv("test.u16", V::U16(60000))
        .kv("test.i16", V::I16(-30000))
        .kv("test.i32", V::I32(-7))
        .kv("test.u64", V::U64(1 << 40))
        .kv("test.i64", V::I64(1 << 35))
        .kv("test.f32", V::F32(1.5))
        .kv("test.f64", V::F64(2.25))
        .kv("test.bool", V::Bool(1))
        .kv(
            "tokenizer.ggml.tokens",
            V::Arr(T_STRING, vec![s("a"), s("bb"), s("")]),
        )
        .kv(
            "tokenizer.ggml.scores",
            V::Arr(T_F32, vec![V::F32(0.5), V::F32(-1.0), V::F32(2.0)]),
        )
        .kv(
            "tokenizer.ggml.token_type",
            V::Arr(T_I32, vec![V::I32(1), V::I32(3), V::I32(-1)]),
        )
        .kv(
            "test.nested",
            V::Arr(
                T_ARRAY,
                vec![
                    V::Arr(T_U8, vec![V::U8(1), V::U8(2)]),
                    V::Arr(T_STRING, vec![s("x")]),
                ],
            ),
        )
        .kv("test.empty", V::Arr(T_U64, vec![]))
        .kv("test.bools", V::Arr(T_BOOL, vec![V::Bool(0), V::Bool(1)]))
        .tensor(tensor("token_embd.weight", &[4, 3], DType::F32))
        .tensor(tensor("output_norm.weight", &[5], DType::F16))
        .tensor(tensor("blk.0.attn_q.weight", &[64, 2], DType::Q4_0))
        .tensor(tensor("blk.0.cube", &[2, 3, 4, 5], DType::F32))
        .tensor(tensor("blk.0.ffn_down.weight", &[256, 1], DType::Q4_K))
        .tensor(tensor("blk.0.tail", &[3], DType::F16))
}

/// The smallest file with one extra metadata entry.
fn with_kv(key: &str, v: V) -> Vec<u8> {
    Gguf::new()
        .kv("general.architecture", s("llama"))
        .kv(key, v)
        .bytes()
}

/// The smallest file with one tensor.
fn with_tensor(t: Tensor) -> Vec<u8> {
    Gguf::new()
        .kv("general.architecture", s("llama"))
        .tensor(t)
        .bytes()
}

/// `n` levels of arrays, the innermost holding one u8.
fn nested(n: usize) -> V {
    let mut v = V::Arr(T_U8, vec![V::U8(7)]);
    for _ in 1..n {
        v = V::Arr(T_ARRAY, vec![v]);
    }
    v
}

fn cut(bytes: &[u8], n: usize) -> Vec<u8> {
    bytes[..n].to_vec()
}

// ---------------------------------------------------------------------------------------------
// Valid files

#[test]
fn writer_output_parses_back() {
    let built = valid().build();
    let h = GgufHeader::parse(&built.bytes, "valid.gguf").unwrap();
    assert_eq!(h.version, 3);
    assert_eq!(h.alignment, 32);
    assert_eq!(h.data_offset as usize, built.data_offset);
    assert_eq!(h.file(), "valid.gguf");
    assert_eq!(h.architecture().unwrap(), "llama");
    assert_eq!(h.get_str("general.name").unwrap(), Some("tiny ünïcode"));
    assert_eq!(h.metadata().len(), 19);
    assert_eq!(h.metadata()[3].0, "test.u8");
    assert_eq!(h.get("test.u8"), Some(&GgufValue::U8(200)));
    assert_eq!(h.get("test.i8"), Some(&GgufValue::I8(-5)));
    assert_eq!(h.get("test.u16"), Some(&GgufValue::U16(60000)));
    assert_eq!(h.get("test.i16"), Some(&GgufValue::I16(-30000)));
    assert_eq!(h.get("test.u64"), Some(&GgufValue::U64(1 << 40)));
    assert_eq!(h.get("test.i64"), Some(&GgufValue::I64(1 << 35)));
    assert_eq!(h.get("test.f64"), Some(&GgufValue::F64(2.25)));
    assert_eq!(h.get_bool("test.bool").unwrap(), Some(true));
    assert_eq!(h.get_f32("test.f32").unwrap(), Some(1.5));
    assert_eq!(h.get_f32("test.f64").unwrap(), Some(2.25));
    assert_eq!(h.get_u64("test.i64").unwrap(), Some(1 << 35));
    assert_eq!(h.get_u32("test.u16").unwrap(), Some(60000));
    assert_eq!(
        h.get_str_array("tokenizer.ggml.tokens").unwrap().unwrap(),
        ["a", "bb", ""]
    );
    assert_eq!(
        h.get_f32_array("tokenizer.ggml.scores").unwrap().unwrap(),
        [0.5, -1.0, 2.0]
    );
    assert_eq!(
        h.get_i32_array("tokenizer.ggml.token_type")
            .unwrap()
            .unwrap(),
        [1, 3, -1]
    );
    let nested = h.get_array("test.nested").unwrap().unwrap();
    assert_eq!(nested.type_name(), "array<array>");
    assert_eq!(
        nested,
        &GgufArray::Array(vec![
            GgufArray::U8(vec![1, 2]),
            GgufArray::String(vec!["x".into()])
        ])
    );
    assert!(h.get_array("test.empty").unwrap().unwrap().is_empty());
    assert_eq!(
        h.get("test.bools"),
        Some(&GgufValue::Array(GgufArray::Bool(vec![false, true])))
    );

    assert_eq!(h.tensors().len(), 6);
    let cube = h.tensor("blk.0.cube").unwrap();
    assert_eq!(cube.dims, vec![2, 3, 4, 5]);
    assert_eq!(cube.shape(), vec![5, 4, 3, 2]);
    assert_eq!(cube.n_elements(), 120);
    assert_eq!(cube.n_bytes, 480);
    let q = h.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!((q.dtype, q.n_bytes), (DType::Q4_0, 4 * 18));
    assert_eq!(h.tensor("blk.0.ffn_down.weight").unwrap().n_bytes, 144);
    for (i, t) in h.tensors().iter().enumerate() {
        assert_eq!(t.offset % 32, 0);
        let data = h.tensor_data(&built.bytes, t).unwrap();
        let expected: Vec<u8> = (0..t.n_bytes).map(|j| (i as u64 * 31 + j) as u8).collect();
        assert_eq!(data, expected.as_slice(), "{}", t.name);
    }
    let last = h.tensors().last().unwrap();
    assert_eq!(h.tensor_range(last).end, built.bytes.len() as u64);
}

#[test]
fn version_2_custom_alignment_and_deep_arrays_parse() {
    let mut g = valid()
        .kv("general.alignment", V::U32(64))
        .kv("test.deepest", nested(MAX_ARRAY_DEPTH as usize));
    g.version = 2;
    g.alignment = 64;
    let bytes = g.bytes();
    let h = GgufHeader::parse(&bytes, "v2.gguf").unwrap();
    assert_eq!((h.version, h.alignment), (2, 64));
    assert_eq!(h.data_offset % 64, 0);
    assert!(h.tensors().iter().all(|t| t.offset % 64 == 0));
    assert_eq!(h.get_u32("general.alignment").unwrap(), Some(64));
    assert_eq!(
        h.get("test.deepest").map(GgufValue::type_name),
        Some("array<array>")
    );

    // No tensors: the header may end the file, with no padding after it.
    let built = Gguf::new().kv("general.architecture", s("gpt2")).build();
    let h = GgufHeader::parse(&built.bytes, "empty.gguf").unwrap();
    assert!(h.tensors().is_empty());
    assert_eq!(
        h.data_offset as usize,
        built.header_end.next_multiple_of(32)
    );
    assert!(built.bytes.len() < h.data_offset as usize);
}

#[test]
fn typed_getters_check_types_and_ranges() {
    let bytes = Gguf::new()
        .kv("neg", V::I32(-1))
        .kv("big", V::U64(1 << 33))
        .kv("huge", V::F64(1e300))
        .kv("name", s("x"))
        .kv("nested", nested(2))
        .bytes();
    let h = GgufHeader::parse(&bytes, "getters.gguf").unwrap();
    let msg = |r: Result<(), Error>| r.unwrap_err().to_string();
    let e = msg(h.get_u64("neg").map(drop));
    assert!(
        e.contains("`neg`") && e.contains("-1") && e.contains("non-negative"),
        "{e}"
    );
    let e = msg(h.get_u32("big").map(drop));
    assert!(e.contains("`big`") && e.contains("u32"), "{e}");
    assert_eq!(h.get_u64("big").unwrap(), Some(1 << 33));
    let e = msg(h.get_f32("huge").map(drop));
    assert!(e.contains("`huge`") && e.contains("f32"), "{e}");
    let e = msg(h.get_f32("name").map(drop));
    assert!(
        e.contains("`name`") && e.contains("string") && e.contains("f32"),
        "{e}"
    );
    let e = msg(h.get_str_array("nested").map(drop));
    assert!(
        e.contains("array<array>") && e.contains("array<string>"),
        "{e}"
    );
    let e = msg(h.get_array("name").map(drop));
    assert!(e.contains("`name`") && e.contains("array"), "{e}");
    let e = msg(h.architecture().map(drop));
    assert!(
        e.contains("general.architecture") && e.contains("getters.gguf"),
        "{e}"
    );
    assert_eq!(h.get_i32_array("absent").unwrap(), None);
}

// ---------------------------------------------------------------------------------------------
// Malformed files

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Format,
    Unsupported,
}

struct Case {
    name: &'static str,
    bytes: Vec<u8>,
    kind: Kind,
    expect: Vec<String>,
}

fn case(name: &'static str, bytes: Vec<u8>, expect: &[&str]) -> Case {
    Case {
        name,
        bytes,
        kind: Kind::Format,
        expect: expect.iter().map(|s| s.to_string()).collect(),
    }
}

fn unsupported(name: &'static str, bytes: Vec<u8>, expect: &[&str]) -> Case {
    Case {
        kind: Kind::Unsupported,
        ..case(name, bytes, expect)
    }
}

/// `valid()` behind a long first entry, so that a cut anywhere after it leaves more bytes than
/// the counts' minimum sizes and the parser reaches the section that was cut.
fn front_loaded() -> Gguf {
    let mut g = valid();
    let blurb = (
        "general.description".as_bytes().to_vec(),
        s(&"lorem ipsum ".repeat(60)),
    );
    g.kvs.insert(0, blurb);
    g
}

fn cases() -> Vec<Case> {
    let built = front_loaded().build();
    let v = &built.bytes;
    let huge = 1u64 << 62;
    let big_a = format!("{huge}");
    // Tensor and metadata counts that each fit in the file but together do not (the smallest
    // tensor info is 33 bytes, the smallest metadata entry 14).
    let left = v.len() as u64 - 24;
    let both = (left * 6 / 10 / 33, left * 6 / 10 / 14);
    let cases = vec![
        // Truncation, one per section.
        case(
            "empty file",
            vec![],
            &["truncated header (magic)", "ends at byte 0"],
        ),
        case(
            "truncated in magic",
            cut(v, 2),
            &["truncated header (magic)"],
        ),
        case(
            "truncated in version",
            cut(v, 6),
            &["truncated header (version)"],
        ),
        case(
            "truncated in counts",
            cut(v, 12),
            &["truncated header (tensor count)"],
        ),
        case(
            "truncated in key length",
            cut(v, built.key_at[2] + 4),
            &["truncated metadata key #2 length", "at byte"],
        ),
        case(
            "truncated in key",
            cut(v, built.key_at[2] + 8 + 3),
            &[
                "truncated metadata key #2: length 12",
                "runs past the end of the file",
            ],
        ),
        case(
            "truncated in value type",
            cut(v, built.value_at[3] - 2),
            &["truncated metadata value `llama.block_count` type"],
        ),
        case(
            "truncated in value",
            cut(v, built.value_at[3] + 2),
            &[
                "truncated metadata value `llama.block_count`",
                "needs 4 bytes",
            ],
        ),
        case(
            "truncated in string value",
            cut(v, built.value_at[2] + 8 + 4),
            &["truncated metadata value `general.name`"],
        ),
        case(
            "truncated in array header",
            cut(v, built.value_at[15] + 6),
            &["truncated array `tokenizer.ggml.scores` length"],
        ),
        case(
            "truncated in array body",
            cut(v, built.value_at[15] + 12 + 5),
            &["truncated array `tokenizer.ggml.scores`"],
        ),
        case(
            "truncated in string array",
            cut(v, built.value_at[14] + 12 + 24),
            &["truncated array `tokenizer.ggml.tokens` string #2 length"],
        ),
        case(
            "cut shorter than the counts allow",
            cut(&valid().bytes(), 100),
            &["header: metadata count 19 needs at least 266 bytes but only 76 remain"],
        ),
        case(
            "truncated in tensor info name",
            cut(v, built.info_at[1] + 8 + 5),
            &[
                "truncated tensor info #1 name",
                "runs past the end of the file",
            ],
        ),
        case(
            "truncated in tensor dims",
            cut(v, built.info_at[3] + 8 + 10 + 4 + 8 + 3),
            &["truncated tensor info `blk.0.cube` dimension 1"],
        ),
        case(
            "truncated in tensor offset",
            cut(v, built.header_end - 1),
            &["truncated tensor info `blk.0.tail` offset"],
        ),
        case(
            "truncated data",
            cut(v, v.len() - 1),
            &[
                "tensor `blk.0.tail`",
                "runs past the end of the file",
                "bytes)",
            ],
        ),
        case(
            "no data at all",
            cut(v, built.header_end),
            &[
                "tensor `token_embd.weight`",
                "runs past the end of the file",
            ],
        ),
        // Header.
        case(
            "bad magic",
            [b"GGML".as_slice(), &v[4..]].concat(),
            &["not a GGUF file: it starts with \"GGML\""],
        ),
        case(
            "zip file",
            b"PK\x03\x04rest".to_vec(),
            &["not a GGUF file: it starts with \"PK\\x03\\x04\""],
        ),
        unsupported(
            "version 1",
            Gguf {
                version: 1,
                ..valid()
            }
            .bytes(),
            &["GGUF version 1", "2 and 3"],
        ),
        unsupported(
            "version 4",
            Gguf {
                version: 4,
                ..valid()
            }
            .bytes(),
            &["GGUF version 4"],
        ),
        unsupported(
            "big-endian",
            Gguf {
                version: 3u32.swap_bytes(),
                ..valid()
            }
            .bytes(),
            &["big-endian GGUF", "only little-endian"],
        ),
        // Counts.
        case(
            "absurd metadata count",
            Gguf {
                n_kv: Some(huge),
                ..valid()
            }
            .bytes(),
            &[&format!(
                "metadata count {big_a} is over the limit of {MAX_METADATA_COUNT}"
            )],
        ),
        case(
            "metadata count beyond the file",
            Gguf {
                n_kv: Some(100_000),
                ..valid()
            }
            .bytes(),
            &["metadata count 100000 needs at least 1400000 bytes"],
        ),
        case(
            "absurd tensor count",
            Gguf {
                n_tensors: Some(huge),
                ..valid()
            }
            .bytes(),
            &[&format!(
                "tensor count {big_a} is over the limit of {MAX_TENSOR_COUNT}"
            )],
        ),
        case(
            "tensor count beyond the file",
            Gguf {
                n_tensors: Some(100_000),
                ..valid()
            }
            .bytes(),
            &["tensor count 100000 needs at least"],
        ),
        case(
            "counts together beyond the file",
            Gguf {
                n_tensors: Some(both.0),
                n_kv: Some(both.1),
                ..valid()
            }
            .bytes(),
            &[&format!(
                "{} metadata entries and {} tensor infos need at least",
                both.1, both.0
            )],
        ),
        // Strings.
        case(
            "absurd key length",
            [&v[..24], &huge.to_le_bytes(), &v[32..]].concat(),
            &[&format!(
                "metadata key #0 at byte 24 has length {big_a}, over the limit of {MAX_NAME_LEN}"
            )],
        ),
        case(
            "key over the name limit",
            with_kv(&"k".repeat(MAX_NAME_LEN as usize + 1), V::U8(0)),
            &["metadata key #1", "over the limit of 65535"],
        ),
        case(
            "absurd string length",
            with_kv(
                "general.name",
                V::Raw(T_STRING, huge.to_le_bytes().to_vec()),
            ),
            &[
                "metadata value `general.name`",
                &format!("over the limit of {MAX_STRING_LEN}"),
            ],
        ),
        case(
            "string past end of file",
            with_kv(
                "general.name",
                V::Raw(T_STRING, [&100u64.to_le_bytes()[..], b"abc"].concat()),
            ),
            &[
                "truncated metadata value `general.name`: length 100",
                "runs past the end of the file",
            ],
        ),
        case(
            "empty key",
            with_kv("", V::U8(1)),
            &["metadata key #1 at byte", "is empty"],
        ),
        case(
            "non-UTF-8 key",
            Gguf::new().kv_raw(b"general.\xff\xfe", V::U32(1)).bytes(),
            &["metadata key #0 at byte 24 is not valid UTF-8"],
        ),
        case(
            "non-UTF-8 string value",
            with_kv("general.name", V::Str(b"ab\xc3".to_vec())),
            &["metadata value `general.name`", "not valid UTF-8"],
        ),
        case(
            "non-UTF-8 string in array",
            with_kv(
                "tokenizer.ggml.tokens",
                V::Arr(T_STRING, vec![s("ok"), V::Str(vec![0xc0, 0x80])]),
            ),
            &["array `tokenizer.ggml.tokens` string #1", "not valid UTF-8"],
        ),
        // Values.
        case(
            "unknown value type",
            with_kv("test.x", V::Raw(13, vec![0; 8])),
            &["metadata key `test.x`", "unknown value type 13"],
        ),
        case(
            "bool out of range",
            with_kv("test.flag", V::Bool(2)),
            &["metadata value `test.flag`", "is 2, expected 0 or 1"],
        ),
        case(
            "bool array element out of range",
            with_kv("test.flags", V::Arr(T_BOOL, vec![V::Bool(1), V::Bool(7)])),
            &["metadata value `test.flags`", "is 7, expected 0 or 1"],
        ),
        case(
            "duplicate key",
            front_loaded().kv("llama.block_count", V::U32(3)).bytes(),
            &["duplicate metadata key `llama.block_count`", "#3 and #20"],
        ),
        // Arrays.
        case(
            "absurd array length",
            with_kv(
                "tokenizer.ggml.tokens",
                V::Raw(
                    T_ARRAY,
                    [T_STRING.to_le_bytes().as_slice(), &huge.to_le_bytes()].concat(),
                ),
            ),
            &[
                "array `tokenizer.ggml.tokens`",
                &format!("{big_a} elements, over the limit of {MAX_ARRAY_LEN}"),
            ],
        ),
        case(
            "array length beyond the file",
            with_kv(
                "tokenizer.ggml.scores",
                V::Raw(
                    T_ARRAY,
                    [
                        T_F32.to_le_bytes().as_slice(),
                        &1_000_000u64.to_le_bytes(),
                        &[0; 16],
                    ]
                    .concat(),
                ),
            ),
            &[
                "truncated array `tokenizer.ggml.scores`: 1000000 f32 elements",
                "need at least 4000000 bytes",
            ],
        ),
        case(
            "array of unknown element type",
            with_kv("test.arr", V::Arr(99, vec![])),
            &["array `test.arr`", "unknown element type 99"],
        ),
        case(
            "nested array of unknown element type",
            with_kv("test.arr", V::Arr(T_ARRAY, vec![V::Arr(77, vec![])])),
            &["array `test.arr`", "unknown element type 77"],
        ),
        case(
            "arrays nested too deep",
            with_kv("test.deep", nested(MAX_ARRAY_DEPTH as usize + 1)),
            &[
                "array `test.deep`",
                &format!("nested deeper than the limit of {MAX_ARRAY_DEPTH}"),
            ],
        ),
        // Tensor infos.
        case(
            "duplicate tensor name",
            valid()
                .tensor(tensor("blk.0.cube", &[8], DType::F32))
                .bytes(),
            &["duplicate tensor name `blk.0.cube`", "#3 and #6"],
        ),
        case(
            "empty tensor name",
            with_tensor(tensor("", &[8], DType::F32)),
            &["tensor info #0", "empty name"],
        ),
        case(
            "non-UTF-8 tensor name",
            with_tensor(raw_tensor(b"blk.\xff.weight", &[1], 0)),
            &[
                "tensor info #0 at byte",
                "not valid UTF-8",
                "blk.\u{fffd}.weight",
            ],
        ),
        case(
            "too many dimensions",
            with_tensor(raw_tensor(b"w", &[1, 1, 1, 1, 1], 0)),
            &[
                "tensor `w`",
                &format!("5 dimensions, over the limit of {MAX_DIMS}"),
            ],
        ),
        case(
            "zero dimension",
            with_tensor(raw_tensor(b"w", &[4, 0], 0)),
            &["tensor `w`", "dimension 1 is 0"],
        ),
        case(
            "element count overflow",
            with_tensor(raw_tensor(b"w", &[1 << 32, 1 << 32, 2], 0)),
            &["tensor `w`", "element count", "overflows"],
        ),
        case(
            "byte size overflow",
            with_tensor(raw_tensor(b"w", &[1 << 62, 2], 0)),
            &["tensor `w`", "overflows"],
        ),
        unsupported(
            "unknown tensor type",
            with_tensor(raw_tensor(b"w", &[32], 99)),
            &["tensor type unknown (99) in tensor `w`"],
        ),
        unsupported(
            "unsupported tensor type",
            with_tensor(raw_tensor(b"blk.0.attn_q.weight", &[256], 17)),
            &["tensor type IQ2_XS (17) in tensor `blk.0.attn_q.weight`"],
        ),
        unsupported(
            "scalar tensor",
            with_tensor(raw_tensor(b"w", &[], 0)),
            &["0-dimensional", "`w`"],
        ),
        case(
            "row not a multiple of the block size",
            with_tensor(raw_tensor(b"w", &[33, 2], DType::Q4_0.ggml_id())),
            &[
                "tensor `w`",
                "row length 33",
                "not a multiple of the Q4_0 block size 32",
            ],
        ),
        case(
            "misaligned tensor offset",
            with_tensor(Tensor {
                offset: Some(16),
                ..tensor("w", &[8], DType::F32)
            }),
            &[
                "tensor `w`",
                "offset 16 is not a multiple of the alignment 32",
            ],
        ),
        case(
            "offset plus size overflows",
            with_tensor(Tensor {
                offset: Some(u64::MAX - 31),
                ..tensor("w", &[64], DType::F32)
            }),
            &["tensor `w`", "overflows"],
        ),
        case(
            "tensor data past end of file",
            with_tensor(Tensor {
                offset: Some(1 << 20),
                ..tensor("w", &[8], DType::F32)
            }),
            &[
                "tensor `w` data at bytes",
                "(offset 1048576 in the data section",
                "runs past the end of the file (160 bytes)",
            ],
        ),
        // Alignment.
        case(
            "alignment 0",
            valid().kv("general.alignment", V::U32(0)).bytes(),
            &["`general.alignment` is 0", "u32 power of two"],
        ),
        case(
            "alignment 3",
            valid().kv("general.alignment", V::U32(3)).bytes(),
            &["`general.alignment` is 3", "u32 power of two"],
        ),
        case(
            "alignment of type u64",
            valid().kv("general.alignment", V::U64(32)).bytes(),
            &["`general.alignment` is of type u64"],
        ),
        case(
            "alignment of type string",
            valid().kv("general.alignment", s("32")).bytes(),
            &["`general.alignment` is of type string"],
        ),
        case(
            "offsets misaligned for a larger alignment",
            valid().kv("general.alignment", V::U32(64)).bytes(),
            &["not a multiple of the alignment 64"],
        ),
    ];
    cases
}

#[test]
fn malformed_inputs_are_rejected() {
    let cases = cases();
    let mut failures = Vec::new();
    let mut names = std::collections::HashSet::new();
    for c in &cases {
        assert!(names.insert(c.name), "duplicate case name {}", c.name);
        let start = Instant::now();
        let (result, peak) = peak_alloc::with_peak(|| GgufHeader::parse(&c.bytes, "bad.gguf"));
        let elapsed = start.elapsed();
        let err = match result {
            Ok(_) => {
                failures.push(format!("{}: parsed", c.name));
                continue;
            }
            Err(e) => e,
        };
        let msg = err.to_string();
        let kind_ok = match c.kind {
            Kind::Format => matches!(err, Error::Format { .. }),
            Kind::Unsupported => matches!(err, Error::Unsupported { .. }),
        };
        if !kind_ok {
            failures.push(format!("{}: expected {:?}, got {err:?}", c.name, c.kind));
        }
        if !msg.starts_with("bad.gguf: ") {
            failures.push(format!("{}: message does not name the file: {msg}", c.name));
        }
        for want in &c.expect {
            if !msg.contains(want.as_str()) {
                failures.push(format!("{}: `{want}` not in: {msg}", c.name));
            }
        }
        // Claims of 2^62 elements must be refused before anything that size is reserved.
        let limit = 64 * 1024 + 4 * c.bytes.len();
        if peak > limit {
            failures.push(format!("{}: allocated {peak} bytes at once", c.name));
        }
        if elapsed > Duration::from_secs(1) {
            failures.push(format!("{}: took {elapsed:?}", c.name));
        }
        // The streaming entry point agrees when given the whole file.
        match GgufHeader::parse_prefix(&c.bytes, c.bytes.len() as u64, "bad.gguf") {
            Err(e) if e.to_string() == msg => {}
            other => failures.push(format!("{}: parse_prefix gave {other:?}", c.name)),
        }
        eprintln!("{:<45} {msg}", c.name);
    }
    eprintln!("{} malformed cases", cases.len());
    assert!(cases.len() >= 30);
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn prefixes_of_malformed_files_never_give_a_header() {
    // Each prefix is either "need more bytes" or the full file's own error: the streaming path
    // must never accept a bad file, nor report a different fault than the whole file has.
    for c in cases() {
        let total = c.bytes.len() as u64;
        let full = GgufHeader::parse(&c.bytes, "bad.gguf")
            .unwrap_err()
            .to_string();
        for n in 0..c.bytes.len().min(4096) {
            match GgufHeader::parse_prefix(&c.bytes[..n], total, "bad.gguf") {
                Ok(None) => {}
                Err(e) => assert_eq!(e.to_string(), full, "{} at {n}", c.name),
                Ok(Some(_)) => panic!("{}: prefix of {n} bytes gave a header", c.name),
            }
        }
    }
}

#[test]
fn streaming_claims_do_not_reserve_memory() {
    // While streaming, a header may claim counts that the (huge) file could hold; what is
    // reserved must still be bounded by the bytes actually held.
    let total = 1u64 << 40;
    let claims = [
        Gguf {
            n_kv: Some(MAX_METADATA_COUNT),
            ..Gguf::new()
        }
        .bytes(),
        Gguf {
            n_tensors: Some(MAX_TENSOR_COUNT),
            ..Gguf::new()
        }
        .bytes(),
        with_kv(
            "tokenizer.ggml.tokens",
            V::Raw(
                T_ARRAY,
                [
                    T_STRING.to_le_bytes().as_slice(),
                    &MAX_ARRAY_LEN.to_le_bytes(),
                ]
                .concat(),
            ),
        ),
        with_kv(
            "test.arrays",
            V::Raw(
                T_ARRAY,
                [
                    T_ARRAY.to_le_bytes().as_slice(),
                    &MAX_ARRAY_LEN.to_le_bytes(),
                ]
                .concat(),
            ),
        ),
        with_kv(
            "test.bytes",
            V::Raw(
                T_ARRAY,
                [T_U8.to_le_bytes().as_slice(), &MAX_ARRAY_LEN.to_le_bytes()].concat(),
            ),
        ),
    ];
    for (i, bytes) in claims.iter().enumerate() {
        let (result, peak) =
            peak_alloc::with_peak(|| GgufHeader::parse_prefix(bytes, total, "stream.gguf"));
        assert!(matches!(result, Ok(None)), "claim {i}: {result:?}");
        assert!(
            peak < 64 * 1024,
            "claim {i}: allocated {peak} bytes at once"
        );
    }
}

#[test]
fn prefix_longer_than_the_file_is_an_argument_error() {
    let bytes = valid().bytes();
    let err = GgufHeader::parse_prefix(&bytes, bytes.len() as u64 - 1, "x.gguf").unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidArgument {
                name: "total_len",
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn every_prefix_of_a_valid_file() {
    let built = valid().build();
    let bytes = &built.bytes;
    let total = bytes.len() as u64;
    let full = GgufHeader::parse(bytes, "valid.gguf").unwrap();
    for n in 0..bytes.len() {
        let prefix = &bytes[..n];
        let err = GgufHeader::parse(prefix, "valid.gguf");
        assert!(err.is_err(), "parse accepted a {n}-byte prefix");
        match GgufHeader::parse_prefix(prefix, total, "valid.gguf") {
            Ok(None) => assert!(n < built.header_end, "Ok(None) at {n}"),
            Ok(Some(h)) => {
                assert!(n >= built.header_end, "header from {n} bytes");
                assert_eq!(h, full, "at {n}");
            }
            Err(e) => panic!("prefix of {n} bytes: {e}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Random corruption

/// `a == b` for two parses of the same bytes. Metadata is compared through its `Debug` form,
/// because a corrupted float may be NaN, which `==` never equals (the derived `PartialEq` of
/// the whole header fails on it though both parses agree).
fn assert_same_header(a: &GgufHeader, b: &GgufHeader) {
    assert_eq!(
        (a.version, a.alignment, a.data_offset, a.file()),
        (b.version, b.alignment, b.data_offset, b.file())
    );
    assert_eq!(a.tensors(), b.tensors());
    assert_eq!(format!("{:?}", a.metadata()), format!("{:?}", b.metadata()));
}

/// Flips bytes, mostly in the header, and sometimes cuts the file; checks that nothing panics,
/// that anything accepted is internally consistent, and that streaming agrees with `parse`.
fn corrupt_and_parse(name: &str, original: &[u8], header_end: usize, iterations: usize) {
    let mut rng = common::rng(name, &|m| eprintln!("{m}"));
    let mut accepted = 0;
    for _ in 0..iterations {
        let mut bytes = original.to_vec();
        for _ in 0..rng.random_range(1..=4) {
            let at = if rng.random_bool(0.9) {
                rng.random_range(0..header_end)
            } else {
                rng.random_range(0..bytes.len())
            };
            bytes[at] ^= rng.random_range(1..=255u8);
        }
        if rng.random_bool(0.1) {
            let n = rng.random_range(0..bytes.len());
            bytes.truncate(n);
        }
        let total = bytes.len() as u64;
        let full = GgufHeader::parse(&bytes, "fuzz.gguf");
        if let Ok(h) = &full {
            accepted += 1;
            for t in h.tensors() {
                let data = h.tensor_data(&bytes, t).unwrap();
                assert_eq!(data.len() as u64, t.n_bytes);
                assert!(t.dims.len() <= MAX_DIMS as usize && t.dims.iter().all(|&d| d > 0));
            }
        }
        let n = rng.random_range(0..=bytes.len());
        match (
            GgufHeader::parse_prefix(&bytes[..n], total, "fuzz.gguf"),
            &full,
        ) {
            (Ok(None), _) => {}
            (Ok(Some(p)), Ok(h)) => assert_same_header(&p, h),
            (Err(e), Err(f)) => assert_eq!(e.to_string(), f.to_string()),
            (p, f) => panic!("prefix {n}: {p:?} but whole file: {f:?}"),
        }
    }
    eprintln!("{name}: {accepted} of {iterations} corrupted files still parsed");
}

#[test]
fn random_corruption_of_a_built_file() {
    let built = valid().build();
    corrupt_and_parse("built", &built.bytes, built.header_end, 5000);
}

#[test]
fn random_corruption_of_a_fixture() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/tiny-llama-q4_0.gguf"
    );
    let bytes = std::fs::read(path).unwrap();
    let h = GgufHeader::parse(&bytes, path).unwrap();
    corrupt_and_parse("fixture", &bytes, h.data_offset as usize, 300);
}
