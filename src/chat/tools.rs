//! Tools a model may call: their definitions (OpenAI's `tools`), which calls a request allows
//! (`tool_choice`, `parallel_tool_calls`), and how a conversation with tools reaches a chat
//! template ([`ToolRequest::messages_for`]).
//!
//! A template that reads `tools` and writes calls in a syntax we know ([`ToolSyntax`]) gets
//! the tools as its `tools` variable and the history as it is. Any other template gets the
//! generic form: the tools described in the system message, calls written as
//! [`ToolSyntax::Hermes`] calls in the assistant's text, and tool results as a user message of
//! `<tool_response>` blocks. The grammar that holds the model to the syntax and the reading of
//! calls back out of its text are in [`super::tool_calls`].

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::ChatMessage;
use crate::{Error, Result};

/// Longest function name, as OpenAI allows.
pub const MAX_NAME: usize = 64;

/// Most tools one request may define.
pub const MAX_TOOLS: usize = 128;

/// One function the model may call.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolDef {
    /// `function.name`: letters, digits, `_` and `-`, 1 to 64 of them.
    pub name: String,
    /// `function.description`, if given.
    pub description: Option<String>,
    /// `function.parameters`: the JSON schema of the arguments object (`{"type": "object",
    /// "properties": {}, "additionalProperties": false}` when not given: no arguments).
    pub parameters: Value,
    /// `function.strict`: schema keywords the grammar engine does not support are refused
    /// rather than ignored.
    pub strict: bool,
}

/// Which calls the model may make (`tool_choice`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// The model answers in text or calls tools, as it chooses (the default).
    #[default]
    Auto,
    /// The model answers in text; the tools are still shown to it.
    None,
    /// The model calls at least one tool, from its first token.
    Required,
    /// The model calls this function, once.
    Named(String),
}

/// The tools of one request and the calls it allows.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolRequest {
    /// The functions, in the order given; names are unique.
    pub tools: Vec<ToolDef>,
    /// Which calls are allowed.
    pub choice: ToolChoice,
    /// `parallel_tool_calls`: several calls in one answer (the default) or at most one.
    pub parallel: bool,
}

/// How a chat template expects calls to be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolSyntax {
    /// `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`, one block per call
    /// (Qwen 2.5 and 3, Hermes, SmolLM3; also the generic form).
    Hermes,
    /// One bare JSON object `{"name": …, "parameters": {…}}` as the whole answer (Llama 3.1
    /// to 3.3): one call per turn.
    Llama3,
    /// `[TOOL_CALLS] [{"name": …, "arguments": {…}}, …]` as the whole answer (Mistral 7B
    /// v0.3, Nemo, Small 2409 and 2501, Ministral 8B).
    Mistral,
    /// `[TOOL_CALLS]name[ARGS]{…}` for each call, as the whole answer (Mistral Small 3.2,
    /// Magistral, Devstral, Ministral 3).
    MistralArgs,
}

/// How a loaded model's template takes tools: the syntax, and whether the template reads the
/// tools itself or gets the generic form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToolFormat {
    /// The call syntax the model is held to.
    pub syntax: ToolSyntax,
    /// The template renders `tools` itself; otherwise the generic system-prompt form is used.
    pub native: bool,
}

impl ToolFormat {
    /// The generic form: tools in the system message, Hermes-style calls.
    pub const GENERIC: Self = Self {
        syntax: ToolSyntax::Hermes,
        native: false,
    };

    /// What a template's source says about tools: it reads `tools` and writes `<tool_call>`
    /// blocks (Hermes), asks for a JSON object with `"parameters"` (Llama 3), or writes
    /// `[TOOL_CALLS]` (Mistral: a list of calls, or `[ARGS]` after each name); anything else
    /// gets the generic form.
    pub fn of_template(source: &str) -> Self {
        let reads_tools = source.contains("tools");
        if reads_tools && source.contains("<tool_call>") {
            return Self {
                syntax: ToolSyntax::Hermes,
                native: true,
            };
        }
        if reads_tools && source.contains("\"parameters\"") && source.contains("ipython") {
            return Self {
                syntax: ToolSyntax::Llama3,
                native: true,
            };
        }
        if reads_tools && source.contains("[TOOL_CALLS]") {
            let syntax = match source.contains("[ARGS]") {
                true => ToolSyntax::MistralArgs,
                false => ToolSyntax::Mistral,
            };
            return Self {
                syntax,
                native: true,
            };
        }
        Self::GENERIC
    }

    /// `hermes`, `llama3`, `mistral`, `mistral-args`, or `generic` (tools in the system
    /// message).
    pub fn name(self) -> &'static str {
        match (self.native, self.syntax) {
            (false, _) => "generic",
            (true, ToolSyntax::Hermes) => "hermes",
            (true, ToolSyntax::Llama3) => "llama3",
            (true, ToolSyntax::Mistral) => "mistral",
            (true, ToolSyntax::MistralArgs) => "mistral-args",
        }
    }
}

fn bad(message: impl Into<String>) -> Error {
    Error::invalid("tools", message)
}

fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl ToolDef {
    /// Reads `tools[at]`: `{ "type": "function", "function": { "name", "description",
    /// "parameters", "strict" } }`.
    fn from_value(value: &Value, at: usize) -> Result<Self> {
        let map = value.as_object().ok_or_else(|| {
            bad(format!(
                "tools[{at}] must be an object {{ type, function }}"
            ))
        })?;
        if let Some(k) = map
            .keys()
            .find(|k| !["type", "function"].contains(&k.as_str()))
        {
            return Err(bad(format!(
                "tools[{at}]: unknown field `{k}` (known: type, function)"
            )));
        }
        match map.get("type").and_then(Value::as_str) {
            Some("function") => {}
            _ => {
                return Err(bad(format!(
                    "tools[{at}].type must be \"function\" (the only kind of tool), got {}",
                    map.get("type").unwrap_or(&Value::Null)
                )))
            }
        }
        let function = map
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| bad(format!("tools[{at}].function must be an object")))?;
        const KNOWN: [&str; 4] = ["name", "description", "parameters", "strict"];
        if let Some(k) = function.keys().find(|k| !KNOWN.contains(&k.as_str())) {
            return Err(bad(format!(
                "tools[{at}].function: unknown field `{k}` (known: {})",
                KNOWN.join(", ")
            )));
        }
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("tools[{at}].function.name must be a string")))?;
        if !valid_name(name) {
            return Err(bad(format!(
                "tools[{at}].function.name `{name}` must be 1 to {MAX_NAME} letters, digits, `_` or `-`"
            )));
        }
        let description = match function.get("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(v) => {
                return Err(bad(format!(
                    "tools[{at}] (`{name}`): description must be a string, got {v}"
                )))
            }
        };
        let parameters = match function.get("parameters") {
            None | Some(Value::Null) => {
                json!({"type": "object", "properties": {}, "additionalProperties": false})
            }
            Some(Value::Object(p)) => {
                if let Some(t) = p.get("type") {
                    if t != "object" {
                        return Err(bad(format!(
                            "tools[{at}] (`{name}`): parameters must describe an object (\"type\": \"object\"), got \"type\": {t}"
                        )));
                    }
                }
                Value::Object(p.clone())
            }
            Some(v) => {
                return Err(bad(format!(
                    "tools[{at}] (`{name}`): parameters must be a JSON schema object, got {v}"
                )))
            }
        };
        let strict = match function.get("strict") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                return Err(bad(format!(
                    "tools[{at}] (`{name}`): strict must be true or false, got {v}"
                )))
            }
        };
        Ok(Self {
            name: name.to_string(),
            description,
            parameters,
            strict,
        })
    }

    /// The definition as OpenAI writes it (what templates read as an item of `tools`).
    pub fn to_value(&self) -> Value {
        let mut function = Map::new();
        function.insert("name".into(), self.name.clone().into());
        if let Some(d) = &self.description {
            function.insert("description".into(), d.clone().into());
        }
        function.insert("parameters".into(), self.parameters.clone());
        json!({ "type": "function", "function": function })
    }
}

impl ToolRequest {
    /// Reads a request's `tools`, `tool_choice` and `parallel_tool_calls` (each `None` when
    /// absent). `Ok(None)` when no tools are given and the choice allows that.
    pub fn from_openai(
        tools: Option<&Value>,
        choice: Option<&Value>,
        parallel: Option<&Value>,
    ) -> Result<Option<Self>> {
        let list = match tools {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a.clone(),
            Some(v) => return Err(bad(format!("`tools` must be an array, got {v}"))),
        };
        if list.len() > MAX_TOOLS {
            return Err(bad(format!(
                "{} tools given; at most {MAX_TOOLS} are allowed",
                list.len()
            )));
        }
        let mut defs: Vec<ToolDef> = Vec::with_capacity(list.len());
        for (i, v) in list.iter().enumerate() {
            let def = ToolDef::from_value(v, i)?;
            if let Some(j) = defs.iter().position(|d| d.name == def.name) {
                return Err(bad(format!(
                    "tools[{i}] and tools[{j}] are both named `{}`: names must be unique",
                    def.name
                )));
            }
            defs.push(def);
        }
        let choice = match choice {
            None | Some(Value::Null) => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "auto" => ToolChoice::Auto,
                "none" => ToolChoice::None,
                "required" => ToolChoice::Required,
                other => {
                    return Err(Error::invalid(
                        "tool_choice",
                        format!("`{other}` is not a tool choice (auto, none, required, or {{ type: \"function\", function: {{ name }} }})"),
                    ))
                }
            },
            Some(v @ Value::Object(o)) => {
                let name = match (o.get("type").and_then(Value::as_str), o.get("function")) {
                    (Some("function"), Some(f)) => f.get("name").and_then(Value::as_str),
                    _ => None,
                };
                let name = name.ok_or_else(|| {
                    Error::invalid(
                        "tool_choice",
                        format!("an object tool choice must be {{ type: \"function\", function: {{ name }} }}, got {v}"),
                    )
                })?;
                ToolChoice::Named(name.to_string())
            }
            Some(v) => {
                return Err(Error::invalid(
                    "tool_choice",
                    format!("must be a string or an object, got {v}"),
                ))
            }
        };
        let parallel = match parallel {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                return Err(Error::invalid(
                    "parallel_tool_calls",
                    format!("must be true or false, got {v}"),
                ))
            }
        };
        if defs.is_empty() {
            return match choice {
                ToolChoice::Auto | ToolChoice::None => Ok(None),
                _ => Err(Error::invalid(
                    "tool_choice",
                    "a tool must be called, but `tools` defines none",
                )),
            };
        }
        if let ToolChoice::Named(name) = &choice {
            if !defs.iter().any(|d| &d.name == name) {
                let names: Vec<&str> = defs.iter().map(|d| d.name.as_str()).collect();
                return Err(Error::invalid(
                    "tool_choice",
                    format!(
                        "names `{name}`, which `tools` does not define (defined: {})",
                        names.join(", ")
                    ),
                ));
            }
        }
        Ok(Some(Self {
            tools: defs,
            choice,
            parallel,
        }))
    }

    /// The tools as templates read them: OpenAI's `[{ type: "function", function }]`.
    pub fn template_tools(&self) -> Value {
        Value::Array(self.tools.iter().map(ToolDef::to_value).collect())
    }

    /// The definitions the model may call under the choice (all, one, or none).
    pub fn callable(&self) -> Vec<&ToolDef> {
        match &self.choice {
            ToolChoice::None => Vec::new(),
            ToolChoice::Named(name) => self.tools.iter().filter(|d| &d.name == name).collect(),
            ToolChoice::Auto | ToolChoice::Required => self.tools.iter().collect(),
        }
    }

    /// The conversation as `format`'s template takes it: unchanged for a native template;
    /// for the generic form, the tools described in the system message, assistant calls
    /// written out as `<tool_call>` blocks, and each run of tool results as one user message.
    pub fn messages_for(&self, format: ToolFormat, messages: &[ChatMessage]) -> Vec<ChatMessage> {
        if format.native {
            return messages.to_vec();
        }
        let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
        let intro = self.generic_intro();
        match messages.first() {
            Some(m) if m.role == "system" => {
                let content = match m.content.is_empty() {
                    true => intro,
                    false => format!("{}\n\n{intro}", m.content),
                };
                out.push(ChatMessage::new("system", content));
            }
            _ => out.push(ChatMessage::new("system", intro)),
        }
        let skip = usize::from(messages.first().is_some_and(|m| m.role == "system"));
        for m in &messages[skip..] {
            match m.role.as_str() {
                "assistant" if !m.tool_calls.is_empty() => {
                    let mut text = m.content.clone();
                    for call in &m.tool_calls {
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        text.push_str(&hermes_block(&call.name, &call.arguments));
                    }
                    out.push(ChatMessage::new("assistant", text));
                }
                "tool" => {
                    let block = format!("<tool_response>\n{}\n</tool_response>", m.content);
                    match out.last_mut() {
                        Some(last)
                            if last.role == "user"
                                && last.content.ends_with("</tool_response>") =>
                        {
                            last.content.push('\n');
                            last.content.push_str(&block);
                        }
                        _ => out.push(ChatMessage::new("user", block)),
                    }
                }
                _ => out.push(ChatMessage::new(m.role.clone(), m.content.clone())),
            }
        }
        out
    }

    /// The generic form's description of the tools, for the system message.
    fn generic_intro(&self) -> String {
        let mut text = String::from(
            "You can call functions to answer. Their signatures, as JSON, are inside <tools></tools>:\n<tools>\n",
        );
        for d in &self.tools {
            text.push_str(&d.to_value().to_string());
            text.push('\n');
        }
        text.push_str(
            "</tools>\nTo call a function, write a JSON object with its name and arguments between <tool_call> and </tool_call> tags, one block per call:\n<tool_call>\n{\"name\": \"function name\", \"arguments\": {\"argument\": \"value\"}}\n</tool_call>\nA function's result comes back to you inside <tool_response></tool_response> tags. When no function helps, answer in plain text.",
        );
        text
    }
}

/// One call written as a Hermes block: `<tool_call>\n{"name": …, "arguments": …}\n</tool_call>`.
/// `arguments` is the JSON text of the arguments object (written as a string when it is not
/// valid JSON).
pub fn hermes_block(name: &str, arguments: &str) -> String {
    let args = serde_json::from_str::<Value>(arguments).unwrap_or_else(|_| arguments.into());
    format!(
        "<tool_call>\n{}\n</tool_call>",
        json!({ "name": name, "arguments": args })
    )
}

/// A call the assistant made, as a message of the history carries it (OpenAI's `tool_calls`
/// item: `{ id, type: "function", function: { name, arguments } }`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssistantCall {
    /// The call's id, which the tool result's `tool_call_id` names.
    pub id: String,
    /// The function called.
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

impl AssistantCall {
    /// Reads `messages[at].tool_calls[k]`.
    pub fn from_value(value: &Value, at: usize, k: usize) -> Result<Self> {
        let whr = format!("messages[{at}].tool_calls[{k}]");
        let bad = |what: &str| Error::invalid("request", format!("{whr}: {what}"));
        let map = value
            .as_object()
            .ok_or_else(|| bad("must be an object { id, type, function }"))?;
        let id = map.get("id").and_then(Value::as_str).unwrap_or_default();
        if let Some(t) = map.get("type") {
            if t != "function" {
                return Err(bad("type must be \"function\""));
            }
        }
        let function = map
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("function must be an object { name, arguments }"))?;
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("function.name must be a string"))?;
        let arguments = match function.get("arguments") {
            None | Some(Value::Null) => "{}".to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(v @ Value::Object(_)) => v.to_string(),
            Some(_) => return Err(bad("function.arguments must be a JSON string")),
        };
        Ok(Self {
            id: id.to_string(),
            name: name.to_string(),
            arguments,
        })
    }

    /// The call as a template reads it: OpenAI's shape, with the arguments as an object when
    /// they parse (templates write them with `tojson`).
    pub fn to_template(&self) -> Value {
        let args = serde_json::from_str::<Value>(&self.arguments)
            .unwrap_or_else(|_| self.arguments.clone().into());
        json!({
            "id": self.id,
            "type": "function",
            "function": { "name": self.name, "arguments": args },
        })
    }
}
