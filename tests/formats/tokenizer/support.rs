//! The fixtures: golden prompt cases, the tokenizers under test (tokenizer.json folders, tiny
//! GGUFs, SmolLM2 when present) and the extra texts for round trips and streaming.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use emberlm::format::gguf::GgufHeader;
use emberlm::tokenizer::Tokenizer;

use crate::common::require;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn fixtures() -> PathBuf {
    root().join("tests/fixtures")
}

/// One golden prompt: what to encode, how, and the ids a correct tokenizer gives; `generated`
/// are token ids the models produced after it (random weights: lots of odd bytes).
pub struct Case {
    pub prompt: String,
    pub special: bool,
    pub add_bos: bool,
    pub tokens: Vec<u32>,
    pub generated: Vec<Vec<u32>>,
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .map(|a| a.iter().map(|x| x.as_u64().unwrap() as u32).collect())
        .unwrap_or_default()
}

pub fn golden(name: &str) -> Vec<Case> {
    let path = fixtures().join(format!("golden/{name}.golden.json"));
    let text = std::fs::read_to_string(&path).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| Case {
            prompt: r["prompt"].as_str().unwrap().to_string(),
            special: r["special"].as_bool().unwrap(),
            add_bos: r["add_bos"].as_bool().unwrap(),
            tokens: ids(&r["prompt_tokens"]),
            generated: vec![
                ids(&r["f64_greedy_tokens"]),
                ids(&r["llamacpp_greedy_tokens"]),
            ],
        })
        .collect()
}

/// Hugging Face folders and the golden file of their f32 GGUF twin.
pub const JSON_TWINS: [(&str, &str); 4] = [
    ("tiny-gpt2", "tiny-gpt2-f32"),
    ("tiny-llama", "tiny-llama-f32"),
    ("tiny-llama-256", "tiny-llama-256-f32"),
    ("tiny-llama-spm", "tiny-llama-spm-f32"),
];

pub fn json_tokenizer(dir: &str) -> Tokenizer {
    let dir_path = fixtures().join(dir);
    let json = std::fs::read(dir_path.join("tokenizer.json")).unwrap();
    let config = std::fs::read(dir_path.join("tokenizer_config.json")).ok();
    Tokenizer::from_json(&json, config.as_deref(), &format!("{dir}/tokenizer.json"))
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
}

fn gguf_header(path: &Path) -> GgufHeader {
    let bytes = std::fs::read(path).unwrap();
    GgufHeader::parse(&bytes, &path.display().to_string()).unwrap()
}

/// Every tiny GGUF fixture of a decoder with its golden-file name (the file stem). The
/// encoders' uncased WordPiece (`tiny-bert-*`) has goldens of its own (see
/// `goldens::bert_wordpiece_*`).
pub fn gguf_fixtures() -> Vec<(PathBuf, String)> {
    let mut out: Vec<(PathBuf, String)> = std::fs::read_dir(fixtures())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .filter(|p| {
            !p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("tiny-bert"))
        })
        .map(|p| {
            let stem = p.file_stem().unwrap().to_string_lossy().to_string();
            (p, stem)
        })
        .collect();
    out.sort();
    assert!(
        out.len() >= 11,
        "expected the tiny GGUF fixtures, found {out:?}"
    );
    out
}

pub fn gguf_tokenizer(path: &Path) -> Tokenizer {
    Tokenizer::from_gguf(&gguf_header(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// SmolLM2's tokenizer, loaded once; `None` (with the reason printed) when the model is absent
/// (a failure in CI, see `require::smollm2`).
pub fn smollm2() -> Option<&'static Tokenizer> {
    static CELL: OnceLock<Option<Tokenizer>> = OnceLock::new();
    CELL.get_or_init(|| require::smollm2().map(|path| gguf_tokenizer(&path)))
        .as_ref()
}

/// Gemma 3's tokenizer (262,144 SentencePiece pieces with byte fallback), loaded once; `None`
/// when the model is absent, as [`smollm2`].
pub fn gemma3() -> Option<&'static Tokenizer> {
    static CELL: OnceLock<Option<Tokenizer>> = OnceLock::new();
    CELL.get_or_init(|| require::gemma3().map(|path| gguf_tokenizer(&path)))
        .as_ref()
}

/// Calls `f` with every tokenizer under test and the golden cases that apply to it: the
/// tokenizer.json folders, the tiny GGUFs and SmolLM2 when present.
pub fn for_each_tokenizer(mut f: impl FnMut(&str, &Tokenizer, &[Case])) {
    for (dir, gold) in JSON_TWINS {
        f(
            &format!("{dir}/tokenizer.json"),
            &json_tokenizer(dir),
            &golden(gold),
        );
    }
    for (path, stem) in gguf_fixtures() {
        f(
            &format!("{stem}.gguf"),
            &gguf_tokenizer(&path),
            &golden(&stem),
        );
    }
    if let Some(smol) = smollm2() {
        f("SmolLM2", smol, &golden("smollm2-135m-q4_1"));
    }
    if let Some(gemma) = gemma3() {
        f("Gemma 3", gemma, &golden("gemma-3-270m-q4_k_m"));
    }
}

/// Texts beyond the golden prompts for round trips and streaming.
pub const EXTRA_TEXTS: &[&str] = &[
    "Ünïcödé and emoji 🚀 survive the tokenizer",
    "family 👨‍👩‍👧 flags 🇫🇷🇯🇵 and CJK 日本語のテキスト",
    "tabs\tand\nnew lines\n\n  indented   spaces  ",
    "numbers 1234567 and 3.14159, 2004",
    "it's we're THEY'LL I'd",
    "<|im_start|> <s> </s> <|endoftext|> written as text",
    "accents: café naïve résumé — “quotes” ‘single’ …",
    "a",
    " ",
    "",
];
