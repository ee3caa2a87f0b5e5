//! A GGUF writer: metadata values of every type, tensors, and files built byte by byte with
//! the offset of each part, to be broken one way at a time.

use emberlm::dtype::DType;

pub const T_U8: u32 = 0;
const T_I8: u32 = 1;
const T_U16: u32 = 2;
const T_I16: u32 = 3;
const T_U32: u32 = 4;
const T_I32: u32 = 5;
pub const T_F32: u32 = 6;
pub const T_BOOL: u32 = 7;
pub const T_STRING: u32 = 8;
pub const T_ARRAY: u32 = 9;
const T_U64: u32 = 10;
const T_I64: u32 = 11;
const T_F64: u32 = 12;

/// A metadata value to write. `Bool` takes the raw byte, `Arr` an element type and elements
/// (written without their type tags), `Raw` any type id with any payload.
#[derive(Clone, Debug)]
pub enum V {
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

pub fn s(text: &str) -> V {
    V::Str(text.as_bytes().to_vec())
}

fn put_str(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend((bytes.len() as u64).to_le_bytes());
    out.extend(bytes);
}

impl V {
    pub fn ty(&self) -> u32 {
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

    pub fn encode(&self, out: &mut Vec<u8>) {
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
pub struct Tensor {
    pub name: Vec<u8>,
    pub dims: Vec<u64>,
    pub ty: u32,
    /// Bytes laid out in the data section for this tensor.
    pub n_bytes: u64,
    /// Written instead of the offset the layout gives.
    pub offset: Option<u64>,
}

pub fn tensor(name: &str, dims: &[u64], dtype: DType) -> Tensor {
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
pub fn raw_tensor(name: &[u8], dims: &[u64], ty: u32) -> Tensor {
    Tensor {
        name: name.to_vec(),
        dims: dims.to_vec(),
        ty,
        n_bytes: 4,
        offset: None,
    }
}

#[derive(Clone, Debug)]
pub struct Gguf {
    pub magic: [u8; 4],
    pub version: u32,
    pub n_tensors: Option<u64>,
    pub n_kv: Option<u64>,
    pub kvs: Vec<(Vec<u8>, V)>,
    pub tensors: Vec<Tensor>,
    /// Alignment used to lay out the data section (set `general.alignment` separately).
    pub alignment: u64,
}

/// Written bytes and where each part starts.
pub struct Built {
    pub bytes: Vec<u8>,
    pub key_at: Vec<usize>,
    pub value_at: Vec<usize>,
    pub info_at: Vec<usize>,
    pub header_end: usize,
    pub data_offset: usize,
}

impl Gguf {
    pub fn new() -> Self {
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

    pub fn kv(self, key: &str, v: V) -> Self {
        self.kv_raw(key.as_bytes(), v)
    }

    pub fn kv_raw(mut self, key: &[u8], v: V) -> Self {
        self.kvs.push((key.to_vec(), v));
        self
    }

    pub fn tensor(mut self, t: Tensor) -> Self {
        self.tensors.push(t);
        self
    }

    pub fn build(&self) -> Built {
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

    pub fn bytes(&self) -> Vec<u8> {
        self.build().bytes
    }
}

/// A file using every value type, nested arrays and tensors of several types, whose last
/// tensor ends at the end of the file (so every shorter prefix is truncated).
pub fn valid() -> Gguf {
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
pub fn with_kv(key: &str, v: V) -> Vec<u8> {
    Gguf::new()
        .kv("general.architecture", s("llama"))
        .kv(key, v)
        .bytes()
}

/// The smallest file with one tensor.
pub fn with_tensor(t: Tensor) -> Vec<u8> {
    Gguf::new()
        .kv("general.architecture", s("llama"))
        .tensor(t)
        .bytes()
}

/// `n` levels of arrays, the innermost holding one u8.
pub fn nested(n: usize) -> V {
    let mut v = V::Arr(T_U8, vec![V::U8(7)]);
    for _ in 1..n {
        v = V::Arr(T_ARRAY, vec![v]);
    }
    v
}

pub fn cut(bytes: &[u8], n: usize) -> Vec<u8> {
    bytes[..n].to_vec()
}
