//! JSON schemas of increasing difficulty: every finished output parses and validates (checked
//! by an independent validator); on SmolLM2 every one of 20 seeded samples per schema, and
//! the greedy answer, finish and validate (sampled with the `balanced` preset).

use emberlm::session::{FinishReason, Prompt};
use serde_json::Value;

use super::support::*;
use crate::common;

/// Nested objects, enums, arrays with bounds, numbers with ranges, required fields, strings
/// with patterns: in that order of difficulty (`tests/fixtures/schemas.json`, which the browser
/// test reads too).
pub fn schemas() -> Vec<(String, Value)> {
    let doc: Value =
        serde_json::from_str(include_str!("../../fixtures/schemas.json")).expect("schemas.json");
    doc["schemas"]
        .as_array()
        .expect("a list of schemas")
        .iter()
        .map(|s| {
            (
                s["name"].as_str().expect("a name").to_string(),
                s["schema"].clone(),
            )
        })
        .collect()
}

#[test]
fn tiny_models_give_valid_json_for_every_schema() {
    for model in TOKENIZER_KINDS {
        let mut s = cpu_session(&fixture(model));
        for (name, schema) in schemas() {
            let format = schema_format(&schema);
            let mut finished = 0;
            for seed in 0..6 {
                let g = generate(&mut s, "{", &format, sampled(seed, 100));
                let seq = &g.sequences[0];
                match seq.finish_reason {
                    FinishReason::Stop => {
                        finished += 1;
                        assert_valid(&schema, &seq.text, &format!("{model} {name}"));
                    }
                    _ => assert!(!g.warnings.is_empty(), "{model} {name}: silent cut"),
                }
            }
            // a random tiny model may ramble inside a number's digits; most still finish
            assert!(finished >= 3, "{model} {name}: only {finished}/6 finished");
        }
    }
}

/// 20 samples per schema: each sequence draws from its own stream of the seed, so these are the
/// first 20 of any larger set; the page's test (`tests/e2e/schemas.test.mjs`) draws the first 4
/// per schema through the browser's engine.
#[test]
fn smollm2_gives_valid_json_in_20_seeded_samples_per_schema() {
    let Some(path) = common::require::smollm2() else {
        return;
    };
    let mut s = cpu_session(&path);
    for (name, schema) in schemas() {
        let format = schema_format(&schema);
        let prompt = Prompt::Chat(vec![emberlm::chat::ChatMessage::new(
            "user",
            format!("Reply with JSON for this schema: {schema}"),
        )]);
        let greedy_g =
            pollster::block_on(s.generate(&prompt, &options(&format, greedy(256)), &mut |_| {}))
                .unwrap();
        assert_complete(&greedy_g, &name);
        assert_valid(&schema, &greedy_g.sequences[0].text, &name);
        let mut p = balanced(2026, 256);
        p.num_return_sequences = 20;
        let g = pollster::block_on(s.generate(&prompt, &options(&format, p), &mut |_| {})).unwrap();
        assert_eq!(g.sequences.len(), 20);
        assert_complete(&g, &name);
        for (i, seq) in g.sequences.iter().enumerate() {
            assert_valid(&schema, &seq.text, &format!("{name} sample {i}"));
        }
        eprintln!(
            "{name}: {} tokens, {:.2} ms of masks over {} steps ({:.3} ms each)",
            g.stats.generated_tokens,
            g.stats.constraint_ms,
            g.stats.constrained_steps,
            g.stats.constraint_ms / g.stats.constrained_steps.max(1) as f64
        );
    }
}

/// Gemma 3's 262 144-token SentencePiece vocabulary fits the token trie, and its text obeys a
/// schema and a regular expression.
#[test]
fn gemma3_follows_formats() {
    let Some(path) = common::require::gemma3() else {
        return;
    };
    let mut s = cpu_session(&path);
    let g = generate(
        &mut s,
        "The year is",
        &emberlm::constrain::ResponseFormat::Regex("[0-9]{4}".into()),
        greedy(8),
    );
    assert_complete(&g, "gemma3 regex");
    let text = &g.sequences[0].text;
    assert!(
        text.len() == 4 && text.bytes().all(|b| b.is_ascii_digit()),
        "{text:?}"
    );
    let (name, schema) = &schemas()[1];
    let g = generate(&mut s, "Colour:", &schema_format(schema), balanced(3, 64));
    assert_complete(&g, name);
    assert_valid(schema, &g.sequences[0].text, name);
}
