//! The GGUF pre-tokenizer variants on a made-up byte-level vocabulary, and SentencePiece
//! without the space prefix.

use emberlm::format::gguf::{GgufArray, GgufValue};
use emberlm::tokenizer::Tokenizer;

use super::support::{fixtures, EXTRA_TEXTS};
use crate::common::gguf_meta;

/// GPT-2's byte-to-character table: printable Latin-1 bytes stand for themselves, the others
/// take the characters from U+0100 on.
fn byte_chars() -> Vec<char> {
    let printable = |b: u32| {
        (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    let mut next = 0x100;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap()
            } else {
                let c = char::from_u32(next).unwrap();
                next += 1;
                c
            }
        })
        .collect()
}

/// A byte-level vocabulary with digit merges (`1234`), a contraction merge (`'S`) and a word
/// without merges (`xyz`), which only Llama 3's `ignore_merges` finds whole.
fn synthetic_bpe(pre: Option<&str>) -> gguf_meta::Metadata {
    let mut tokens = vec!["<|endoftext|>".to_string()];
    tokens.extend(byte_chars().iter().map(|c| c.to_string()));
    tokens.extend(["12", "123", "1234", "'S", "xyz"].map(String::from));
    let mut types = vec![3];
    types.resize(tokens.len(), 1);
    let mut meta = vec![
        (
            "general.architecture".to_string(),
            GgufValue::String("llama".into()),
        ),
        (
            "tokenizer.ggml.model".to_string(),
            GgufValue::String("gpt2".into()),
        ),
        (
            "tokenizer.ggml.tokens".to_string(),
            gguf_meta::strings(&tokens),
        ),
        (
            "tokenizer.ggml.token_type".to_string(),
            GgufValue::Array(GgufArray::I32(types)),
        ),
        (
            "tokenizer.ggml.merges".to_string(),
            gguf_meta::strings(&["1 2", "12 3", "123 4", "' S"]),
        ),
        ("tokenizer.ggml.eos_token_id".to_string(), GgufValue::U32(0)),
    ];
    if let Some(pre) = pre {
        meta.push((
            "tokenizer.ggml.pre".to_string(),
            GgufValue::String(pre.into()),
        ));
    }
    meta
}

#[test]
fn gguf_pre_tokenizers_follow_llama_cpp() {
    // Token counts for "1234", "'S", "xyz" under each pre-tokenizer's regexes.
    let expected: [(Option<&str>, [usize; 3]); 6] = [
        (Some("gpt-2"), [1, 2, 3]), // ` ?\p{N}+` keeps digits together; `'s` is lower case only
        (Some("smollm"), [4, 2, 3]), // `\p{N}` first: every digit alone
        (Some("qwen2"), [4, 1, 3]), // single digits; case-insensitive contractions
        (Some("llama-bpe"), [2, 1, 1]), // `\p{N}{1,3}`; whole-word lookup before merges
        (Some("default"), [2, 2, 3]), // punctuation runs apart; digits in threes
        (None, [2, 2, 3]),          // no `pre`: llama.cpp's default
    ];
    for (pre, counts) in expected {
        let tok = Tokenizer::from_gguf(&gguf_meta::header(&synthetic_bpe(pre), "synthetic.gguf"))
            .unwrap_or_else(|e| panic!("{pre:?}: {e}"));
        for (text, want) in ["1234", "'S", "xyz"].into_iter().zip(counts) {
            let ids = tok.encode(text, false, Some(false)).unwrap();
            assert_eq!(ids.len(), want, "pre {pre:?}, text {text:?}: {ids:?}");
            assert_eq!(tok.decode(&ids, false).unwrap(), text);
        }
    }
}

#[test]
fn gguf_spm_without_space_prefix() {
    let mut meta = gguf_meta::read(&fixtures().join("tiny-llama-spm-f32.gguf"));
    let with = Tokenizer::from_gguf(&gguf_meta::header(&meta, "spm.gguf")).unwrap();
    gguf_meta::set(
        &mut meta,
        "tokenizer.ggml.add_space_prefix",
        GgufValue::Bool(false),
    );
    let without = Tokenizer::from_gguf(&gguf_meta::header(&meta, "spm-nospace.gguf")).unwrap();
    let a = with.encode("The software", false, Some(false)).unwrap();
    let b = without.encode("The software", false, Some(false)).unwrap();
    assert!(with.id_to_token(a[0]).unwrap().starts_with('\u{2581}'));
    assert!(!without.id_to_token(b[0]).unwrap().starts_with('\u{2581}'));
    for text in EXTRA_TEXTS {
        let ids = without.encode(text, false, Some(false)).unwrap();
        assert_eq!(without.decode(&ids, false).unwrap(), *text);
    }
}
