#![cfg(not(target_arch = "wasm32"))]
//! Chat templates: SmolLM2's own template (from its GGUF, and from a metadata-only GGUF that
//! carries the same template), the Jinja features real templates use, the fuel and recursion
//! limits (time, recursion and memory), the fallback format and `tokenizer_config.json` forms.
//! Expected strings for the Jinja features were produced with Python's Jinja2 configured as
//! transformers configures it.

use crate::common::gguf_meta;
use crate::common::require;
use crate::peak_alloc;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use emberlm::chat::{ChatMessage, ChatTemplate};
use emberlm::format::gguf::{GgufHeader, GgufValue};
use emberlm::tokenizer::Tokenizer;
use emberlm::Error;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fixtures() -> PathBuf {
    root().join("tests/fixtures")
}

/// SmolLM2-135M-Instruct's `tokenizer.chat_template`, as stored in its GGUF.
const SMOLLM2_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

fn msg(role: &str, content: &str) -> ChatMessage {
    ChatMessage::new(role, content)
}

fn two_turns() -> Vec<ChatMessage> {
    vec![
        msg("system", "You are a concise assistant."),
        msg("user", "What is the capital of France?"),
        msg("assistant", "Paris."),
        msg("user", "And of Italy?"),
    ]
}

const TWO_TURNS_CHATML: &str = "<|im_start|>system\nYou are a concise assistant.<|im_end|>\n\
<|im_start|>user\nWhat is the capital of France?<|im_end|>\n\
<|im_start|>assistant\nParis.<|im_end|>\n\
<|im_start|>user\nAnd of Italy?<|im_end|>\n\
<|im_start|>assistant\n";

fn render(source: &str, messages: &[ChatMessage]) -> Result<String, Error> {
    ChatTemplate::new(source, "<s>", "</s>")?.render(messages, true)
}

fn template_error(source: &str, messages: &[ChatMessage]) -> String {
    match render(source, messages) {
        Err(Error::Template(m)) => m,
        other => panic!("expected a template error, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// SmolLM2

fn check_smollm2(template: &ChatTemplate, tokenizer: &Tokenizer) {
    assert_eq!(
        template.render(&two_turns(), true).unwrap(),
        TWO_TURNS_CHATML
    );
    let without_prompt = template.render(&two_turns(), false).unwrap();
    assert_eq!(
        without_prompt,
        TWO_TURNS_CHATML.trim_end_matches("<|im_start|>assistant\n")
    );
    // No system message: the template supplies its own.
    let text = template.render(&two_turns()[1..2], true).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging \
         Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    // Unknown roles go through untouched.
    let text = template.render(&[msg("tool", "42")], false).unwrap();
    assert!(
        text.ends_with("<|im_start|>tool\n42<|im_end|>\n"),
        "{text:?}"
    );
    // The rendered prompt tokenizes with the control tokens as single ids.
    let ids = tokenizer
        .encode(&template.render(&two_turns(), true).unwrap(), true, None)
        .unwrap();
    let im_start = tokenizer.token_to_id("<|im_start|>").unwrap();
    let im_end = tokenizer.token_to_id("<|im_end|>").unwrap();
    assert_eq!(ids.iter().filter(|&&i| i == im_start).count(), 5);
    assert_eq!(ids.iter().filter(|&&i| i == im_end).count(), 4);
}

#[test]
fn smollm2_template_from_its_gguf() {
    let Some(path) = require::smollm2() else {
        return;
    };
    let bytes = std::fs::read(&path).unwrap();
    let header = GgufHeader::parse(&bytes, "SmolLM2.gguf").unwrap();
    assert_eq!(
        header.get_str("tokenizer.chat_template").unwrap(),
        Some(SMOLLM2_TEMPLATE)
    );
    let tokenizer = Tokenizer::from_gguf(&header).unwrap();
    let template = ChatTemplate::from_gguf(&header, &tokenizer)
        .unwrap()
        .expect("SmolLM2 has a chat template");
    check_smollm2(&template, &tokenizer);
}

/// The same, without the 98 MB model: SmolLM2's template in the tiny GPT-2 GGUF's metadata.
#[test]
fn smollm2_template_from_gguf_metadata() {
    let mut meta = gguf_meta::read(&fixtures().join("tiny-gpt2-f32.gguf"));
    let header = gguf_meta::header(&meta, "plain.gguf");
    let tokenizer = Tokenizer::from_gguf(&header).unwrap();
    assert!(ChatTemplate::from_gguf(&header, &tokenizer)
        .unwrap()
        .is_none());

    // Add ChatML's control tokens so the rendered text tokenizes as it would for SmolLM2.
    let mut tokens = match header.get_str_array("tokenizer.ggml.tokens").unwrap() {
        Some(t) => t.to_vec(),
        None => panic!("no tokens"),
    };
    let mut types = header
        .get_i32_array("tokenizer.ggml.token_type")
        .unwrap()
        .unwrap()
        .to_vec();
    tokens.extend(["<|im_start|>".to_string(), "<|im_end|>".to_string()]);
    types.extend([3, 3]);
    gguf_meta::set(
        &mut meta,
        "tokenizer.ggml.tokens",
        gguf_meta::strings(&tokens),
    );
    gguf_meta::set(
        &mut meta,
        "tokenizer.ggml.token_type",
        GgufValue::Array(emberlm::format::gguf::GgufArray::I32(types)),
    );
    gguf_meta::set(
        &mut meta,
        "tokenizer.chat_template",
        GgufValue::String(SMOLLM2_TEMPLATE.to_string()),
    );
    let header = gguf_meta::header(&meta, "chatml.gguf");
    let tokenizer = Tokenizer::from_gguf(&header).unwrap();
    let template = ChatTemplate::from_gguf(&header, &tokenizer)
        .unwrap()
        .unwrap();
    check_smollm2(&template, &tokenizer);

    // A template that is not a string is a type error naming the key.
    gguf_meta::set(&mut meta, "tokenizer.chat_template", GgufValue::U32(7));
    let header = gguf_meta::header(&meta, "bad.gguf");
    let e = ChatTemplate::from_gguf(&header, &tokenizer).unwrap_err();
    assert!(e.to_string().contains("tokenizer.chat_template"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// What real templates use

#[test]
fn raise_exception_becomes_a_template_error_with_its_message() {
    let source = "{% for m in messages %}\
        {% if (m.role == 'user') != (loop.index0 % 2 == 0) %}\
        {{ raise_exception('Roles must alternate user/assistant, starting with user') }}\
        {% endif %}[{{ m.role }}] {{ m.content }}\n{% endfor %}";
    let m = template_error(source, &[msg("assistant", "hi")]);
    assert!(
        m.contains("Roles must alternate user/assistant, starting with user"),
        "{m}"
    );
    assert_eq!(
        render(source, &[msg("user", "a"), msg("assistant", "b")]).unwrap(),
        "[user] a\n[assistant] b\n"
    );
    // Raised from inside a macro, too.
    let source = "{% macro check(m) %}{% if m.content == '' %}{{ raise_exception('empty message') }}{% endif %}{% endmacro %}{% for m in messages %}{{ check(m) }}{% endfor %}";
    assert!(template_error(source, &[msg("user", "")]).contains("empty message"));
}

#[test]
fn runaway_templates_are_stopped() {
    let t0 = Instant::now();
    let m = template_error(
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ i + j }}{% endfor %}{% endfor %}",
        &[],
    );
    assert!(m.contains("steps"), "{m}");
    // Unbounded recursion.
    let m = template_error(
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        &[],
    );
    assert!(m.contains("recursion") || m.contains("steps"), "{m}");
    // Each loop over the conversation, nested: stopped by fuel long before 10^20 iterations.
    let many: Vec<ChatMessage> = (0..1000).map(|i| msg("user", &i.to_string())).collect();
    let m = template_error(
        "{% for a in messages %}{% for b in messages %}{% for c in messages %}\
         {{ a.content }}{% endfor %}{% endfor %}{% endfor %}",
        &many,
    );
    assert!(m.contains("steps"), "{m}");
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t0.elapsed()
    );
    // A long but ordinary conversation stays well inside the budget.
    let long: Vec<ChatMessage> = (0..2000)
        .map(|i| {
            msg(
                if i % 2 == 0 { "user" } else { "assistant" },
                "some words here",
            )
        })
        .collect();
    let text = ChatTemplate::new(SMOLLM2_TEMPLATE, "", "")
        .unwrap()
        .render(&long, true)
        .unwrap();
    assert_eq!(text.matches("<|im_start|>").count(), 2002);
}

/// A smaller render budget stops a template the default budget lets finish, with the same
/// error; an ordinary conversation still fits a modest one.
#[test]
fn a_smaller_fuel_budget_stops_templates_sooner() {
    let source = "{% for i in range(20000) %}{{ i }}{% endfor %}";
    let messages = [msg("user", "hi")];
    let full = ChatTemplate::new(source, "", "").unwrap();
    assert!(full.render(&messages, false).is_ok());
    let small = ChatTemplate::new(source, "", "").unwrap().with_fuel(10_000);
    let m = small.render(&messages, false).unwrap_err().to_string();
    assert!(m.contains("steps"), "{m}");
    let chat = ChatTemplate::new(SMOLLM2_TEMPLATE, "", "")
        .unwrap()
        .with_fuel(10_000);
    assert!(chat.render(&messages, true).is_ok());
    // a budget of 0 is taken as 1, not as no budget
    let zero = ChatTemplate::new(source, "", "").unwrap().with_fuel(0);
    assert!(zero.render(&messages, false).is_err());
}

/// A lazily repeated list costs no fuel until printed, and printing is not charged: the fuzzer
/// found `{{ [777777770] * 6666665 }}` writing 73 MB (and up to 10^8 items are allowed, over a
/// gigabyte). A render's output is held to a limit, and passing it is a template error.
#[test]
fn a_render_stops_at_its_output_limit() {
    assert_eq!(emberlm::chat::MAX_RENDER_BYTES, 16 << 20);
    let limited = |source: &str| {
        ChatTemplate::new(source, "<s>", "</s>")
            .unwrap()
            .with_fuel(1000)
            .render(&[msg("user", "hi")], true)
    };
    // A printed list is counted before it is walked (64,000 bytes: 32,000 items).
    let start = Instant::now();
    for source in [
        "{{ [777777770] * 99999999 }}",
        "{{ [[1] * 99999999] }}",
        "{{ {'a': [1, 2] * 50000000} }}",
    ] {
        let e = limited(source).unwrap_err().to_string();
        assert!(e.contains("more than 32000 items"), "{source}: {e}");
    }
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(limited("{{ [1, 2] * 3 }}").unwrap(), "[1, 2, 1, 2, 1, 2]");
    // Text past the limit is refused; up to it, whole (with the product's fuel, which pays
    // for more).
    let twice = "{% set s = 'x' * 8388608 %}{{ s }}{{ s }}";
    assert_eq!(render(twice, &[]).unwrap().len(), 16 << 20);
    let e = template_error(&format!("{twice}!"), &[]);
    assert!(e.contains("more than 16777216 bytes"), "{e}");
}

/// Methods, filters and functions that can return far more than they are given are paid for in
/// fuel before they build anything: each of these would make one value of 20 to 300 MB, more
/// than the fuel pays for.
#[test]
fn amplifying_templates_are_stopped_before_they_allocate() {
    for source in [
        "{{ ('a' * 1000).replace('', 'x' * 200000) | length }}",
        "{{ ('x' * 200000).join(['a'] * 1000) | length }}",
        "{{ ('y' * 3000000).split('') | length }}",
        "{{ '{:>200000000}'.format(1) }}",
        "{{ [[1]] | tojson(indent=300000000) }}",
        "{{ strftime_now('%c' * 1000000) }}",
    ] {
        let (m, peak) = peak_alloc::with_peak(|| template_error(source, &[msg("user", "hi")]));
        assert!(
            peak < 16 << 20,
            "{source}: allocated {peak} bytes at once ({m})"
        );
    }
}

/// minijinja's format parsers stepped byte by byte through field keys and panicked inside a
/// character of several bytes.
#[test]
fn format_keys_must_be_ascii() {
    for source in [
        "{{ '%s-%(é' | format('x', 42) }}",
        "{{ '%(ключ)s' | format(1) }}",
        "{{ '{0[é]}'.format({'é': 1}) }}",
        // a key runs to its `]`, past the field's `}` (found by the fuzzer)
        "{{ '{a.b[c)}} é'.format(1) }}",
        "{{ '{0[}][é]}'.format(1) }}",
        "{{ '{0[ é'.format(1) }}",
    ] {
        let m = template_error(source, &[]);
        assert!(m.contains("non-ASCII"), "{source}: {m}");
    }
    assert_eq!(
        render(
            "{{ '%(a)s' | format(a='é') }}|{{ '{0[a]}'.format({'a': 'é'}) }}|{{ '{} é [é]'.format(1) }}",
            &[]
        )
        .unwrap(),
        "é|é|1 é [é]"
    );
}

/// Slicing an empty string backwards (`''[::-1]`) made minijinja 2 index out of bounds.
#[test]
fn reversed_slices_of_empty_values() {
    let source = "[{{ messages[0].content[::-1] }}|{{ ''[::-2] }}|{{ 'abc'[0:2:-1] }}|{{ [][::-1] | length }}]";
    assert_eq!(render(source, &[msg("user", "")]).unwrap(), "[|||0]");
    assert_eq!(render(source, &[msg("user", "abc")]).unwrap(), "[cba|||0]");
}

#[test]
fn tojson_writes_what_python_json_dumps_writes() {
    let messages = [msg("user", "Hi \"there\" <b>&</b> é\n")];
    assert_eq!(
        render("{{ messages | tojson }}", &messages).unwrap(),
        r#"[{"role": "user", "content": "Hi \"there\" <b>&</b> é\n"}]"#
    );
    assert_eq!(
        render(
            r#"{{ {"b": [1, 2.5, none, true], "a": {}} | tojson(indent=2) }}"#,
            &[]
        )
        .unwrap(),
        "{\n  \"b\": [\n    1,\n    2.5,\n    null,\n    true\n  ],\n  \"a\": {}\n}"
    );
    assert_eq!(
        render(
            r#"{{ {"b": 1, "a": [], "c": "é"} | tojson(sort_keys=true, ensure_ascii=true) }}"#,
            &[]
        )
        .unwrap(),
        r#"{"a": [], "b": 1, "c": "\u00e9"}"#
    );
    assert_eq!(
        render(r#"{{ [1, "x"] | tojson(separators=(",", ":")) }}"#, &[]).unwrap(),
        r#"[1,"x"]"#
    );
    assert!(template_error("{{ 1 | tojson(colour=1) }}", &[]).contains("colour"));
}

#[test]
fn strftime_now_formats_the_local_time() {
    let before = chrono::Local::now();
    let text = render(
        "{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%d %B %Y') }}",
        &[],
    )
    .unwrap();
    let after = chrono::Local::now();
    let expect = |t: chrono::DateTime<chrono::Local>| {
        format!("{}|{}", t.format("%Y-%m-%d"), t.format("%d %B %Y"))
    };
    assert!(
        text == expect(before) || text == expect(after),
        "{text:?} vs {:?}",
        expect(before)
    );
    let m = template_error("{{ strftime_now('%Y-%Q') }}", &[]);
    assert!(m.contains("strftime_now") && m.contains("%Y-%Q"), "{m}");
}

#[test]
fn python_string_methods_loops_and_whitespace_control() {
    let messages = [
        msg("system", "  Be brief.  "),
        msg("user", "a,b,c"),
        msg("assistant", "Yes"),
    ];
    let source = "{{ bos_token }}\
{% for m in messages %}\
{{ loop.index }}/{{ loop.length }}{% if loop.first %} first{% endif %}{% if loop.last %} last{% endif %}: \
{% if m.role == 'system' %}{{ m.content.strip() }}\
{% elif m.content.startswith('a') %}{{ m.content.split(',') | join('+') }} {{ m.content.upper() }}\
{% else %}{{ m.content.lower() }}{{ eos_token }}{% endif %}\n\
{% endfor %}\
{% for k, v in {'x': 1}.items() %}{{ k }}={{ v }}{% endfor %}\
{% if add_generation_prompt %}>{% endif %}";
    assert_eq!(
        render(source, &messages).unwrap(),
        // `trim_blocks` eats the newline after `{% endif %}`, as in Jinja2.
        "<s>1/3 first: Be brief.2/3: a+b+c A,B,C3/3 last: yes</s>x=1>"
    );
    // trim_blocks and lstrip_blocks, as transformers renders: block tags leave no lines behind.
    let source = "{% for m in messages %}\n    {% if m.role == \"user\" %}\nU: {{ m.content }}\n    {% endif %}\n{% endfor %}\nend\n";
    assert_eq!(
        render(source, &[msg("user", "Hi \"there\" <b>&</b> é\n")]).unwrap(),
        "U: Hi \"there\" <b>&</b> é\n\nend"
    );
    // loop controls
    assert_eq!(
        render(
            "{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}{{ m.role }};{% endfor %}",
            &messages
        )
        .unwrap(),
        "system;assistant;"
    );
}

#[test]
fn bad_templates_are_template_errors() {
    let e = ChatTemplate::new("{% for %}", "", "").unwrap_err();
    assert!(
        matches!(&e, Error::Template(m) if m.contains("compile")),
        "{e:?}"
    );
    let e = ChatTemplate::new("{{ messages[0].content.nope() }}", "", "")
        .unwrap()
        .render(&[msg("user", "x")], false)
        .unwrap_err();
    assert!(matches!(e, Error::Template(_)), "{e:?}");
}

// ---------------------------------------------------------------------------------------------
// Fallback and tokenizer_config.json

#[test]
fn fallback_format() {
    let t = ChatTemplate::fallback();
    assert_eq!(
        t.render(&two_turns(), true).unwrap(),
        "System: You are a concise assistant.\n\nUser: What is the capital of France?\n\n\
         Assistant: Paris.\n\nUser: And of Italy?\n\nAssistant:"
    );
    assert_eq!(
        t.render(&[msg("tool", "42")], false).unwrap(),
        "Tool: 42\n\n"
    );
    assert_eq!(t.render(&[], true).unwrap(), "Assistant:");
}

fn spm_tokenizer() -> Tokenizer {
    let dir = fixtures().join("tiny-llama-spm");
    Tokenizer::from_json(
        &std::fs::read(dir.join("tokenizer.json")).unwrap(),
        Some(&std::fs::read(dir.join("tokenizer_config.json")).unwrap()),
        "tiny-llama-spm",
    )
    .unwrap()
}

#[test]
fn templates_from_tokenizer_config() {
    let tok = spm_tokenizer();
    let config = std::fs::read(fixtures().join("tiny-llama-spm/tokenizer_config.json")).unwrap();
    assert!(ChatTemplate::from_tokenizer_config(&config, &tok)
        .unwrap()
        .is_none());

    // A string; BOS/EOS strings from the tokenizer.
    let json = serde_json::json!({
        "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}{% endfor %}"
    });
    let t = ChatTemplate::from_tokenizer_config(json.to_string().as_bytes(), &tok)
        .unwrap()
        .unwrap();
    assert_eq!(
        t.render(&[msg("user", "hi")], false).unwrap(),
        "<s>[user] hi</s>"
    );

    // The list form: `default` is taken; the config's own token strings win.
    let json = serde_json::json!({
        "bos_token": {"content": "<B>"},
        "eos_token": "<E>",
        "chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "{{ bos_token }}default{{ eos_token }}"}
        ]
    });
    let t = ChatTemplate::from_tokenizer_config(json.to_string().as_bytes(), &tok)
        .unwrap()
        .unwrap();
    assert_eq!(t.render(&[], false).unwrap(), "<B>default<E>");

    let json = serde_json::json!({
        "chat_template": [{"name": "tool_use", "template": "tools"}, {"name": "rag", "template": "r"}]
    });
    let e = ChatTemplate::from_tokenizer_config(json.to_string().as_bytes(), &tok).unwrap_err();
    assert!(
        matches!(&e, Error::Format { .. }) && e.to_string().contains("default"),
        "{e}"
    );
    assert!(e.to_string().contains("tool_use, rag"), "{e}");

    let e = ChatTemplate::from_tokenizer_config(br#"{"chat_template": 3}"#, &tok).unwrap_err();
    assert!(e.to_string().contains("chat_template"), "{e}");
    let e = ChatTemplate::from_tokenizer_config(br#"{"chat_template": [{"name": 1}]}"#, &tok)
        .unwrap_err();
    assert!(e.to_string().contains("chat_template"), "{e}");
    let e = ChatTemplate::from_tokenizer_config(b"{", &tok).unwrap_err();
    assert!(e.to_string().contains("tokenizer_config.json"), "{e}");
}

#[test]
fn chat_messages_are_serde() {
    let m: Vec<ChatMessage> =
        serde_json::from_str(r#"[{"role": "user", "content": "hi"}]"#).unwrap();
    assert_eq!(m, [msg("user", "hi")]);
    assert_eq!(
        serde_json::to_string(&m[0]).unwrap(),
        r#"{"role":"user","content":"hi"}"#
    );
}

// ---------------------------------------------------------------------------------------------
// Gemma 3: its GGUF has no template; the caller gives the instruction-tuned format

#[test]
fn gemma3_template_given_by_the_caller_gives_the_golden_chat_tokens() {
    let Some(path) = require::gemma3() else {
        return;
    };
    let bytes = std::fs::read(&path).unwrap();
    let header = GgufHeader::parse(&bytes, "gemma").unwrap();
    let tokenizer = Tokenizer::from_gguf(&header).unwrap();
    let source = std::fs::read_to_string(fixtures().join("templates/gemma3.jinja")).unwrap();
    let template = ChatTemplate::from_source(&source, &tokenizer).unwrap();
    let text = template
        .render(&[msg("user", "Name three colors of the rainbow.")], true)
        .unwrap();
    assert_eq!(
        text,
        "<bos><start_of_turn>user\nName three colors of the rainbow.<end_of_turn>\n<start_of_turn>model\n"
    );
    // the golden chat prompt: the same ids, BOS written by the template rather than added
    let golden: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("golden/gemma-3-270m-q4_k_m.golden.json"))
            .unwrap(),
    )
    .unwrap();
    let want: Vec<u32> = golden["results"][1]["prompt_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(tokenizer.encode(&text, true, Some(false)).unwrap(), want);
    // a system message joins the first user turn; replies are the model's turns
    let text = template
        .render(
            &[
                msg("system", "Be brief."),
                msg("user", "Hi"),
                msg("assistant", "Hello."),
                msg("user", "Bye"),
            ],
            true,
        )
        .unwrap();
    assert_eq!(
        text,
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n\
         <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    );
}
