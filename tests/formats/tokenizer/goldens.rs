//! Golden prompt tokens from every source, BOS defaults, special ids and the vocabulary,
//! control tokens in text, and tokenizers that cross threads.

use emberlm::tokenizer::Tokenizer;
use emberlm::Error;

use super::support::{
    fixtures, gemma3, gguf_fixtures, gguf_tokenizer, golden, ids, json_tokenizer, smollm2, Case,
    EXTRA_TEXTS, JSON_TWINS,
};

fn check_goldens(name: &str, tok: &Tokenizer, cases: &[Case]) {
    assert!(!cases.is_empty());
    for c in cases {
        let got = tok
            .encode(&c.prompt, c.special, Some(c.add_bos))
            .unwrap_or_else(|e| panic!("{name}: {:?}: {e}", c.prompt));
        assert_eq!(got, c.tokens, "{name}: prompt {:?}", c.prompt);
    }
}

#[test]
fn golden_prompt_tokens_from_tokenizer_json() {
    for (dir, gold) in JSON_TWINS {
        check_goldens(dir, &json_tokenizer(dir), &golden(gold));
    }
}

#[test]
fn golden_prompt_tokens_from_gguf_metadata() {
    for (path, stem) in gguf_fixtures() {
        check_goldens(&stem, &gguf_tokenizer(&path), &golden(&stem));
    }
}

#[test]
fn golden_prompt_tokens_gemma3() {
    let Some(tok) = gemma3() else { return };
    let cases = golden("gemma-3-270m-q4_k_m");
    assert!(
        cases
            .iter()
            .any(|c| c.special && c.prompt.contains("<start_of_turn>")),
        "the chat-formatted prompt is among the goldens"
    );
    assert!(
        cases.iter().any(|c| c.tokens.len() > 512),
        "a prompt past the window"
    );
    check_goldens("Gemma 3", tok, &cases);
}

#[test]
fn golden_prompt_tokens_smollm2() {
    let Some(tok) = smollm2() else { return };
    let cases = golden("smollm2-135m-q4_1");
    assert!(
        cases
            .iter()
            .any(|c| c.special && c.prompt.contains("<|im_start|>")),
        "the chat-formatted prompt is among the goldens"
    );
    check_goldens("SmolLM2", tok, &cases);
}

#[test]
fn add_bos_default_follows_the_model() {
    let spm = json_tokenizer("tiny-llama-spm");
    assert!(spm.add_bos_default());
    let spm_gguf = gguf_tokenizer(&fixtures().join("tiny-llama-spm-f32.gguf"));
    assert!(spm_gguf.add_bos_default());
    for c in golden("tiny-llama-spm-f32") {
        assert_eq!(spm.encode(&c.prompt, false, None).unwrap(), c.tokens);
        assert_eq!(spm_gguf.encode(&c.prompt, false, None).unwrap(), c.tokens);
        assert_eq!(
            spm_gguf.encode(&c.prompt, false, Some(false)).unwrap(),
            c.tokens[1..]
        );
    }
    let gpt2 = gguf_tokenizer(&fixtures().join("tiny-gpt2-f32.gguf"));
    assert!(!gpt2.add_bos_default());
    assert_eq!(gpt2.encode("The", false, Some(true)).unwrap()[0], 0);
    assert_ne!(gpt2.encode("The", false, None).unwrap()[0], 0);
}

#[test]
fn special_ids_and_vocabulary() {
    let gpt2 = gguf_tokenizer(&fixtures().join("tiny-gpt2-f32.gguf"));
    assert_eq!(gpt2.vocab_size(), 512);
    assert_eq!(gpt2.bos_id(), Some(0));
    assert_eq!(gpt2.eos_ids(), &[0]);
    assert_eq!(gpt2.token_to_id("<|endoftext|>"), Some(0));
    assert_eq!(gpt2.id_to_token(0).as_deref(), Some("<|endoftext|>"));
    assert_eq!(gpt2.id_to_token(512), None);

    let spm = gguf_tokenizer(&fixtures().join("tiny-llama-spm-f32.gguf"));
    assert_eq!(spm.vocab_size(), 600);
    assert_eq!(
        (spm.bos_id(), spm.eos_ids(), spm.unk_id()),
        (Some(1), &[2][..], Some(0))
    );
    assert_eq!(spm.id_to_token(3).as_deref(), Some("<0x00>"));
    assert!(spm.is_special(1) && spm.is_special(2) && !spm.is_special(3));

    // The HF folder without tokenizer_config.json: no BOS (the post-processor adds none); EOS
    // from the end-of-turn token it has.
    let json = json_tokenizer("tiny-gpt2");
    assert_eq!((json.bos_id(), json.eos_ids()), (None, &[0][..]));
    assert!(matches!(
        json.encode("x", false, Some(true)),
        Err(Error::InvalidArgument {
            name: "add_bos",
            ..
        })
    ));
    let json_spm = json_tokenizer("tiny-llama-spm");
    assert_eq!(
        (json_spm.bos_id(), json_spm.eos_ids(), json_spm.unk_id()),
        (Some(1), &[2][..], Some(0))
    );

    let Some(smol) = smollm2() else { return };
    assert_eq!(smol.vocab_size(), 49152);
    assert_eq!(smol.bos_id(), Some(1));
    // EOS (<|im_end|>) first, then <|endoftext|>, which also ends generation.
    assert_eq!(smol.eos_ids(), &[2, 0]);
    assert_eq!(smol.pad_id(), Some(2));
    assert_eq!(smol.token_to_id("<|im_start|>"), Some(1));
    assert!(!smol.add_bos_default());
}

// ---------------------------------------------------------------------------------------------
// Special tokens in text

#[test]
fn control_tokens_are_parsed_only_when_asked() {
    let gpt2 = gguf_tokenizer(&fixtures().join("tiny-gpt2-f32.gguf"));
    let json = json_tokenizer("tiny-gpt2");
    for tok in [&gpt2, &json] {
        assert_eq!(tok.encode("<|endoftext|>", true, Some(false)).unwrap(), [0]);
        let plain = tok.encode("<|endoftext|>", false, Some(false)).unwrap();
        assert!(plain.len() > 1 && !plain.contains(&0), "{plain:?}");
        assert_eq!(tok.decode(&plain, true).unwrap(), "<|endoftext|>");
        let mixed = tok.encode("a<|endoftext|>b", true, Some(false)).unwrap();
        assert!(mixed.contains(&0));
        assert_eq!(tok.decode(&mixed, false).unwrap(), "a<|endoftext|>b");
        assert_eq!(tok.decode(&mixed, true).unwrap(), "ab");
    }

    for spm in [
        gguf_tokenizer(&fixtures().join("tiny-llama-spm-f32.gguf")),
        json_tokenizer("tiny-llama-spm"),
    ] {
        assert_eq!(spm.encode("<s>", true, Some(false)).unwrap(), [1]);
        let plain = spm.encode("</s>", false, Some(false)).unwrap();
        assert!(!plain.contains(&2), "{plain:?}");
        assert_eq!(spm.decode(&plain, false).unwrap(), "</s>");
    }

    let Some(smol) = smollm2() else { return };
    let chat = golden("smollm2-135m-q4_1")
        .into_iter()
        .find(|c| c.special)
        .unwrap();
    let plain = smol.encode(&chat.prompt, false, Some(false)).unwrap();
    assert!(!plain.contains(&1) && !plain.contains(&2), "{plain:?}");
    assert!(plain.len() > chat.tokens.len());
    assert_eq!(smol.decode(&plain, false).unwrap(), chat.prompt);
    assert_eq!(
        smol.decode(&chat.tokens, true).unwrap(),
        "user\nWhat is the boiling point of water at sea level?\nassistant\n"
    );
}

#[test]
fn tokenizer_and_template_can_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Tokenizer>();
    send_sync::<emberlm::chat::ChatTemplate>();
}

/// The tiny BERT's uncased WordPiece, from its GGUF twins' metadata (llama.cpp's `▁word` /
/// `piece` spelling read back) and from its tokenizer.json: the golden ids of every golden text
/// (`[CLS] text [SEP]`), and the same ids from both on the extra texts.
#[test]
fn bert_wordpiece_from_gguf_and_tokenizer_json_agree_with_the_goldens() {
    let golden: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("golden/tiny-bert.golden.json")).unwrap(),
    )
    .unwrap();
    let json = json_tokenizer("tiny-bert");
    let forms = [
        ("tiny-bert/tokenizer.json", json),
        (
            "tiny-bert-f32.gguf",
            gguf_tokenizer(&fixtures().join("tiny-bert-f32.gguf")),
        ),
        (
            "tiny-bert-q8_0.gguf",
            gguf_tokenizer(&fixtures().join("tiny-bert-q8_0.gguf")),
        ),
    ];
    for r in golden["results"].as_array().unwrap() {
        let text = r["text"].as_str().unwrap();
        let want = ids(&r["ids"]);
        for (name, tok) in &forms {
            assert_eq!(tok.encode_whole(text).unwrap(), want, "{name}: {text:?}");
        }
    }
    for &text in EXTRA_TEXTS {
        let want = forms[0].1.encode_whole(text).unwrap();
        for (name, tok) in &forms[1..] {
            assert_eq!(tok.encode_whole(text).unwrap(), want, "{name}: {text:?}");
        }
        // uncased, accents stripped: decoding gives the normalised words back
        let body = &want[1..want.len() - 1];
        let back = forms[1].1.decode(body, true).unwrap();
        assert!(
            back.chars().all(|c| !c.is_uppercase()),
            "{text:?} decoded as {back:?}"
        );
    }
}

/// `tokenizer.ggml.add_eos_token`: false leaves BERT's closing `[SEP]` out of a whole input;
/// true on another vocabulary closes it with EOS (an embedding model's last token).
#[test]
fn add_eos_token_says_whether_a_whole_input_is_closed() {
    use crate::common::gguf_meta;
    use emberlm::format::gguf::GgufValue;
    let edited = |file: &str, add: bool| {
        let mut metadata = gguf_meta::read(&fixtures().join(file));
        gguf_meta::set(
            &mut metadata,
            "tokenizer.ggml.add_eos_token",
            GgufValue::Bool(add),
        );
        Tokenizer::from_gguf(&gguf_meta::header(&metadata, file)).unwrap()
    };
    let bert = gguf_tokenizer(&fixtures().join("tiny-bert-f32.gguf"));
    let open = edited("tiny-bert-f32.gguf", false);
    let text = "permission is granted";
    let closed = bert.encode_whole(text).unwrap();
    assert_eq!(closed.last().copied(), bert.sep_id());
    assert_eq!(open.encode_whole(text).unwrap(), closed[..closed.len() - 1]);
    let gpt2 = edited("tiny-gpt2-f32.gguf", true);
    let ids = gpt2.encode_whole(text).unwrap();
    assert_eq!(ids.last().copied(), gpt2.eos_ids().first().copied());
    assert_eq!(
        ids[..ids.len() - 1],
        gpt2.encode(text, false, None).unwrap()
    );
}
