//! Hugging Face folders: the fixtures load to the expected configs and tensors, and malformed
//! folders, configs and safetensors files are rejected with messages that name the problem.

#![cfg(not(target_arch = "wasm32"))]

use crate::peak_alloc;

use std::path::PathBuf;

use emberlm::config::{NormKind, RopeLayout};
use emberlm::dtype::DType;
use emberlm::format::safetensors::HfFolder;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// `(file name, bytes)` pairs, as a browser's file picker would give them.
type Files = Vec<(String, Vec<u8>)>;

fn read_files(name: &str) -> Files {
    std::fs::read_dir(fixture(name))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

#[test]
fn tiny_llama_folder_loads() {
    let folder = HfFolder::read(&fixture("tiny-llama")).unwrap();
    let w = folder.load().unwrap();
    let c = &w.config;
    assert_eq!(c.arch, emberlm::model::arch::llama::ARCH);
    assert_eq!(
        (
            c.vocab_size,
            c.hidden_size,
            c.n_layers,
            c.n_heads,
            c.n_kv_heads,
            c.head_dim
        ),
        (512, 64, 2, 4, 2, 16)
    );
    assert_eq!((c.ffn_size, c.context_length), (160, 128));
    assert_eq!(c.rope_layout, RopeLayout::RotateHalf);
    assert!(!c.tied_embeddings);
    assert_eq!(
        w.tensors.len(),
        emberlm::model::arch::expected_tensors(c).len()
    );
    let q = w.tensor("blk.1.attn_q.weight").unwrap();
    assert_eq!(
        (q.shape.as_slice(), q.dtype),
        ([64usize, 64].as_slice(), DType::F32)
    );
    assert!(folder.tokenizer_json.is_some());
}

#[test]
fn tiny_gpt2_folder_loads_with_conv1d_transposed() {
    let w = HfFolder::read(&fixture("tiny-gpt2")).unwrap();
    let w = w.load().unwrap();
    let c = &w.config;
    assert_eq!(c.arch, emberlm::model::arch::gpt2::ARCH);
    assert_eq!(c.norm, NormKind::LayerNorm);
    assert!(c.tied_embeddings && !w.tensors.contains_key("output.weight"));
    // c_attn is stored [64, 192] ([in, out]); the engine sees [out, in]
    assert_eq!(
        w.tensor("blk.0.attn_qkv.weight").unwrap().shape,
        vec![192, 64]
    );
    assert_eq!(
        w.tensor("blk.0.ffn_down.weight").unwrap().shape,
        vec![64, 256]
    );
    assert_eq!(
        w.tensor("position_embd.weight").unwrap().shape,
        vec![128, 64]
    );
}

#[test]
fn every_fixture_folder_loads() {
    for name in [
        "tiny-gpt2",
        "tiny-llama",
        "tiny-llama-256",
        "tiny-llama-spm",
    ] {
        let folder = HfFolder::from_files(name, read_files(name)).unwrap();
        let w = folder.load().unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(w.weight_bytes() > 0);
        assert_eq!(w.tally()["F32"].tensors, w.tensors.len());
    }
}

/// A safetensors file from `(name, dtype, shape, bytes)` entries, written by hand so that
/// tests can also write it wrong.
fn safetensors_bytes(entries: &[(&str, &str, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in entries {
        header.insert(
            name.to_string(),
            serde_json::json!({
                "dtype": dtype, "shape": shape, "data_offsets": [data.len(), data.len() + bytes.len()]
            }),
        );
        data.extend_from_slice(bytes);
    }
    let json = serde_json::to_vec(&header).unwrap();
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&json);
    out.extend_from_slice(&data);
    out
}

fn with_replaced(name: &str, file: &str, bytes: Vec<u8>) -> Files {
    let mut files: Files = read_files(name)
        .into_iter()
        .filter(|(n, _)| n != file)
        .collect();
    files.push((file.to_string(), bytes));
    files
}

fn load_err(files: Files) -> String {
    match HfFolder::from_files("tiny-llama", files).and_then(|f| f.load().map(|_| ())) {
        Ok(()) => panic!("malformed folder loaded"),
        Err(e) => e.to_string(),
    }
}

/// A layer count from config.json is checked tensor by tensor, up to the first one missing:
/// listing 200 000 layers' tensors first took one allocation of 100 MB (at the limit of 2^24
/// layers, 14 GB).
#[test]
fn huge_layer_count_stops_at_the_first_missing_layer() {
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture("tiny-llama/config.json")).unwrap()).unwrap();
    config["num_hidden_layers"] = 200_000.into();
    let files = with_replaced("tiny-llama", "config.json", config.to_string().into_bytes());
    let (err, peak) = peak_alloc::with_peak(|| load_err(files));
    assert!(
        err.contains("missing tensor `blk.2.attn_norm.weight`"),
        "{err}"
    );
    assert!(peak < 16 << 20, "allocated {peak} bytes at once");
}

#[test]
fn malformed_folders_are_rejected_with_reasons() {
    let good = std::fs::read(fixture("tiny-llama/model.safetensors")).unwrap();
    let header_len = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let config = std::fs::read_to_string(fixture("tiny-llama/config.json")).unwrap();
    let mut cases: Vec<(&str, Files, &str)> = Vec::new();

    let st = |b: Vec<u8>| with_replaced("tiny-llama", "model.safetensors", b);
    let cfg = |s: String| with_replaced("tiny-llama", "config.json", s.into_bytes());
    cases.push(("empty safetensors", st(Vec::new()), "invalid safetensors"));
    cases.push((
        "truncated in header",
        st(good[..header_len / 2].to_vec()),
        "invalid safetensors",
    ));
    cases.push((
        "truncated in data",
        st(good[..good.len() - 100].to_vec()),
        "invalid safetensors",
    ));
    let mut huge = good.clone();
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    cases.push(("header length past EOF", st(huge), "invalid safetensors"));
    let mut garbage = good.clone();
    garbage[8] = b'!';
    cases.push(("header not JSON", st(garbage), "invalid safetensors"));
    let f32s = |n: usize| vec![0u8; n * 4];
    cases.push((
        "unsupported dtype",
        st(safetensors_bytes(&[(
            "model.embed_tokens.weight",
            "I64",
            vec![512, 64],
            vec![0; 512 * 64 * 8],
        )])),
        "unsupported tensor type",
    ));
    cases.push((
        "wrong shape for config",
        st(safetensors_bytes(&[(
            "model.embed_tokens.weight",
            "F32",
            vec![511, 64],
            f32s(511 * 64),
        )])),
        "has shape [511, 64]",
    ));
    cases.push((
        "missing tensors",
        st(safetensors_bytes(&[(
            "model.embed_tokens.weight",
            "F32",
            vec![512, 64],
            f32s(512 * 64),
        )])),
        "missing tensor `blk.0.attn_norm.weight`",
    ));
    cases.push((
        "offsets past the data",
        st({
            let mut b = safetensors_bytes(&[("x", "F32", vec![4], f32s(4))]);
            b.truncate(b.len() - 4);
            b
        }),
        "invalid safetensors",
    ));
    cases.push((
        "config not JSON",
        cfg("{".into()),
        "config.json: invalid JSON",
    ));
    cases.push((
        "config missing field",
        cfg(config.replace("\"hidden_size\"", "\"hidden_sizes\"")),
        "missing required field `hidden_size`",
    ));
    cases.push((
        "config bad GQA",
        cfg(config.replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3")),
        "n_kv_heads = 3",
    ));
    cases.push((
        "config unknown model type",
        cfg(config.replace("\"llama\"", "\"mamba\"")),
        "unsupported model_type `mamba`",
    ));
    cases.push((
        "config absurd size",
        cfg(config.replace(
            "\"num_hidden_layers\": 2",
            "\"num_hidden_layers\": 99999999999",
        )),
        "n_layers",
    ));
    cases.push((
        "eos outside vocab",
        cfg(config.replace("\"eos_token_id\": 0", "\"eos_token_id\": 9999")),
        "outside the vocabulary",
    ));
    let mut no_config = read_files("tiny-llama");
    no_config.retain(|(n, _)| n != "config.json");
    cases.push(("no config.json", no_config, "no config.json"));
    let mut no_weights = read_files("tiny-llama");
    no_weights.retain(|(n, _)| n != "model.safetensors");
    cases.push(("no weights", no_weights, "`model.safetensors` is missing"));
    let index = |json: &str| {
        let mut f = read_files("tiny-llama");
        f.push((
            "model.safetensors.index.json".into(),
            json.as_bytes().to_vec(),
        ));
        f
    };
    cases.push((
        "index names a missing shard",
        index(r#"{"weight_map": {"a": "model-00002-of-00002.safetensors"}}"#),
        "`model-00002-of-00002.safetensors` is missing",
    ));
    cases.push((
        "index escapes the folder",
        index(r#"{"weight_map": {"a": "../../secret.safetensors"}}"#),
        "shard name",
    ));
    cases.push(("index not JSON", index("[1, 2"), "invalid JSON"));
    cases.push((
        "index lists nothing",
        index(r#"{"weight_map": {}}"#),
        "lists no tensors",
    ));
    let shard_a = safetensors_bytes(&[("model.norm.weight", "F32", vec![64], f32s(64))]);
    let mut dup =
        index(r#"{"weight_map": {"model.norm.weight": "a.safetensors", "x": "b.safetensors"}}"#);
    dup.push(("a.safetensors".into(), shard_a.clone()));
    dup.push(("b.safetensors".into(), shard_a));
    cases.push(("tensor in two shards", dup, "appears more than once"));

    assert!(cases.len() >= 20);
    for (what, files, needle) in cases {
        let err = load_err(files);
        assert!(err.contains(needle), "{what}: `{err}` lacks `{needle}`");
    }
}
