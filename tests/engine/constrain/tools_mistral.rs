//! Mistral's call syntaxes on the tiny fixtures (CPU backend): `[TOOL_CALLS] [{…}, …]` and
//! `[TOOL_CALLS]name[ARGS]{…}`, with the markers as text (a vocabulary without them) and as
//! the control tokens of a vocabulary that has them (the tiny SentencePiece fixture with two
//! pieces turned into `[TOOL_CALLS]` and `[ARGS]`): the grammar admits exactly the answers of
//! its choice, sampled calls are held to the control tokens, kept in the text, read back and
//! valid against their schemas, and a conversation with those calls and their results renders
//! and goes on.

use std::sync::Arc;

use emberlm::chat::tool_calls::read_calls;
use emberlm::chat::tools::{ToolChoice, ToolSyntax};
use emberlm::chat::{AssistantCall, ChatMessage, ChatTemplate};
use emberlm::constrain::Grammars;
use emberlm::format::gguf::{GgufArray, GgufValue};
use emberlm::loader::ModelFiles;
use emberlm::session::{FinishReason, GenerateOptions, Prompt, Session};
use emberlm::tokenizer::Tokenizer;
use serde_json::json;

use super::support::{assert_valid, fixture, greedy, sampled};
use super::tools::{admits, chat, parameters, request, with_template};
use crate::common::gguf_meta;

/// A template in the style of Mistral 7B v0.3's (written for these tests): tools before the
/// last user message, calls as one list, results with the call's nine-character id.
const LIST_TEMPLATE: &str = "{%- for m in messages %}{%- if m.role == 'user' %}{% if loop.last and tools %}[AVAILABLE_TOOLS] {{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}[INST] {{ m.content }}[/INST]{%- elif m.get('tool_calls') %}[TOOL_CALLS] [{% for c in m.tool_calls %}{% set out = c.function | tojson %}{{ out[:-1] }}{% if c.id | length != 9 %}{{ raise_exception('tool call ids must be nine letters or digits') }}{% endif %}, \"id\": \"{{ c.id[-9:] }}\"}{% if not loop.last %}, {% endif %}{% endfor %}]</s>{%- elif m.role == 'assistant' %} {{ m.content }}</s>{%- elif m.role == 'tool' %}{% if m.tool_call_id | length != 9 %}{{ raise_exception('tool call ids must be nine letters or digits') }}{% endif %}[TOOL_RESULTS] {\"content\": {{ m.content | string }}, \"call_id\": \"{{ m.tool_call_id }}\"}[/TOOL_RESULTS]{%- endif %}{%- endfor %}";

/// A template in the style of Mistral Small 3.2's: a marker, the name and `[ARGS]` per call.
const ARGS_TEMPLATE: &str = "{%- if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}{%- for m in messages %}{%- if m.role == 'user' %}[INST]{{ m.content }}[/INST]{%- elif m.role == 'assistant' %}{{ m.content }}{% for c in m.tool_calls or [] %}[TOOL_CALLS]{{ c.function.name }}[ARGS]{{ c.function.arguments | tojson }}{% endfor %}</s>{%- elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]{%- endif %}{%- endfor %}";

/// Pieces of the tiny SentencePiece vocabulary (`>` and a tab) that become the markers.
const MARKER_IDS: [u32; 2] = [596, 598];

/// The tiny SentencePiece model with `template`, and with `[TOOL_CALLS]` and `[ARGS]` as
/// control tokens in place of two rare pieces.
fn marked_files(template: &str) -> ModelFiles {
    let path = fixture("tiny-llama-spm-f32.gguf");
    let mut meta = gguf_meta::read(&path);
    gguf_meta::set(
        &mut meta,
        "tokenizer.chat_template",
        GgufValue::String(template.to_string()),
    );
    for (key, value) in meta.iter_mut() {
        match (key.as_str(), value) {
            ("tokenizer.ggml.tokens", GgufValue::Array(GgufArray::String(tokens))) => {
                tokens[MARKER_IDS[0] as usize] = "[TOOL_CALLS]".into();
                tokens[MARKER_IDS[1] as usize] = "[ARGS]".into();
            }
            ("tokenizer.ggml.token_type", GgufValue::Array(GgufArray::I32(types))) => {
                for id in MARKER_IDS {
                    types[id as usize] = 3; // control
                }
            }
            _ => {}
        }
    }
    let bytes = gguf_meta::write_with_tensors(&meta, &gguf_meta::read_tensors(&path));
    ModelFiles::from_bytes(bytes, "tiny-llama-spm-markers.gguf").unwrap()
}

fn with_markers(template: &str) -> Session {
    Session::new_cpu(&marked_files(template), None).unwrap()
}

fn grammars_of(tokenizer: &Arc<Tokenizer>, vocab: usize) -> Grammars {
    let eos = tokenizer.eos_ids().first().copied().unwrap_or(0);
    Grammars::new(tokenizer, vocab.min(tokenizer.vocab_size()), eos).unwrap()
}

/// `ok(request, syntax, text)` over `tokenizer`.
fn checker(
    tokenizer: Arc<Tokenizer>,
    vocab: usize,
) -> impl Fn(&emberlm::chat::ToolRequest, ToolSyntax, &str) -> bool {
    let grammars = grammars_of(&tokenizer, vocab);
    move |t, syntax, text| admits(&grammars, &tokenizer, t, syntax, text)
}

#[test]
fn the_mistral_grammars_admit_exactly_their_choices_answers() {
    // markers as text: a vocabulary without them
    let files = ModelFiles::open(&fixture("tiny-llama-f32.gguf")).unwrap();
    let tokenizer = Arc::new(files.tokenizer().unwrap());
    assert_eq!(tokenizer.control_token("[TOOL_CALLS]"), None);
    let vocab = files.weights().unwrap().config.vocab_size;
    // markers as control tokens
    let files = marked_files(LIST_TEMPLATE);
    let marked = Arc::new(files.tokenizer().unwrap());
    assert_eq!(marked.control_token("[TOOL_CALLS]"), Some(MARKER_IDS[0]));
    let marked_vocab = files.weights().unwrap().config.vocab_size;

    let add = "{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": -3}}";
    let now = "{\"name\": \"now\", \"arguments\": {}}";
    let (auto, single) = (request(json!("auto"), true), request(json!("auto"), false));
    let required = request(json!("required"), true);
    let named = request(
        json!({"type": "function", "function": {"name": "now"}}),
        true,
    );
    // SentencePiece puts a space before the text after a control token (`[TOOL_CALLS][`
    // is `[TOOL_CALLS] [` to the model, one space, which the grammar allows)
    for (ok, sp) in [
        (checker(tokenizer.clone(), vocab), " "),
        (checker(marked.clone(), marked_vocab), ""),
    ] {
        let list = ToolSyntax::Mistral;
        assert!(ok(&auto, list, "Two."));
        assert!(ok(&auto, list, &format!("[TOOL_CALLS]{sp}[{add}]")));
        assert!(ok(&auto, list, &format!("[TOOL_CALLS][{add}]")));
        assert!(ok(&auto, list, &format!("[TOOL_CALLS]{sp}[{add}, {now}]")));
        assert!(!ok(
            &single,
            list,
            &format!("[TOOL_CALLS]{sp}[{add}, {now}]")
        ));
        // calls are the whole answer; text never writes the marker
        assert!(!ok(&auto, list, &format!("Two. [TOOL_CALLS] [{add}]")));
        assert!(!ok(&auto, list, "a [TOOL_CALLS] b"));
        assert!(!ok(&auto, list, &format!("[TOOL_CALLS] [{add}] more")));
        assert!(!ok(
            &auto,
            list,
            &format!("[TOOL_CALLS] [{}]", add.replace("2,", "200,"))
        ));
        assert!(!ok(
            &auto,
            list,
            &format!("[TOOL_CALLS] [{}]", add.replace("arguments", "parameters"))
        ));
        assert!(!ok(&required, list, "Two."));
        assert!(ok(&named, list, &format!("[TOOL_CALLS]{sp}[{now}]")));
        assert!(!ok(
            &named,
            list,
            &format!("[TOOL_CALLS]{sp}[{now}, {now}]")
        ));

        if sp.is_empty() {
            // `name[ARGS]{` would encode as ` name[ARGS] {` here: the sampled test covers
            // this syntax with control tokens
            continue;
        }
        let args = ToolSyntax::MistralArgs;
        let call = "[TOOL_CALLS]add[ARGS]{\"a\": 2, \"b\": -3}";
        assert!(ok(&auto, args, "Two."));
        assert!(ok(&auto, args, call));
        assert!(ok(&auto, args, &format!("{call}[TOOL_CALLS]now[ARGS]{{}}")));
        assert!(!ok(
            &single,
            args,
            &format!("{call}[TOOL_CALLS]now[ARGS]{{}}")
        ));
        assert!(!ok(&auto, args, &format!("Two.{call}")));
        assert!(!ok(&auto, args, &call.replace("add", "sub")));
        assert!(!ok(&auto, args, &call.replace("-3", "\"x\"")));
        assert!(!ok(&required, args, "Two."));
        assert!(ok(&named, args, "[TOOL_CALLS]now[ARGS]{}"));
    }
    // held to the control token: the marker spelled in plain text is not a call
    let ok = checker(marked.clone(), marked_vocab);
    let spelled = |text: &str| {
        let grammars = grammars_of(&marked, marked_vocab);
        let lark = emberlm::chat::tool_calls::grammar(&required, ToolSyntax::Mistral, &|m| {
            marked.control_token(m)
        })
        .unwrap();
        let c = grammars
            .compile(&emberlm::constrain::ResponseFormat::Lark(lark))
            .unwrap()
            .unwrap();
        let ids = marked.encode(text, false, Some(false)).unwrap();
        c.start().valid_prefix(&ids).unwrap() == ids.len()
    };
    assert!(ok(
        &required,
        ToolSyntax::Mistral,
        &format!("[TOOL_CALLS][{now}]")
    ));
    assert!(!spelled(&format!("[TOOL_CALLS][{now}]")));
    assert!(!spelled(&format!("[TOOL_CALLS] [{now}]")));
}

#[test]
fn sampled_mistral_calls_use_the_control_tokens_and_read_back() {
    for (template, syntax) in [
        (LIST_TEMPLATE, ToolSyntax::Mistral),
        (ARGS_TEMPLATE, ToolSyntax::MistralArgs),
    ] {
        // with the markers as control tokens, and as text in a vocabulary without them
        for marked in [true, false] {
            let mut s = match marked {
                true => with_markers(template),
                false => with_template("tiny-gpt2-f32.gguf", template),
            };
            assert_eq!(s.tool_format().syntax, syntax);
            assert!(s.tool_format().native);
            let mut cut = 0;
            for choice in [
                json!("required"),
                json!({"type": "function", "function": {"name": "get_weather"}}),
            ] {
                let tools = request(choice.clone(), true);
                let samplings = (0..20)
                    .map(|seed| sampled(seed, 400))
                    .chain(std::iter::once(greedy(400)));
                for (i, sampling) in samplings.enumerate() {
                    let g = chat(&mut s, &tools, sampling);
                    let seq = &g.sequences[0];
                    let what = format!("{syntax:?} marked {marked} {choice} #{i}: {:?}", seq.text);
                    assert!(seq.text.starts_with("[TOOL_CALLS]"), "{what}");
                    if marked {
                        assert_eq!(seq.tokens[0], MARKER_IDS[0], "{what}");
                    }
                    let read = read_calls(&seq.text, syntax);
                    if seq.finish_reason == FinishReason::Length && read.calls.is_empty() {
                        // a random model may write a number until the limit
                        cut += 1;
                        continue;
                    }
                    assert!(!read.calls.is_empty(), "{what}");
                    if let ToolChoice::Named(name) = &tools.choice {
                        assert_eq!(seq.finish_reason, FinishReason::Stop, "{what}");
                        assert_eq!(read.calls.len(), 1, "{what}");
                        assert_eq!(&read.calls[0].name, name, "{what}");
                    }
                    if marked
                        && syntax == ToolSyntax::MistralArgs
                        && seq.finish_reason == FinishReason::Stop
                    {
                        let args = seq.tokens.iter().filter(|&&t| t == MARKER_IDS[1]).count();
                        assert_eq!(args, read.calls.len(), "{what}");
                    }
                    for call in &read.calls {
                        assert_valid(&parameters(&call.name), &call.arguments, &what);
                    }
                }
            }
            assert!(
                cut <= 8,
                "{syntax:?} marked {marked}: {cut} of 42 answers cut off"
            );
            // under `auto`: text that never writes the marker, or calls that parse
            for seed in 0..8 {
                let g = chat(&mut s, &request(json!("auto"), true), sampled(seed, 60));
                let seq = &g.sequences[0];
                let read = read_calls(&seq.text, syntax);
                if read.calls.is_empty() {
                    assert!(!seq.text.contains("[TOOL_CALLS]"), "{:?}", seq.text);
                }
                for call in &read.calls {
                    assert_valid(&parameters(&call.name), &call.arguments, &seq.text);
                }
            }
        }
    }
}

#[test]
fn a_conversation_with_mistral_calls_renders_and_goes_on() {
    let tools = request(json!("auto"), true);
    for template in [LIST_TEMPLATE, ARGS_TEMPLATE] {
        let mut s = with_markers(template);
        let mut assistant = ChatMessage::new("assistant", "");
        assistant.tool_calls = vec![AssistantCall {
            id: "a1b2c3d4e".into(),
            name: "now".into(),
            arguments: "{}".into(),
        }];
        let mut result = ChatMessage::new("tool", "12:00");
        result.tool_call_id = Some("a1b2c3d4e".into());
        let messages = vec![ChatMessage::new("user", "Time?"), assistant, result];
        let options = GenerateOptions {
            sampling: greedy(4),
            tools: Some(tools.clone()),
            ..GenerateOptions::default()
        };
        let prompt = Prompt::Chat(messages.clone());
        let g = pollster::block_on(s.generate(&prompt, &options, &mut |_| {})).unwrap();
        assert!(g.stats.prompt_tokens > 0);
        // the history's calls reach the model as the control tokens
        let rendered = ChatTemplate::new(template, "<s>", "</s>")
            .unwrap()
            .render_with_tools(&messages, Some(&tools), true)
            .unwrap();
        let ids = s
            .shared_tokenizer()
            .encode(&rendered, true, Some(false))
            .unwrap();
        assert!(ids.contains(&MARKER_IDS[0]), "{rendered}");
        if template == LIST_TEMPLATE {
            assert!(
                rendered.contains("[TOOL_CALLS] [{\"name\": \"now\", \"arguments\": {}, \"id\": \"a1b2c3d4e\"}]</s>[TOOL_RESULTS] {\"content\": 12:00, \"call_id\": \"a1b2c3d4e\"}"),
                "{rendered}"
            );
        }
        if template == ARGS_TEMPLATE {
            assert!(ids.contains(&MARKER_IDS[1]), "{rendered}");
        }
        // decoding keeps the markers and leaves other control tokens out
        let tokenizer = s.shared_tokenizer();
        let text = tokenizer
            .decode(&[1, MARKER_IDS[0], MARKER_IDS[1], 2], true)
            .unwrap();
        assert_eq!(text.trim(), "[TOOL_CALLS][ARGS]");
    }
    // the list template refuses an id that is not nine characters: the ids we give are
    let mut s = with_markers(LIST_TEMPLATE);
    let mut result = ChatMessage::new("tool", "12:00");
    result.tool_call_id = Some("call_1".into());
    let prompt = Prompt::Chat(vec![ChatMessage::new("user", "Time?"), result]);
    let options = GenerateOptions {
        sampling: greedy(2),
        tools: Some(tools),
        ..GenerateOptions::default()
    };
    let e = pollster::block_on(s.generate(&prompt, &options, &mut |_| {})).unwrap_err();
    assert!(e.to_string().contains("nine letters"), "{e}");
}
