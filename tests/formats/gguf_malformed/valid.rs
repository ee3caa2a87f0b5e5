//! Valid files: the writer's output parses back, version 2 with a custom alignment and deep
//! arrays, and the typed getters check types and ranges.

use emberlm::dtype::DType;
use emberlm::format::gguf::{GgufArray, GgufHeader, GgufValue, MAX_ARRAY_DEPTH};
use emberlm::Error;

use super::writer::{nested, s, valid, Gguf, V};

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
