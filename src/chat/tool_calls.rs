//! Calls in the model's text: the grammar (llguidance's Lark dialect) that holds an answer to
//! a [`ToolSyntax`] with each call's arguments valid against its function's schema
//! ([`grammar`]), reading the calls back out of a finished answer ([`read_calls`]), and
//! splitting a streamed answer into content and calls as it comes ([`CallStream`]).
//!
//! Under `tool_choice: auto` the answer is either text that never writes the call marker, or
//! text followed by calls (Hermes), or calls as the whole answer (Llama 3: one; Mistral: a
//! `[TOOL_CALLS]` list, or `[TOOL_CALLS]name[ARGS]{…}` for each). Under `required` it is calls
//! from the first token; a named function is called exactly once. Without
//! `parallel_tool_calls` an answer holds one call at most.
//!
//! A marker that is one control token of the model's vocabulary (Mistral's `[TOOL_CALLS]` and
//! `[ARGS]`) is held to that token, and decoding keeps it in the answer's text
//! ([`crate::tokenizer::KEPT_SPECIAL_TOKENS`]), where the calls are read back from.

mod mistral;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::tools::{ToolChoice, ToolDef, ToolRequest, ToolSyntax};

pub use mistral::{MISTRAL_ARGS, MISTRAL_OPEN};

/// What opens a Hermes call.
pub const HERMES_OPEN: &str = "<tool_call>";
/// What closes a Hermes call.
pub const HERMES_CLOSE: &str = "</tool_call>";

/// A call read from the model's text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedCall {
    /// The function's name.
    pub name: String,
    /// The arguments object as compact JSON text.
    pub arguments: String,
}

/// The arguments key of a call object in `syntax` (`{"name": …, <key>: {…}}`).
fn arguments_key(syntax: ToolSyntax) -> &'static str {
    match syntax {
        ToolSyntax::Llama3 => "parameters",
        ToolSyntax::Hermes | ToolSyntax::Mistral | ToolSyntax::MistralArgs => "arguments",
    }
}

/// `def`'s parameters as calls are held to them: parameters that do not say whether other
/// properties are allowed are taken as closed (the properties they list, as OpenAI's strict
/// mode does), so that a model cannot invent arguments.
fn closed_parameters(def: &ToolDef) -> Value {
    let mut parameters = def.parameters.clone();
    if let Some(map) = parameters.as_object_mut() {
        let open = [
            "additionalProperties",
            "patternProperties",
            "unevaluatedProperties",
        ];
        if map.contains_key("properties") && !open.iter().any(|k| map.contains_key(*k)) {
            map.insert("additionalProperties".into(), false.into());
        }
    }
    parameters
}

/// The layout every generated JSON gets (llguidance's `x-guidance` options).
fn json_layout(def: &ToolDef) -> Value {
    json!({
        "item_separator": ", ",
        "key_separator": ": ",
        "whitespace_flexible": false,
        "lenient": !def.strict,
    })
}

/// The JSON schema of one call object to `def` in `syntax`: `{"name": <const>, <arguments
/// key>: <parameters>}` in that order, with the layout every generated JSON gets and the
/// parameters closed ([`closed_parameters`]).
pub fn call_schema(def: &ToolDef, syntax: ToolSyntax) -> Value {
    let key = arguments_key(syntax);
    json!({
        "type": "object",
        "properties": {
            "name": { "const": def.name },
            key: closed_parameters(def),
        },
        "required": ["name", key],
        "additionalProperties": false,
        "x-guidance": json_layout(def),
    })
}

/// The JSON schema of `def`'s arguments object alone (closed, with the generated layout).
pub fn arguments_schema(def: &ToolDef) -> Value {
    let mut schema = closed_parameters(def);
    if let Some(map) = schema.as_object_mut() {
        map.insert("x-guidance".into(), json_layout(def));
    }
    schema
}

/// Where a syntax's marker is one control token of the vocabulary: its id (a `Fn(marker
/// text) -> Option<id>`). Markers without one are held to their text.
pub type MarkerIds<'a> = &'a dyn Fn(&str) -> Option<u32>;

/// A marker in Lark: its control token (`<[id]>`) where the vocabulary has one, else its text.
fn marker(text: &str, ids: MarkerIds) -> String {
    match ids(text) {
        Some(id) => format!("<[{id}]>"),
        None => serde_json::Value::from(text).to_string(),
    }
}

/// The Lark grammar holding an answer to `request`'s choice in `syntax`, or `None` when the
/// answer is free text (`tool_choice: none`). `ids` says which markers are control tokens.
pub fn grammar(request: &ToolRequest, syntax: ToolSyntax, ids: MarkerIds) -> Option<String> {
    let callable = request.callable();
    if callable.is_empty() {
        return None;
    }
    let several = request.parallel && !matches!(request.choice, ToolChoice::Named(_));
    if syntax == ToolSyntax::MistralArgs {
        return Some(mistral::args_grammar(request, &callable, several, ids));
    }
    let mut lark = String::new();
    let names: Vec<String> = (0..callable.len()).map(|i| format!("fn_{i}")).collect();
    lark.push_str(&format!("fns: {}\n", names.join(" | ")));
    for (name, def) in names.iter().zip(&callable) {
        lark.push_str(&format!("{name}: %json {}\n", call_schema(def, syntax)));
    }
    let more = if several { " more*" } else { "" };
    match syntax {
        ToolSyntax::Hermes => {
            lark.push_str("call: \"<tool_call>\\n\" fns \"\\n</tool_call>\"\n");
            lark.push_str("more: \"\\n\" call\n");
            match request.choice {
                ToolChoice::Auto => {
                    // text that never writes the marker, or text up to the first marker
                    // (lazy: it ends at the marker) and the calls
                    lark.push_str(&format!(
                        "start: TEXT | lead \"\\n\" fns \"\\n</tool_call>\"{more}\n"
                    ));
                    lark.push_str("TEXT: /(.|\\n)*/ & ~/(.|\\n)*<tool_call>(.|\\n)*/\n");
                    lark.push_str("lead[lazy]: /(.|\\n)*<tool_call>/\n");
                }
                _ => lark.push_str(&format!("start: call{more}\n")),
            }
        }
        ToolSyntax::Llama3 => match request.choice {
            // a call is the whole answer; text never starts with `{`
            ToolChoice::Auto => {
                lark.push_str("start: TEXT | fns\nTEXT: /([^{](.|\\n)*)?/\n");
            }
            _ => lark.push_str("start: fns\n"),
        },
        ToolSyntax::Mistral => mistral::list_grammar(&mut lark, request, several, ids),
        ToolSyntax::MistralArgs => {}
    }
    Some(lark)
}

/// A Hermes (or Mistral) call object: the name, and the arguments as the model wrote them.
#[derive(Deserialize)]
struct HermesCall<'a> {
    name: String,
    #[serde(borrow)]
    arguments: Option<&'a RawValue>,
}

/// A Llama 3 call object: the name, and the arguments as the model wrote them.
#[derive(Deserialize)]
struct Llama3Call<'a> {
    name: String,
    #[serde(borrow)]
    parameters: Option<&'a RawValue>,
}

/// One call object's JSON text read as a call in `syntax` (`None` when it is not one). The
/// arguments keep the model's own text: numbers as written (`-0`, `1e3`, integers past 2^53
/// read back exactly), not a re-serialisation.
fn call_object(text: &str, syntax: ToolSyntax) -> Option<ParsedCall> {
    let text = text.trim();
    let (name, args) = match syntax {
        ToolSyntax::Llama3 => {
            let c: Llama3Call = serde_json::from_str(text).ok()?;
            (c.name, c.parameters)
        }
        ToolSyntax::Hermes | ToolSyntax::Mistral | ToolSyntax::MistralArgs => {
            let c: HermesCall = serde_json::from_str(text).ok()?;
            (c.name, c.arguments)
        }
    };
    let arguments = match args {
        Some(raw) if raw.get().starts_with('{') => raw.get().to_string(),
        Some(_) => return None,
        None => "{}".to_string(),
    };
    Some(ParsedCall { name, arguments })
}

/// What the text after a `<tool_call>` holds.
enum Block {
    /// A complete block: its call (`None` when it is not one) and the bytes it took, through
    /// `</tool_call>`.
    Done(Option<ParsedCall>, usize),
    /// The block's text has not all come.
    Incomplete,
}

/// Reads the body of a Hermes block: one JSON value, white space and `</tool_call>` (a
/// `</tool_call>` inside the value's strings does not end it). Text that is not a JSON value
/// followed by the tag ends at the first tag.
fn hermes_body(body: &str) -> Block {
    let lead = body.len() - body.trim_start().len();
    let mut values = serde_json::Deserializer::from_str(&body[lead..]).into_iter::<Value>();
    match values.next() {
        Some(Ok(_)) => {
            let end = lead + values.byte_offset();
            let after = &body[end..];
            let tail = after.trim_start();
            if tail.starts_with(HERMES_CLOSE) {
                let used = body.len() - tail.len() + HERMES_CLOSE.len();
                return Block::Done(call_object(&body[..end], ToolSyntax::Hermes), used);
            }
            if HERMES_CLOSE.starts_with(tail) {
                return Block::Incomplete;
            }
        }
        Some(Err(e)) if e.is_eof() => return Block::Incomplete,
        None => return Block::Incomplete,
        Some(Err(_)) => {}
    }
    match body.find(HERMES_CLOSE) {
        Some(close) => Block::Done(None, close + HERMES_CLOSE.len()),
        None => Block::Incomplete,
    }
}

/// A finished answer split into its text and its calls.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ReadCalls {
    /// The text before the first call (trailing white space removed when calls follow).
    pub content: String,
    /// The calls, in order.
    pub calls: Vec<ParsedCall>,
}

/// Reads `text` (a whole answer) in `syntax`: the content and every complete call. An answer
/// cut off inside a call keeps the calls before it and nothing of the cut one.
pub fn read_calls(text: &str, syntax: ToolSyntax) -> ReadCalls {
    match syntax {
        ToolSyntax::Hermes => {
            let Some(start) = text.find(HERMES_OPEN) else {
                return ReadCalls {
                    content: text.to_string(),
                    calls: Vec::new(),
                };
            };
            let mut calls = Vec::new();
            let mut rest = &text[start..];
            while let Some(open) = rest.find(HERMES_OPEN) {
                let body = &rest[open + HERMES_OPEN.len()..];
                let (call, used) = match hermes_body(body) {
                    Block::Done(call, used) => (call, used),
                    Block::Incomplete => break,
                };
                calls.extend(call);
                rest = &body[used..];
            }
            ReadCalls {
                content: text[..start].trim_end().to_string(),
                calls,
            }
        }
        ToolSyntax::Mistral | ToolSyntax::MistralArgs => match text.find(MISTRAL_OPEN) {
            Some(start) => ReadCalls {
                content: text[..start].trim_end().to_string(),
                calls: mistral::read(&text[start..], syntax),
            },
            None => ReadCalls {
                content: text.to_string(),
                calls: Vec::new(),
            },
        },
        // a call is the whole answer, from its first byte (the grammar's text never starts
        // with `{`)
        ToolSyntax::Llama3 => match text.starts_with('{') {
            true => match call_object(text, syntax) {
                Some(call) => ReadCalls {
                    content: String::new(),
                    calls: vec![call],
                },
                None => ReadCalls {
                    content: text.to_string(),
                    calls: Vec::new(),
                },
            },
            false => ReadCalls {
                content: text.to_string(),
                calls: Vec::new(),
            },
        },
    }
}

/// Splits a streamed answer into content and calls as its text comes: content is passed on
/// except for an end that may be the start of a call (held until the next text tells), and
/// each call is handed over once its text is complete.
#[derive(Clone, Debug)]
pub struct CallStream {
    syntax: ToolSyntax,
    /// Text not yet handed over: a held end of content, or the calls' text.
    pending: String,
    /// The answer has started its calls.
    in_calls: bool,
    /// No text has come yet.
    at_start: bool,
    /// Calls handed over (Mistral's, read again from the calls' whole text each time).
    sent: usize,
}

/// What one piece of streamed text gives.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamPiece {
    /// Content to send now.
    pub content: String,
    /// Calls whose text completed.
    pub calls: Vec<ParsedCall>,
}

impl CallStream {
    /// A splitter for answers in `syntax`.
    pub fn new(syntax: ToolSyntax) -> Self {
        Self {
            syntax,
            pending: String::new(),
            in_calls: false,
            at_start: true,
            sent: 0,
        }
    }

    /// Whether the answer has started its calls.
    pub fn in_calls(&self) -> bool {
        self.in_calls
    }

    /// Takes the next piece of text.
    pub fn push(&mut self, text: &str) -> StreamPiece {
        self.pending.push_str(text);
        let mut out = StreamPiece::default();
        let open = match self.syntax {
            ToolSyntax::Hermes => HERMES_OPEN,
            _ => MISTRAL_OPEN,
        };
        match self.syntax {
            ToolSyntax::Hermes | ToolSyntax::Mistral | ToolSyntax::MistralArgs => {
                if !self.in_calls {
                    match self.pending.find(open) {
                        Some(at) => {
                            out.content = self.pending[..at].trim_end().to_string();
                            self.pending.drain(..at);
                            self.in_calls = true;
                        }
                        None => {
                            let keep = held_end(&self.pending, open);
                            let send = self.pending.len() - keep;
                            out.content = self.pending[..send].to_string();
                            self.pending.drain(..send);
                        }
                    }
                }
                if self.in_calls && self.syntax != ToolSyntax::Hermes {
                    let calls = mistral::read(&self.pending, self.syntax);
                    out.calls.extend(calls.into_iter().skip(self.sent));
                    self.sent += out.calls.len();
                }
                if self.in_calls && self.syntax == ToolSyntax::Hermes {
                    while let Some(open) = self.pending.find(HERMES_OPEN) {
                        let body_at = open + HERMES_OPEN.len();
                        let Block::Done(call, used) = hermes_body(&self.pending[body_at..]) else {
                            break;
                        };
                        out.calls.extend(call);
                        self.pending.drain(..body_at + used);
                    }
                }
            }
            ToolSyntax::Llama3 => {
                if self.at_start {
                    if self.pending.is_empty() {
                        return out;
                    }
                    self.at_start = false;
                    self.in_calls = self.pending.starts_with('{');
                }
                if !self.in_calls {
                    out.content = std::mem::take(&mut self.pending);
                }
            }
        }
        out
    }

    /// The end of the answer: held content, and a call whose text ends with the answer.
    pub fn finish(&mut self) -> StreamPiece {
        let rest = std::mem::take(&mut self.pending);
        let mut out = StreamPiece::default();
        match (self.in_calls, self.syntax) {
            (false, _) => out.content = rest,
            (true, ToolSyntax::Llama3) => match call_object(&rest, self.syntax) {
                Some(call) => out.calls.push(call),
                None => out.content = rest,
            },
            (true, ToolSyntax::Hermes | ToolSyntax::Mistral | ToolSyntax::MistralArgs) => {}
        }
        out
    }
}

/// How many bytes at the end of `text` to hold back: white space and a start of the call
/// marker `open`, which the next text may complete.
fn held_end(text: &str, open: &str) -> usize {
    let marker = (1..open.len())
        .rev()
        .find(|&n| text.ends_with(&open[..n]))
        .unwrap_or(0);
    let before = &text[..text.len() - marker];
    let space = before.len() - before.trim_end().len();
    marker + space
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(choice: ToolChoice, parallel: bool) -> ToolRequest {
        let tools = json!([
            {"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "now"}},
        ]);
        let choice = match choice {
            ToolChoice::Auto => json!("auto"),
            ToolChoice::None => json!("none"),
            ToolChoice::Required => json!("required"),
            ToolChoice::Named(n) => json!({"type": "function", "function": {"name": n}}),
        };
        ToolRequest::from_openai(Some(&tools), Some(&choice), Some(&json!(parallel)))
            .unwrap()
            .unwrap()
    }

    #[test]
    fn hermes_answers_read_back_as_content_and_calls() {
        let text = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        let read = read_calls(text, ToolSyntax::Hermes);
        assert_eq!(read.content, "Let me look.");
        assert_eq!(read.calls.len(), 2);
        assert_eq!(read.calls[0].arguments, "{\"city\": \"Oslo\"}");
        // cut inside the second call: the first is kept
        let cut = &text[..text.len() - 20];
        assert_eq!(read_calls(cut, ToolSyntax::Hermes).calls.len(), 1);
        assert_eq!(read_calls("plain", ToolSyntax::Hermes).content, "plain");
        // a closing tag inside an argument's string does not end the call
        let inside = "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"q\": \"a</tool_call>b\"}}\n</tool_call>";
        let read = read_calls(inside, ToolSyntax::Hermes);
        assert_eq!(read.calls.len(), 1);
        assert_eq!(read.calls[0].arguments, "{\"q\": \"a</tool_call>b\"}");
        // numbers as written
        let exact = "<tool_call>{\"name\": \"n\", \"arguments\": {\"a\": -0, \"b\": 123456789012345678901}}</tool_call>";
        assert_eq!(
            read_calls(exact, ToolSyntax::Hermes).calls[0].arguments,
            "{\"a\": -0, \"b\": 123456789012345678901}"
        );
    }

    #[test]
    fn llama3_answers_are_one_object_or_text() {
        let call = "{\"name\": \"now\", \"parameters\": {}}";
        let read = read_calls(call, ToolSyntax::Llama3);
        assert_eq!(read.calls[0].name, "now");
        assert_eq!(read.calls[0].arguments, "{}");
        // text the grammar allows is text, whatever follows its first byte
        assert_eq!(
            read_calls(&format!(" {call}"), ToolSyntax::Llama3).calls,
            vec![]
        );
        assert_eq!(read_calls("It is noon.", ToolSyntax::Llama3).calls, vec![]);
    }

    /// `text` streamed in `syntax` in pieces of `step` characters: the content and calls the
    /// pieces give.
    pub(super) fn streamed(
        syntax: ToolSyntax,
        text: &str,
        step: usize,
    ) -> (String, Vec<ParsedCall>) {
        let mut s = CallStream::new(syntax);
        let (mut content, mut calls) = (String::new(), Vec::new());
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(step) {
            let p = s.push(&piece.iter().collect::<String>());
            content.push_str(&p.content);
            calls.extend(p.calls);
        }
        let p = s.finish();
        content.push_str(&p.content);
        calls.extend(p.calls);
        (content, calls)
    }

    #[test]
    fn a_stream_split_anywhere_gives_the_whole_answers_parts() {
        let text = "Sure <b>.\n\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"</tool_call>\"}}\n</tool_call>";
        let whole = read_calls(text, ToolSyntax::Hermes);
        for step in 1..8 {
            let (content, calls) = streamed(ToolSyntax::Hermes, text, step);
            assert_eq!(content, whole.content, "pieces of {step}");
            assert_eq!(calls, whole.calls, "pieces of {step}");
        }
        // content that only looks like a marker's start is all sent
        let mut s = CallStream::new(ToolSyntax::Hermes);
        let mut content = s.push("a <tool").content;
        content.push_str(&s.push("box> b ").content);
        content.push_str(&s.finish().content);
        assert_eq!(content, "a <toolbox> b ");
    }

    #[test]
    fn grammars_follow_the_choice() {
        let auto = grammar(
            &request(ToolChoice::Auto, true),
            ToolSyntax::Hermes,
            &|_| None,
        )
        .unwrap();
        assert!(auto.contains("start: TEXT | lead") && auto.contains("more*"));
        let single = grammar(
            &request(ToolChoice::Required, false),
            ToolSyntax::Hermes,
            &|_| None,
        )
        .unwrap();
        assert!(single.contains("start: call\n"));
        let named = grammar(
            &request(ToolChoice::Named("now".into()), true),
            ToolSyntax::Hermes,
            &|_| None,
        )
        .unwrap();
        assert!(named.contains("fns: fn_0\n") && !named.contains("get_weather"));
        assert_eq!(
            grammar(
                &request(ToolChoice::None, true),
                ToolSyntax::Hermes,
                &|_| None
            ),
            None
        );
        let llama = grammar(
            &request(ToolChoice::Auto, true),
            ToolSyntax::Llama3,
            &|_| None,
        )
        .unwrap();
        assert!(llama.contains("\"parameters\"") && llama.contains("start: TEXT | fns"));
        // Mistral's markers as control tokens where the vocabulary has them, else as text
        let ids = |m: &str| (m == MISTRAL_OPEN).then_some(5);
        let list = grammar(&request(ToolChoice::Auto, true), ToolSyntax::Mistral, &ids).unwrap();
        assert!(
            list.contains("calls: <[5]> \" \"? \"[\" fns (\", \" fns)* \"]\"\n"),
            "{list}"
        );
        assert!(list.contains("start: TEXT | calls\n"), "{list}");
        let args = grammar(
            &request(ToolChoice::Required, false),
            ToolSyntax::MistralArgs,
            &ids,
        )
        .unwrap();
        assert!(
            args.contains("fn_0: <[5]> \"get_weather\" \"[ARGS]\" %json {"),
            "{args}"
        );
        assert!(
            args.contains("start: fns\n") && !args.contains("TEXT"),
            "{args}"
        );
    }
}
