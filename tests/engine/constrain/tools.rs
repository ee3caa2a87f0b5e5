//! Tool calling on the tiny fixtures (CPU backend): the call grammar admits exactly the
//! answers of its choice, every sampled call parses and its arguments satisfy the function's
//! schema (an independent validator), the tools reach the model through a template that reads
//! them or through the generic system-prompt form, and bad definitions are refused by name.

use std::sync::Arc;

use emberlm::chat::tool_calls::{grammar, read_calls};
use emberlm::chat::tools::{ToolChoice, ToolSyntax};
use emberlm::chat::{ChatMessage, ChatTemplate, ToolRequest};
use emberlm::constrain::{Grammars, ResponseFormat};
use emberlm::format::gguf::GgufValue;
use emberlm::loader::ModelFiles;
use emberlm::session::{FinishReason, GenerateOptions, Prompt, Session};
use serde_json::{json, Value};

use super::support::{assert_valid, fixture, greedy, sampled, TOKENIZER_KINDS};
use crate::common::gguf_meta;

/// A Hermes-style template that reads `tools` (written for these tests).
const HERMES_TEMPLATE: &str = "{% if tools %}<|system|>Functions:\n{% for t in tools %}{{ t.function | tojson }}\n{% endfor %}Call one as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>\n{% endif %}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>\n{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}\n</tool_call>{% endfor %}{% endif %}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";

/// A Llama 3 style template that reads `tools` and asks for `"parameters"`.
const LLAMA3_TEMPLATE: &str = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}{% if tools %}<|ipython|>Answer with {\"name\": function name, \"parameters\": arguments}: {{ tools | tojson }}\n{% endif %}{% if add_generation_prompt %}<|assistant|>{% endif %}";

pub(super) fn tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "The weather in a city {now}",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 12},
                    "unit": {"enum": ["celsius", "fahrenheit"]}
                },
                "required": ["city", "unit"],
                "additionalProperties": false
            }
        }},
        {"type": "function", "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "integer"}},
                "required": ["a", "b"],
                "additionalProperties": false
            }
        }},
        {"type": "function", "function": {"name": "now"}}
    ])
}

pub(super) fn request(choice: Value, parallel: bool) -> ToolRequest {
    ToolRequest::from_openai(Some(&tools()), Some(&choice), Some(&json!(parallel)))
        .unwrap()
        .unwrap()
}

/// The schema of `name`'s arguments.
pub(super) fn parameters(name: &str) -> Value {
    let list = tools();
    let def = list
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == name)
        .unwrap_or_else(|| panic!("no tool `{name}`"));
    def["function"].get("parameters").cloned().unwrap_or_else(
        || json!({"type": "object", "properties": {}, "additionalProperties": false}),
    )
}

/// The tiny model `model` with `template` as its chat template.
pub(super) fn with_template(model: &str, template: &str) -> Session {
    let path = fixture(model);
    let mut meta = gguf_meta::read(&path);
    gguf_meta::set(
        &mut meta,
        "tokenizer.chat_template",
        GgufValue::String(template.to_string()),
    );
    let bytes = gguf_meta::write_with_tensors(&meta, &gguf_meta::read_tensors(&path));
    let files = ModelFiles::from_bytes(bytes, model).unwrap();
    Session::new_cpu(&files, None).unwrap()
}

fn plain_session(model: &str) -> Session {
    Session::new_cpu(&ModelFiles::open(&fixture(model)).unwrap(), None).unwrap()
}

pub(super) fn chat(
    s: &mut Session,
    tools: &ToolRequest,
    sampling: emberlm::sampling::SamplingParams,
) -> emberlm::session::Generation {
    let options = GenerateOptions {
        sampling,
        tools: Some(tools.clone()),
        ..GenerateOptions::default()
    };
    let prompt = Prompt::Chat(vec![ChatMessage::new("user", "Weather in Oslo?")]);
    pollster::block_on(s.generate(&prompt, &options, &mut |_| {})).unwrap()
}

/// Whether `text` is a whole answer in the grammar of `tools` for `syntax`.
pub(super) fn admits(
    grammars: &Grammars,
    tokenizer: &emberlm::tokenizer::Tokenizer,
    tools: &ToolRequest,
    syntax: ToolSyntax,
    text: &str,
) -> bool {
    let lark = grammar(tools, syntax, &|m| tokenizer.control_token(m)).expect("a grammar");
    let constraint = grammars
        .compile(&ResponseFormat::Lark(lark))
        .unwrap()
        .unwrap();
    // control tokens written in the text become their ids (markers held to their token)
    let ids = tokenizer.encode(text, true, Some(false)).unwrap();
    let mut state = constraint.start();
    let valid = state.valid_prefix(&ids).unwrap();
    if valid < ids.len() {
        return false;
    }
    for id in ids {
        state.accept(id).unwrap();
    }
    state.is_complete()
}

#[test]
fn the_call_grammar_admits_exactly_its_choices_answers() {
    let files = ModelFiles::open(&fixture("tiny-llama-f32.gguf")).unwrap();
    let tokenizer = Arc::new(files.tokenizer().unwrap());
    let vocab = files
        .weights()
        .unwrap()
        .config
        .vocab_size
        .min(tokenizer.vocab_size());
    let eos = tokenizer.eos_ids().first().copied().unwrap_or(0);
    let grammars = Grammars::new(&tokenizer, vocab, eos).unwrap();
    let ok = |t: &ToolRequest, syntax, text: &str| admits(&grammars, &tokenizer, t, syntax, text);

    let weather = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"unit\": \"celsius\"}}\n</tool_call>";
    let now = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
    let auto = request(json!("auto"), true);
    let hermes = ToolSyntax::Hermes;
    assert!(ok(&auto, hermes, "It is sunny."));
    assert!(ok(&auto, hermes, ""));
    assert!(ok(&auto, hermes, weather));
    assert!(ok(&auto, hermes, &format!("Let me look.\n{weather}")));
    assert!(ok(&auto, hermes, &format!("{weather}\n{now}")));
    // text may not write the marker without making a call, nor go on after the calls
    assert!(!ok(&auto, hermes, "a <tool_call> b"));
    assert!(!ok(&auto, hermes, &format!("{weather} and more")));
    // the arguments follow the schema and the name is one of the tools
    assert!(!ok(&auto, hermes, &weather.replace("celsius", "kelvin")));
    assert!(!ok(
        &auto,
        hermes,
        &weather.replace("get_weather", "get_time")
    ));
    assert!(!ok(
        &auto,
        hermes,
        &weather.replace("\"Oslo\"", "\"Llanfairpwllgwyngyll\"")
    ));

    let single = request(json!("auto"), false);
    assert!(ok(&single, hermes, weather));
    assert!(!ok(&single, hermes, &format!("{weather}\n{now}")));

    let required = request(json!("required"), true);
    assert!(!ok(&required, hermes, "It is sunny."));
    assert!(ok(&required, hermes, &format!("{weather}\n{now}")));

    let named = request(
        json!({"type": "function", "function": {"name": "now"}}),
        true,
    );
    assert!(ok(&named, hermes, now));
    assert!(!ok(&named, hermes, weather));
    assert!(!ok(&named, hermes, &format!("{now}\n{now}")));

    let llama = ToolSyntax::Llama3;
    let call = "{\"name\": \"add\", \"parameters\": {\"a\": 2, \"b\": -3}}";
    assert!(ok(&auto, llama, call));
    assert!(ok(&auto, llama, "Two."));
    assert!(!ok(&auto, llama, &call.replace("parameters", "arguments")));
    assert!(!ok(&auto, llama, &call.replace("2,", "200,")));
    assert!(!ok(&required, llama, "Two."));
}

#[test]
fn every_sampled_call_parses_and_satisfies_its_schema() {
    for model in TOKENIZER_KINDS {
        for (template, syntax) in [
            (HERMES_TEMPLATE, ToolSyntax::Hermes),
            (LLAMA3_TEMPLATE, ToolSyntax::Llama3),
        ] {
            let mut s = with_template(model, template);
            assert_eq!(s.tool_format().syntax, syntax);
            assert!(s.tool_format().native);
            for choice in [
                json!("required"),
                json!({"type": "function", "function": {"name": "get_weather"}}),
            ] {
                let tools = request(choice.clone(), true);
                let samplings = (0..20)
                    .map(|seed| sampled(seed, 160))
                    .chain(std::iter::once(greedy(160)));
                for (i, sampling) in samplings.enumerate() {
                    let g = chat(&mut s, &tools, sampling);
                    let seq = &g.sequences[0];
                    let what = format!("{model} {syntax:?} {choice} #{i}: {:?}", seq.text);
                    let read = read_calls(&seq.text, syntax);
                    assert!(!read.calls.is_empty(), "{what}");
                    if let ToolChoice::Named(name) = &tools.choice {
                        // one call and the end: nothing else may follow
                        assert_eq!(seq.finish_reason, FinishReason::Stop, "{what}");
                        assert_eq!(read.calls.len(), 1, "{what}");
                        assert_eq!(&read.calls[0].name, name, "{what}");
                    }
                    for call in &read.calls {
                        assert_valid(&parameters(&call.name), &call.arguments, &what);
                    }
                }
            }
        }
    }
}

#[test]
fn auto_answers_are_text_or_calls_that_parse() {
    let mut s = plain_session("tiny-llama-f32.gguf");
    assert_eq!(s.tool_format().name(), "generic");
    let tools = request(json!("auto"), true);
    let mut texts = 0;
    for seed in 0..20 {
        let g = chat(&mut s, &tools, sampled(seed, 60));
        let seq = &g.sequences[0];
        let read = read_calls(&seq.text, ToolSyntax::Hermes);
        if read.calls.is_empty() {
            assert!(!seq.text.contains("<tool_call>"), "{:?}", seq.text);
            texts += 1;
        }
        for call in &read.calls {
            assert_valid(&parameters(&call.name), &call.arguments, &seq.text);
        }
    }
    assert!(
        texts > 0,
        "a random model under `auto` should answer in text sometimes"
    );
}

#[test]
fn tools_reach_the_model_through_its_template_or_the_generic_form() {
    let tools = request(json!("auto"), true);
    let mut assistant = ChatMessage::new("assistant", "");
    assistant.tool_calls = vec![emberlm::chat::AssistantCall {
        id: "call_1".into(),
        name: "now".into(),
        arguments: "{}".into(),
    }];
    let mut result = ChatMessage::new("tool", "12:00");
    result.tool_call_id = Some("call_1".into());
    let messages = vec![
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Time?"),
        assistant,
        result.clone(),
        result,
    ];

    let native = ChatTemplate::new(HERMES_TEMPLATE, "", "").unwrap();
    let text = native
        .render_with_tools(&messages, Some(&tools), true)
        .unwrap();
    assert!(
        text.starts_with("<|system|>Functions:\n{\"name\": \"get_weather\""),
        "{text}"
    );
    assert!(text.contains("<|assistant|><tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call><|tool|>12:00<|tool|>12:00<|assistant|>"), "{text}");
    // without tools the template sees none
    let bare = native.render(&messages[..2], true).unwrap();
    assert_eq!(bare, "<|system|>Be brief.<|user|>Time?<|assistant|>");

    // a template that does not read tools: they go into the system message
    let chatml = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";
    let generic = ChatTemplate::new(chatml, "", "").unwrap();
    assert_eq!(generic.tool_format().name(), "generic");
    let text = generic
        .render_with_tools(&messages, Some(&tools), true)
        .unwrap();
    assert!(
        text.starts_with("<|system|>Be brief.\n\nYou can call functions"),
        "{text}"
    );
    assert!(
        text.contains("{\"type\":\"function\",\"function\":{\"name\":\"get_weather\""),
        "{text}"
    );
    assert!(
        text.contains(
            "<|assistant|><tool_call>\n{\"name\":\"now\",\"arguments\":{}}\n</tool_call>\n"
        ),
        "{text}"
    );
    assert!(text.contains("<|user|><tool_response>\n12:00\n</tool_response>\n<tool_response>\n12:00\n</tool_response>\n<|assistant|>"), "{text}");
    assert!(!text.contains("<|tool|>"), "{text}");
}

#[test]
fn bad_tool_definitions_are_refused_by_name() {
    let refused = |tools: Value, choice: Value| -> String {
        ToolRequest::from_openai(Some(&tools), Some(&choice), None)
            .unwrap_err()
            .to_string()
    };
    let f = |name: &str, parameters: Value| json!({"type": "function", "function": {"name": name, "parameters": parameters}});
    let obj = json!({"type": "object"});
    let e = refused(
        json!([f("a", obj.clone()), f("a", obj.clone())]),
        json!("auto"),
    );
    assert!(
        e.contains("tools[1] and tools[0]") && e.contains("`a`"),
        "{e}"
    );
    let e = refused(json!([f("bad name", obj.clone())]), json!("auto"));
    assert!(e.contains("`bad name`"), "{e}");
    let e = refused(json!([f("a", json!({"type": "string"}))]), json!("auto"));
    assert!(e.contains("(`a`)") && e.contains("object"), "{e}");
    let e = refused(
        json!([f("a", obj.clone())]),
        json!({"type": "function", "function": {"name": "b"}}),
    );
    assert!(e.contains("`b`") && e.contains("defined: a"), "{e}");
    let e = refused(json!([]), json!("required"));
    assert!(e.contains("tool_choice"), "{e}");
    let e = refused(json!([f("a", obj.clone())]), json!("sometimes"));
    assert!(e.contains("`sometimes`"), "{e}");

    // parameters that parse but that the grammar engine cannot hold calls to
    let bad = ToolRequest::from_openai(
        Some(&json!([
            f("ok", obj.clone()),
            f(
                "broken",
                json!({"type": "object", "properties": {"x": {"$ref": "#/nowhere"}}})
            )
        ])),
        Some(&json!("auto")),
        None,
    )
    .unwrap()
    .unwrap();
    let mut s = plain_session("tiny-llama-f32.gguf");
    let options = GenerateOptions {
        tools: Some(bad),
        ..GenerateOptions::default()
    };
    let prompt = Prompt::Chat(vec![ChatMessage::new("user", "hi")]);
    let e = pollster::block_on(s.generate(&prompt, &options, &mut |_| {}))
        .unwrap_err()
        .to_string();
    assert!(e.contains("tools[1] (`broken`)"), "{e}");

    // a constraining response format beside callable tools is refused
    let options = GenerateOptions {
        tools: Some(request(json!("auto"), true)),
        response_format: ResponseFormat::JsonObject,
        ..GenerateOptions::default()
    };
    let e = pollster::block_on(s.generate(&prompt, &options, &mut |_| {}))
        .unwrap_err()
        .to_string();
    assert!(e.contains("response_format"), "{e}");
}
