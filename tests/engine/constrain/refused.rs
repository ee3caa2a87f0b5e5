//! Formats that cannot be followed are refused before generation, naming the problem; hostile
//! ones (huge, deeply nested, recursive without end, empty) end in an error, not a hang.

use emberlm::constrain::{gbnf, ResponseFormat};
use emberlm::sampling::SamplingParams;
use emberlm::session::{GenerateOptions, Prompt};
use serde_json::json;

use super::support::*;

fn refusal(format: ResponseFormat) -> String {
    refusal_with(format, greedy(8))
}

fn refusal_with(format: ResponseFormat, sampling: SamplingParams) -> String {
    let mut s = cpu_session(&fixture("tiny-gpt2-f32.gguf"));
    let options = GenerateOptions {
        sampling,
        response_format: format.clone(),
        ..GenerateOptions::default()
    };
    match pollster::block_on(s.generate(&Prompt::Text("x".into()), &options, &mut |_| {})) {
        Ok(g) => panic!("{format:?} was accepted: {g:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn invalid_formats_are_refused_with_the_problem_named() {
    let e = refusal(ResponseFormat::Regex("[0-9".into()));
    assert!(e.contains("response_format") && e.contains("regex"), "{e}");
    let e = refusal(ResponseFormat::Lark("start: foo\n".into()));
    assert!(e.contains("lark") && e.contains("foo"), "{e}");
    let e = refusal(ResponseFormat::Gbnf(
        "root ::= \"a\" |\nbad ::= [z-a]\n".into(),
    ));
    assert!(
        e.contains("line 2, column 9") && e.contains("backwards"),
        "{e}"
    );
    let e = refusal(ResponseFormat::Gbnf("root ::= missing\n".into()));
    assert!(e.contains("`missing` is used but never defined"), "{e}");
    let e = refusal(schema_format(&json!({"type": "object", "properties": 3})));
    assert!(e.contains("json_schema"), "{e}");
    let e = refusal(schema_format(&json!(false)));
    assert!(e.contains("admits no value"), "{e}");
}

#[test]
fn empty_languages_are_refused() {
    let e = refusal(schema_format(
        &json!({"type": "string", "minLength": 5, "maxLength": 2}),
    ));
    assert!(e.contains("json_schema"), "{e}");
    let e = refusal(ResponseFormat::Regex("[^\\s\\S]".into()));
    assert!(e.contains("regex"), "{e}");
}

#[test]
fn hostile_formats_end_in_errors_not_hangs() {
    // past the size limit: refused before compiling
    let words: Vec<String> = (0..200_000).map(|i| format!("w{i}x")).collect();
    let e = refusal(ResponseFormat::Regex(words.join("|")));
    assert!(e.contains("at most"), "{e}");
    // 50 000 alternatives, under the limit: compiled and followed, or refused; never a hang
    let mut s = cpu_session(&fixture("tiny-gpt2-f32.gguf"));
    let options = GenerateOptions {
        sampling: greedy(8),
        response_format: ResponseFormat::Regex(words[..50_000].join("|")),
        ..GenerateOptions::default()
    };
    if let Ok(g) = pollster::block_on(s.generate(&Prompt::Text("x".into()), &options, &mut |_| {}))
    {
        let text = &g.sequences[0].text;
        assert!(
            words[..50_000].contains(text)
                || g.sequences[0].finish_reason != emberlm::session::FinishReason::Stop,
            "{text:?}"
        );
    }
    // nesting far deeper than any real schema: refused before the compiler recurses into it
    // (which would overflow the stack, in wasm first)
    let mut schema = json!({"type": "integer"});
    for _ in 0..200 {
        schema = json!({"type": "array", "items": schema, "maxItems": 2});
    }
    let e = refusal(schema_format(&schema));
    assert!(e.contains("nests 201 levels deep"), "{e}");
    let e = refusal(ResponseFormat::Lark(format!(
        "start: {}\"a\"{}\n",
        "(".repeat(300),
        ")".repeat(300)
    )));
    assert!(e.contains("nests 300 levels deep"), "{e}");
    // GBNF groups nested beyond the limit, and left recursion
    let deep = format!("root ::= {}\"a\"{}\n", "(".repeat(500), ")".repeat(500));
    let e = gbnf::to_lark(&deep).unwrap_err().to_string();
    assert!(e.contains("nest deeper"), "{e}");
    let e = refusal(ResponseFormat::Gbnf("root ::= root \"a\"\n".into()));
    assert!(e.contains("gbnf"), "{e}");
}
