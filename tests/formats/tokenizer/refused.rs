//! Bad inputs: malformed tokenizer.json, inputs on which `tokenizers` would panic, and bad
//! GGUF tokenizer metadata, each refused with a message that names the problem.

use emberlm::format::gguf::{GgufArray, GgufValue};
use emberlm::tokenizer::Tokenizer;
use emberlm::Error;

use super::support::fixtures;
use crate::common::gguf_meta;

fn message(e: &Error) -> String {
    e.to_string()
}

#[test]
fn malformed_tokenizer_json_is_refused() {
    let e = Tokenizer::from_json(b"{ not json", None, "broken/tokenizer.json").unwrap_err();
    assert!(matches!(e, Error::Format { .. }), "{e:?}");
    assert!(message(&e).contains("broken/tokenizer.json"), "{e}");

    let e = Tokenizer::from_json(br#"{"model": {"type": "BPE", "vocab": 3}}"#, None, "t.json")
        .unwrap_err();
    assert!(
        matches!(e, Error::Format { .. }) && message(&e).contains("t.json"),
        "{e}"
    );

    let json = std::fs::read(fixtures().join("tiny-llama-spm/tokenizer.json")).unwrap();
    let e = Tokenizer::from_json(&json, Some(b"[1, 2]"), "spm").unwrap_err();
    assert!(message(&e).contains("tokenizer_config.json"), "{e}");
    let e = Tokenizer::from_json(&json, Some(br#"{"add_bos_token": "yes"}"#), "spm").unwrap_err();
    assert!(message(&e).contains("add_bos_token"), "{e}");
    let e = Tokenizer::from_json(&json, Some(br#"{"bos_token": "<nope>"}"#), "spm").unwrap_err();
    assert!(
        message(&e).contains("bos_token") && message(&e).contains("<nope>"),
        "{e}"
    );
    // AddedToken-object form is understood.
    let t = Tokenizer::from_json(
        &json,
        Some(br#"{"bos_token": {"content": "<s>"}, "eos_token": {"content": "</s>"}, "add_bos_token": false}"#),
        "spm",
    )
    .unwrap();
    assert_eq!(
        (t.bos_id(), t.eos_ids(), t.add_bos_default()),
        (Some(1), &[2][..], false)
    );
}

/// Inputs on which `tokenizers` itself panics are refused before it sees them.
#[test]
fn tokenizer_json_that_would_panic_is_refused() {
    let model = r#""model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"}"#;
    // A Precompiled normalizer whose charsmap is not a string, alone or in a Sequence.
    for normalizer in [
        r#"{"type": "Precompiled", "precompiled_charsmap": null}"#,
        r#"{"type": "Sequence", "normalizers": [{"type": "NFC"},
            {"type": "Precompiled", "precompiled_charsmap": 7}]}"#,
    ] {
        let json = format!(r#"{{"normalizer": {normalizer}, {model}}}"#);
        let e = Tokenizer::from_json(json.as_bytes(), None, "p.json").unwrap_err();
        assert!(
            matches!(&e, Error::Unsupported { what, .. } if what.contains("Precompiled")),
            "{normalizer}: {e:?}"
        );
    }
    // Behind a duplicate key: the last one counts, as in any JSON reader here.
    let json = format!(
        r#"{{"normalizer": {{"type": "Precompiled", "precompiled_charsmap": []}},
            "normalizer": null, {model}}}"#
    );
    let t = Tokenizer::from_json(json.as_bytes(), None, "dup.json").unwrap();
    assert_eq!(t.encode("a", false, Some(false)).unwrap(), [0]);
    // A template naming a special token `special_tokens` lacks; one whose ids and tokens
    // differ in number; `$B` in the single-sequence template.
    let template = |single: &str, tokens: &str| {
        format!(
            r#"{{{model}, "post_processor": {{"type": "TemplateProcessing", "single": {single},
                "pair": [], "special_tokens": {tokens}}}}}"#
        )
    };
    let cls = r#"{"SpecialToken": {"id": "[CLS]", "type_id": 0}}"#;
    for (json, needle) in [
        (template(&format!("[{cls}]"), "{}"), "[CLS]"),
        (
            template(
                &format!("[{cls}]"),
                r#"{"[CLS]": {"id": "[CLS]", "ids": [0, 0], "tokens": ["a"]}}"#,
            ),
            "[CLS]",
        ),
        (
            template(r#"[{"Sequence": {"id": "B", "type_id": 0}}]"#, "{}"),
            "$B",
        ),
    ] {
        let e = Tokenizer::from_json(json.as_bytes(), None, "t.json").unwrap_err();
        assert!(
            matches!(&e, Error::Format { message, .. } if message.contains(needle)),
            "{json}: {e:?}"
        );
    }
    // A Strip decoder cutting from the end, which panicked on tokens shorter than the cut.
    let json = format!(
        r#"{{{model}, "decoder": {{"type": "Sequence", "decoders": [
            {{"type": "Strip", "content": " ", "start": 0, "stop": 2}}]}}}}"#
    );
    let e = Tokenizer::from_json(json.as_bytes(), None, "s.json").unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
    // BPE merges whose continuation lacks the continuing_subword_prefix.
    let json = r###"{"model": {"type": "BPE", "continuing_subword_prefix": "##",
        "vocab": {"a": 0, "b": 1, "##b": 2, "a##b": 3, "ab": 4}, "merges": ["a ##b", "a b"]}}"###;
    let e = Tokenizer::from_json(json.as_bytes(), None, "b.json").unwrap_err();
    assert!(
        matches!(&e, Error::Format { message, .. } if message.contains("merge #1")),
        "{e:?}"
    );
    // A syntax error inside `decoder`.
    let json = format!(r#"{{{model}, "decoder": {{"type": "Fuse"]}}"#);
    let e = Tokenizer::from_json(json.as_bytes(), None, "d.json").unwrap_err();
    assert!(matches!(e, Error::Format { .. }), "{e:?}");
}

/// Builds the tiny GPT-2 GGUF's metadata with one change and returns the tokenizer's error.
fn gguf_error(base: &str, edit: impl FnOnce(&mut gguf_meta::Metadata)) -> Error {
    let mut meta = gguf_meta::read(&fixtures().join(base));
    edit(&mut meta);
    Tokenizer::from_gguf(&gguf_meta::header(&meta, "edited.gguf")).unwrap_err()
}

fn assert_names(e: &Error, parts: &[&str]) {
    let m = message(e);
    assert!(m.contains("edited.gguf"), "no file name in {m:?}");
    for p in parts {
        assert!(m.contains(p), "{p:?} not in {m:?}");
    }
}

#[test]
fn bad_gguf_tokenizer_metadata_is_refused() {
    let gpt2 = "tiny-gpt2-f32.gguf";
    let spm = "tiny-llama-spm-f32.gguf";
    use gguf_meta::{remove, set, strings};

    let e = gguf_error(gpt2, |m| {
        set(
            m,
            "tokenizer.ggml.tokens",
            GgufValue::Array(GgufArray::I32(vec![1, 2, 3])),
        )
    });
    assert_names(&e, &["tokenizer.ggml.tokens", "array<string>"]);

    let e = gguf_error(gpt2, |m| {
        set(m, "tokenizer.ggml.tokens", GgufValue::String("a".into()))
    });
    assert_names(&e, &["tokenizer.ggml.tokens"]);

    let e = gguf_error(gpt2, |m| {
        set(m, "tokenizer.ggml.tokens", strings::<&str>(&[]))
    });
    assert_names(&e, &["tokenizer.ggml.tokens", "empty"]);

    let e = gguf_error(gpt2, |m| remove(m, "tokenizer.ggml.tokens"));
    assert_names(&e, &["missing", "tokenizer.ggml.tokens"]);

    let e = gguf_error(gpt2, |m| {
        set(
            m,
            "tokenizer.ggml.merges",
            GgufValue::Array(GgufArray::F32(vec![0.5])),
        )
    });
    assert_names(&e, &["tokenizer.ggml.merges", "array<string>"]);

    let e = gguf_error(gpt2, |m| remove(m, "tokenizer.ggml.merges"));
    assert_names(&e, &["missing", "tokenizer.ggml.merges"]);

    let e = gguf_error(gpt2, |m| {
        set(m, "tokenizer.ggml.merges", strings(&["Ġ t", "Ġt"]))
    });
    assert_names(&e, &["tokenizer.ggml.merges", "[1]", "Ġt"]);

    let e = gguf_error(gpt2, |m| set(m, "tokenizer.ggml.merges", strings(&["q z"])));
    assert_names(&e, &["tokenizer.ggml.merges"]);

    let e = gguf_error(gpt2, |m| {
        set(
            m,
            "tokenizer.ggml.pre",
            GgufValue::String("no-such-pre".into()),
        )
    });
    assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
    assert_names(&e, &["no-such-pre", "tokenizer.ggml.pre"]);

    let e = gguf_error(gpt2, |m| {
        set(m, "tokenizer.ggml.model", GgufValue::String("t5".into()))
    });
    assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
    assert_names(&e, &["t5", "tokenizer.ggml.model"]);

    // a WordPiece vocabulary with no unknown token to fall back on
    let e = gguf_error(gpt2, |m| {
        set(m, "tokenizer.ggml.model", GgufValue::String("bert".into()))
    });
    assert_names(&e, &["WordPiece", "[UNK]"]);

    let e = gguf_error(gpt2, |m| set(m, "tokenizer.ggml.model", GgufValue::U32(2)));
    assert_names(&e, &["tokenizer.ggml.model"]);

    let e = gguf_error(gpt2, |m| remove(m, "tokenizer.ggml.model"));
    assert_names(&e, &["missing", "tokenizer.ggml.model"]);

    let e = gguf_error(gpt2, |m| {
        set(
            m,
            "tokenizer.ggml.token_type",
            GgufValue::Array(GgufArray::I32(vec![1; 5])),
        )
    });
    assert_names(&e, &["tokenizer.ggml.token_type", "5"]);

    let e = gguf_error(gpt2, |m| {
        set(m, "tokenizer.ggml.token_type", strings(&["normal"]))
    });
    assert_names(&e, &["tokenizer.ggml.token_type", "array<i32>"]);

    let e = gguf_error(gpt2, |m| {
        set(m, "tokenizer.ggml.bos_token_id", GgufValue::U32(512))
    });
    assert_names(&e, &["bos_token_id", "512"]);

    let e = gguf_error(gpt2, |m| {
        set(m, "tokenizer.ggml.add_bos_token", GgufValue::U32(1))
    });
    assert_names(&e, &["tokenizer.ggml.add_bos_token"]);

    let e = gguf_error(spm, |m| remove(m, "tokenizer.ggml.scores"));
    assert_names(&e, &["missing", "tokenizer.ggml.scores"]);

    let e = gguf_error(spm, |m| {
        set(
            m,
            "tokenizer.ggml.scores",
            GgufValue::Array(GgufArray::I32(vec![0; 600])),
        )
    });
    assert_names(&e, &["tokenizer.ggml.scores", "array<f32>"]);

    let e = gguf_error(spm, |m| {
        set(
            m,
            "tokenizer.ggml.scores",
            GgufValue::Array(GgufArray::F32(vec![0.0; 10])),
        )
    });
    assert_names(&e, &["tokenizer.ggml.scores", "10"]);
}
