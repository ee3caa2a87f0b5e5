//! `emberlm embed`: one JSON line per text (`--text`, then the lines of `--file`) with the
//! vector the library's `Session::embed` gives; bad flags and no text are usage errors.

#![cfg(not(target_arch = "wasm32"))]

use crate::cli_run::emberlm;

use emberlm::loader::ModelFiles;
use emberlm::session::{EmbedOptions, Pooling, Session};
use serde_json::Value;

const MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/tiny-llama-f32.gguf"
);

#[test]
fn embed_prints_the_librarys_vectors_one_line_per_text() {
    let file = std::env::temp_dir().join(format!("emberlm-embed-{}.txt", std::process::id()));
    std::fs::write(&file, "THE SOFTWARE\n\n  \nCopyright holders\n").unwrap();
    let (code, out, err) = emberlm(&[
        "embed",
        "--device",
        "cpu",
        "--model",
        MODEL,
        "--text",
        "Permission is hereby granted",
        "--file",
        file.to_str().unwrap(),
        "--pooling",
        "last",
        "--no-normalize",
    ]);
    std::fs::remove_file(&file).ok();
    assert_eq!(code, 0, "{err}");
    let texts: Vec<String> = [
        "Permission is hereby granted",
        "THE SOFTWARE",
        "Copyright holders",
    ]
    .map(String::from)
    .to_vec();
    let files = ModelFiles::open(std::path::Path::new(MODEL)).unwrap();
    let mut s = Session::new_cpu(&files, None).unwrap();
    let options = EmbedOptions {
        pooling: Some(Pooling::Last),
        normalize: false,
    };
    let want = pollster::block_on(s.embed(&texts, &options)).unwrap();
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{out}");
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["index"].as_u64(), Some(i as u64));
        assert_eq!(line["tokens"].as_u64(), Some(want.tokens[i] as u64));
        let got: Vec<f32> = serde_json::from_value(line["embedding"].clone()).unwrap();
        assert_eq!(got, want.vectors[i], "text {i}");
    }
}

#[test]
fn bad_embed_flags_are_usage_errors() {
    let (code, _, err) = emberlm(&["embed", "--model", MODEL, "--pooling", "max", "--text", "a"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--pooling") && err.contains("`max` is not a pooling"),
        "{err}"
    );
    let (code, _, err) = emberlm(&["embed", "--model", MODEL]);
    assert_eq!(code, 2);
    assert!(err.contains("nothing to embed"), "{err}");
}
