//! Sampling parameters read from JSON generation options (`GenerateOptions::from_json`, then
//! the range checks): both spellings of every field, refusals with reasons, and no panic on any
//! input.

use std::collections::BTreeMap;

use emberlm::sampling::SamplingParams;
use emberlm::session::GenerateOptions;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use super::validation::invalid_name;

/// The sampling parameters of an options document, range-checked.
fn from_json(json: &str) -> emberlm::Result<SamplingParams> {
    let options = GenerateOptions::from_json(json)?;
    options.validate()?;
    Ok(options.sampling)
}

fn parse(json: &str) -> SamplingParams {
    match from_json(json) {
        Ok(p) => p,
        Err(e) => panic!("from_json({json}): {e}"),
    }
}

#[test]
fn from_json_accepts_snake_and_camel_case() {
    let want = SamplingParams {
        temperature: 0.7,
        top_k: 40,
        top_p: 0.9,
        min_p: 0.05,
        typical_p: 0.95,
        repetition_penalty: 1.1,
        presence_penalty: 0.5,
        frequency_penalty: -0.5,
        penalty_last_n: 64,
        logit_bias: BTreeMap::from([(42, -5.0), (7, 2.5)]),
        seed: Some(1234),
        max_new_tokens: 100,
        stop: vec!["\n\n".into(), "User:".into()],
        stop_token_ids: vec![2, 3],
        num_beams: 4,
        length_penalty: 0.8,
        early_stopping: true,
        num_return_sequences: 2,
        eos_token_id: vec![5],
        ignore_eos: true,
    };
    let snake = r#"{
        "temperature": 0.7, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "typical_p": 0.95,
        "repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": -0.5,
        "penalty_last_n": 64, "logit_bias": {"42": -5.0, "7": 2.5}, "seed": 1234,
        "max_new_tokens": 100, "stop": ["\n\n", "User:"], "stop_token_ids": [2, 3],
        "num_beams": 4, "length_penalty": 0.8, "early_stopping": true,
        "num_return_sequences": 2, "eos_token_id": 5, "ignore_eos": true
    }"#;
    let camel = r#"{
        "temperature": 0.7, "topK": 40, "topP": 0.9, "minP": 0.05, "typicalP": 0.95,
        "repetitionPenalty": 1.1, "presencePenalty": 0.5, "frequencyPenalty": -0.5,
        "penaltyLastN": 64, "logitBias": {"42": -5.0, "7": 2.5}, "seed": 1234,
        "maxNewTokens": 100, "stop": ["\n\n", "User:"], "stopTokenIds": [2, 3],
        "numBeams": 4, "lengthPenalty": 0.8, "earlyStopping": true,
        "numReturnSequences": 2, "eosTokenId": [5], "ignoreEos": true
    }"#;
    assert_eq!(parse(snake), want);
    assert_eq!(parse(camel), want);
    // Missing fields take their defaults; round trip through serde.
    assert_eq!(parse("{}"), SamplingParams::default());
    assert_eq!(parse(r#"{"topK": 5}"#).top_k, 5);
    assert_eq!(parse(r#"{"seed": null}"#).seed, None);
    // `null` is the default, a single stop string is a list of one, and case does not matter
    assert_eq!(parse("null"), SamplingParams::default());
    assert_eq!(
        parse(r#"{"top_k": null}"#).top_k,
        SamplingParams::default().top_k
    );
    assert_eq!(parse(r#"{"stop": "END"}"#).stop, vec!["END".to_string()]);
    assert_eq!(parse(r#"{"TopK": 5, "max-new-tokens": 3}"#).top_k, 5);
    let text = serde_json::to_string(&want).unwrap_or_default();
    assert_eq!(parse(&text), want, "{text}");
}

#[test]
fn from_json_rejects_unknown_fields_wrong_types_and_bad_values() {
    let cases: &[(&str, &str, &str)] = &[
        // (json, error name, text the message must contain)
        (
            r#"{"top_q": 0.5}"#,
            "options",
            "unknown generation option `top_q`",
        ),
        (
            r#"{"temprature": 0.5}"#,
            "options",
            "did you mean `temperature`",
        ),
        (r#"{"top_k": "5"}"#, "top_k", "top_k"),
        (r#"{"topK": -1}"#, "top_k", "topK"),
        (r#"{"temperature": "hot"}"#, "temperature", "temperature"),
        (r#"{"temperature": 1e999}"#, "options", ""),
        (r#"{"temperature": 1e300}"#, "temperature", "temperature"),
        (r#"{"stop": [1]}"#, "stop", "stop"),
        (r#"{"seed": -1}"#, "seed", "seed"),
        (r#"{"seed": 18446744073709551616}"#, "seed", "seed"),
        (
            r#"{"early_stopping": 1}"#,
            "early_stopping",
            "early_stopping",
        ),
        (
            r#"{"logit_bias": {"abc": 1.0}}"#,
            "logit_bias",
            "logit_bias",
        ),
        (r#"{"logitBias": {"-3": 1.0}}"#, "logit_bias", "logitBias"),
        (r#"{"logit_bias": [1, 2]}"#, "logit_bias", "logit_bias"),
        (r#"{"logit_bias": {"1": 200}}"#, "logit_bias", "logit_bias"),
        (r#"{"top_p": 2}"#, "top_p", "top_p"),
        (r#"{"numBeams": 0}"#, "num_beams", "num_beams"),
        (r#"{"top_k": 1, "topK": 2}"#, "options", "given twice"),
        (r#"[]"#, "options", "object"),
        (r#"{"top_k": 1"#, "options", "JSON"),
    ];
    for &(json, name, needle) in cases {
        let e = from_json(json).err();
        assert_eq!(
            e.as_ref().and_then(invalid_name),
            Some(name),
            "{json}: {e:?}"
        );
        let msg = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            msg.contains(needle),
            "{json}: `{msg}` does not contain `{needle}`"
        );
    }
}

#[test]
fn from_json_never_panics() {
    let garbage = [
        "",
        " ",
        "{",
        "}",
        "{}}",
        "\"",
        "nul",
        "true",
        "0",
        "-0",
        "1e99999",
        "\"{}\"",
        "{\"\": 1}",
        "{\"top_k\":}",
        "{\"top_k\": 1,}",
        "{top_k: 1}",
        "{'top_k': 1}",
        "{\"top_k\": 1.5}",
        "{\"top_k\": 1e30}",
        "{\"top_k\": 99999999999999999999999}",
        "{\"max_new_tokens\": -0}",
        "{\"temperature\": NaN}",
        "{\"temperature\": Infinity}",
        "{\"temperature\": -0.0}",
        "{\"logit_bias\": {\"4294967296\": 1}}",
        "{\"logit_bias\": {\"\": 1}}",
        "{\"logit_bias\": {\"1\": null}}",
        "{\"stop\": [\"\\ud800\"]}",
        "{\"stop\": [\"\\u0000\"]}",
        "{\"stop\": [[[[[[]]]]]]}",
        "\u{feff}{}",
        "{\"seed\": 1.0}",
        "\0",
        "{\"top_k\": 1} trailing",
        "{\"top_k\": 1}{\"top_k\": 2}",
    ];
    for g in garbage {
        if let Ok(p) = from_json(g) {
            assert!(p.validate().is_ok(), "{g:?} parsed into invalid {p:?}");
        }
    }
    let deep = "[".repeat(100_000);
    assert!(from_json(&deep).is_err());
    let deep = format!("{{\"stop\": {}", "[".repeat(100_000));
    assert!(from_json(&deep).is_err());

    // Random mutations of a valid document.
    const SEED: u64 = 0x6EED_0006;
    let mut rng = ChaCha20Rng::seed_from_u64(SEED);
    let valid: Vec<char> = r#"{"temperature": 0.7, "topK": 40, "top_p": 0.9, "logitBias": {"42": -5.0}, "stop": ["a", "b"], "seed": 3, "numBeams": 2, "early_stopping": true}"#
        .chars()
        .collect();
    let alphabet: Vec<char> = "{}[]\":,0123456789.-eE+ abtnul\\_pPkK\u{e9}\u{1F600}"
        .chars()
        .collect();
    for round in 0..5000 {
        let mut doc = valid.clone();
        for _ in 0..rng.random_range(1..=4) {
            let at = rng.random_range(0..doc.len());
            match rng.random_range(0..3) {
                0 => doc[at] = alphabet[rng.random_range(0..alphabet.len())],
                1 => {
                    doc.remove(at);
                }
                _ => doc.insert(at, alphabet[rng.random_range(0..alphabet.len())]),
            }
        }
        let text: String = doc.into_iter().collect();
        let result = std::panic::catch_unwind(|| from_json(&text));
        match result {
            Ok(Ok(p)) => assert!(p.validate().is_ok(), "seed {SEED:#x} round {round}: {text}"),
            Ok(Err(_)) => {}
            Err(_) => panic!("seed {SEED:#x} round {round}: from_json panicked on {text}"),
        }
    }
}
