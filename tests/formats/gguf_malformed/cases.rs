//! Malformed files, each broken one way, with the words its refusal must contain.

use emberlm::dtype::DType;
use emberlm::format::gguf::{
    MAX_ARRAY_DEPTH, MAX_ARRAY_LEN, MAX_DIMS, MAX_METADATA_COUNT, MAX_NAME_LEN, MAX_STRING_LEN,
    MAX_TENSOR_COUNT,
};

use super::writer::{
    cut, nested, raw_tensor, s, tensor, valid, with_kv, with_tensor, Gguf, Tensor, T_ARRAY, T_BOOL,
    T_F32, T_STRING, V,
};

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    Format,
    Unsupported,
}

pub struct Case {
    pub name: &'static str,
    pub bytes: Vec<u8>,
    pub kind: Kind,
    pub expect: Vec<String>,
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

pub fn cases() -> Vec<Case> {
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
