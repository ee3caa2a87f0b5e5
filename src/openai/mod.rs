//! The OpenAI-style API over a generation call: a `chat.completions` or `completions` request
//! ([`Request`]) becomes a prompt and [`GenerateOptions`], and the
//! [`Generation`] becomes the OpenAI response shape ([`response`]), streamed as
//! `chat.completion.chunk` / `text_completion` chunks when asked. The JavaScript
//! `engine.chat.completions.create` and the native `emberlm serve-api` both use it.
//!
//! Supported request fields (anything else is an error naming the field): `model`, `messages`
//! (chat) or `prompt` (completions), `stream`, `stream_options.include_usage`, `temperature`,
//! `top_p`, `max_tokens` (chat also `max_completion_tokens`), `stop`, `seed`, `n`,
//! `response_format`, `frequency_penalty`, `presence_penalty`, `logit_bias`, `logprobs`,
//! `top_logprobs` (up to 20 alternatives per token; for completions `logprobs: n`), `user`,
//! for chat `tools`, `tool_choice` and `parallel_tool_calls` (assistant messages with
//! `tool_calls` and `tool` messages with `tool_call_id` in the history), and for completions
//! `echo`. Defaults are OpenAI's
//! (temperature 1, top-p 1; `max_tokens` 16 for completions), except that `max_tokens` of a
//! chat defaults to 256 rather than to the whole context.

#[cfg(not(target_arch = "wasm32"))]
pub mod access;
pub mod embeddings;
#[cfg(not(target_arch = "wasm32"))]
pub mod http_head;
pub mod response;
mod run;
mod tool_reply;

use serde_json::{Map, Value};

use crate::chat::{AssistantCall, ChatMessage, ToolRequest};
use crate::constrain::ResponseFormat;
use crate::sampling::MAX_TOP_LOGPROBS;
use crate::session::{GenerateOptions, Prompt};
use crate::{Error, Result};

pub use response::{ChunkWriter, CompletionKind};
pub use run::{complete, model_name, Responder};

/// Most choices (`n`) one request may ask for.
pub const MAX_CHOICES: usize = 64;

/// A parsed `chat.completions` or `completions` request.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// Which endpoint the request is for.
    pub kind: CompletionKind,
    /// The `model` field as sent (echoed in the response), if any.
    pub model: Option<String>,
    /// The conversation or text to continue.
    pub prompt: Prompt,
    /// The generation options the fields map to.
    pub options: GenerateOptions,
    /// `stream: true`: answer with chunks.
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk carries the token counts.
    pub include_usage: bool,
    /// `logprobs`: report each token's log-probability.
    pub logprobs: bool,
}

fn bad(message: impl Into<String>) -> Error {
    Error::invalid("request", message)
}

fn number(map: &Map<String, Value>, key: &str) -> Result<Option<f64>> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| bad(format!("`{key}` must be a number, got {v}"))),
    }
}

fn whole(map: &Map<String, Value>, key: &str) -> Result<Option<u64>> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| bad(format!("`{key}` must be a whole number >= 0, got {v}"))),
    }
}

fn boolean(map: &Map<String, Value>, key: &str) -> Result<bool> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(bad(format!("`{key}` must be true or false, got {v}"))),
    }
}

/// The message content as text: a string, or an array of `{ type: "text", text }` parts.
fn content_text(value: &Value, at: usize) -> Result<String> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(parts) => {
            let mut text = String::new();
            for part in parts {
                match (part["type"].as_str(), part["text"].as_str()) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    _ => {
                        return Err(bad(format!(
                            "messages[{at}].content: only text parts ({{ type: \"text\", text }}) are supported, got {part}"
                        )))
                    }
                }
            }
            Ok(text)
        }
        other => Err(bad(format!(
            "messages[{at}].content must be a string or an array of text parts, got {other}"
        ))),
    }
}

fn messages(value: Option<&Value>) -> Result<Vec<ChatMessage>> {
    let list = value
        .and_then(Value::as_array)
        .ok_or_else(|| bad("`messages` must be a non-empty array of { role, content }"))?;
    if list.is_empty() {
        return Err(bad("`messages` must hold at least one message"));
    }
    // `refusal` comes back in an assistant message a client returns as it got it
    const KNOWN: [&str; 6] = [
        "role",
        "content",
        "name",
        "tool_calls",
        "tool_call_id",
        "refusal",
    ];
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let map = m.as_object().ok_or_else(|| {
            bad(format!(
                "messages[{i}] must be an object {{ role, content }}"
            ))
        })?;
        if let Some(k) = map.keys().find(|k| !KNOWN.contains(&k.as_str())) {
            return Err(bad(format!(
                "messages[{i}]: unknown field `{k}` (known: {})",
                KNOWN.join(", ")
            )));
        }
        let role = map
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("messages[{i}].role must be a string")))?;
        let role = match role {
            "developer" => "system",
            r => r,
        };
        let content = content_text(map.get("content").unwrap_or(&Value::Null), i)?;
        match map.get("refusal") {
            None | Some(Value::Null) | Some(Value::String(_)) => {}
            Some(v) => {
                return Err(bad(format!(
                    "messages[{i}].refusal must be a string or null, got {v}"
                )))
            }
        }
        let mut message = ChatMessage::new(role, content);
        match map.get("tool_calls") {
            None | Some(Value::Null) => {}
            Some(Value::Array(calls)) if role == "assistant" => {
                for (k, c) in calls.iter().enumerate() {
                    message.tool_calls.push(AssistantCall::from_value(c, i, k)?);
                }
            }
            Some(Value::Array(_)) => {
                return Err(bad(format!(
                    "messages[{i}]: only assistant messages carry `tool_calls`"
                )))
            }
            Some(v) => {
                return Err(bad(format!(
                    "messages[{i}].tool_calls must be an array, got {v}"
                )))
            }
        }
        match map.get("tool_call_id") {
            None | Some(Value::Null) => {}
            Some(Value::String(id)) => message.tool_call_id = Some(id.clone()),
            Some(v) => {
                return Err(bad(format!(
                    "messages[{i}].tool_call_id must be a string, got {v}"
                )))
            }
        }
        out.push(message);
    }
    Ok(out)
}

/// The fields both endpoints know.
const COMMON_FIELDS: &[&str] = &[
    "model",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "max_tokens",
    "stop",
    "seed",
    "n",
    "response_format",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "logprobs",
    "user",
];

/// The fields only one endpoint knows.
fn own_fields(kind: CompletionKind) -> &'static [&'static str] {
    match kind {
        CompletionKind::Chat => &[
            "messages",
            "max_completion_tokens",
            "top_logprobs",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
        ],
        CompletionKind::Text => &["prompt", "echo"],
    }
}

impl Request {
    /// Parses a request body for `kind`. Unknown fields, wrong types and values out of range
    /// are errors naming the field.
    pub fn from_json(kind: CompletionKind, body: &str) -> Result<Self> {
        let value: Value = serde_json::from_str(body)
            .map_err(|e| bad(format!("the body is not valid JSON: {e}")))?;
        Self::from_value(kind, &value)
    }

    /// As [`Self::from_json`], from a parsed body.
    pub fn from_value(kind: CompletionKind, value: &Value) -> Result<Self> {
        let map = value
            .as_object()
            .ok_or_else(|| bad("the body must be a JSON object"))?;
        let known = || COMMON_FIELDS.iter().chain(own_fields(kind));
        if let Some(k) = map.keys().find(|k| !known().any(|f| f == k)) {
            let names: Vec<&str> = known().copied().collect();
            return Err(bad(format!(
                "unknown field `{k}` for {} (known: {})",
                kind.endpoint(),
                names.join(", ")
            )));
        }
        let model = match map.get("model") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(v) => return Err(bad(format!("`model` must be a string, got {v}"))),
        };
        let prompt = match kind {
            CompletionKind::Chat => Prompt::Chat(messages(map.get("messages"))?),
            CompletionKind::Text => match map.get("prompt") {
                Some(Value::String(s)) => Prompt::Text(s.clone()),
                Some(Value::Array(a)) if a.iter().all(Value::is_u64) && !a.is_empty() => {
                    Prompt::Tokens(
                        a.iter()
                            .filter_map(Value::as_u64)
                            .map(|t| t as u32)
                            .collect(),
                    )
                }
                _ => return Err(bad("`prompt` must be a string (or an array of token ids)")),
            },
        };
        let include_usage = match map.get("stream_options") {
            None | Some(Value::Null) => false,
            Some(Value::Object(o)) => {
                if let Some(k) = o.keys().find(|k| k.as_str() != "include_usage") {
                    return Err(bad(format!("unknown field `stream_options.{k}`")));
                }
                boolean(o, "include_usage")?
            }
            Some(v) => return Err(bad(format!("`stream_options` must be an object, got {v}"))),
        };
        let (logprobs, top) = match kind {
            CompletionKind::Chat => (boolean(map, "logprobs")?, whole(map, "top_logprobs")?),
            CompletionKind::Text => {
                let n = whole(map, "logprobs")?;
                (n.is_some(), n)
            }
        };
        let top = top.unwrap_or(0);
        if top > MAX_TOP_LOGPROBS as u64 {
            let name = match kind {
                CompletionKind::Chat => "top_logprobs",
                CompletionKind::Text => "logprobs",
            };
            return Err(bad(format!(
                "`{name}` must be in 0..={MAX_TOP_LOGPROBS}, got {top}"
            )));
        }
        if top > 0 && !logprobs {
            return Err(bad("`top_logprobs` needs `logprobs: true`"));
        }
        // OpenAI's defaults (temperature 1 over the whole vocabulary), not the library's
        // `balanced` default: a client written for OpenAI gets the distribution it expects.
        let mut sampling = Map::new();
        sampling.insert("temperature".into(), 1.0.into());
        sampling.insert("top_p".into(), 1.0.into());
        sampling.insert("top_k".into(), 0.into());
        if let Some(t) = number(map, "temperature")? {
            if !(0.0..=2.0).contains(&t) {
                return Err(bad(format!("`temperature` must be in [0, 2], got {t}")));
            }
            sampling.insert("temperature".into(), t.into());
        }
        if let Some(p) = number(map, "top_p")? {
            sampling.insert("top_p".into(), p.into());
        }
        let max_tokens = match (
            whole(map, "max_tokens")?,
            whole(map, "max_completion_tokens")?,
        ) {
            (Some(_), Some(_)) => {
                return Err(bad(
                    "give `max_tokens` or `max_completion_tokens`, not both",
                ))
            }
            (a, b) => a.or(b),
        };
        let default_max = match kind {
            CompletionKind::Chat => 256,
            CompletionKind::Text => 16,
        };
        sampling.insert(
            "max_new_tokens".into(),
            max_tokens.unwrap_or(default_max).into(),
        );
        match map.get("stop") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => {
                sampling.insert("stop".into(), Value::Array(vec![s.clone().into()]));
            }
            Some(Value::Array(a)) if a.iter().all(Value::is_string) => {
                sampling.insert("stop".into(), Value::Array(a.clone()));
            }
            Some(v) => {
                return Err(bad(format!(
                    "`stop` must be a string or an array of strings, got {v}"
                )))
            }
        }
        if let Some(seed) = map.get("seed").filter(|v| !v.is_null()) {
            sampling.insert("seed".into(), seed.clone());
        }
        if let Some(n) = whole(map, "n")? {
            if n == 0 || n as usize > MAX_CHOICES {
                return Err(bad(format!("`n` must be in 1..={MAX_CHOICES}, got {n}")));
            }
            sampling.insert("num_return_sequences".into(), n.into());
        }
        for key in ["frequency_penalty", "presence_penalty"] {
            if let Some(v) = number(map, key)? {
                sampling.insert(key.into(), v.into());
            }
        }
        if let Some(bias) = map.get("logit_bias").filter(|v| !v.is_null()) {
            sampling.insert("logit_bias".into(), bias.clone());
        }
        let mut options = GenerateOptions::from_value(&Value::Object(sampling))?;
        options.echo = kind == CompletionKind::Text && boolean(map, "echo")?;
        options.top_logprobs = top as usize;
        if let Some(format) = map.get("response_format").filter(|v| !v.is_null()) {
            options.response_format = ResponseFormat::from_value(format)?;
        }
        if kind == CompletionKind::Chat {
            options.tools = ToolRequest::from_openai(
                map.get("tools"),
                map.get("tool_choice"),
                map.get("parallel_tool_calls"),
            )?;
        }
        Ok(Self {
            kind,
            model,
            prompt,
            options,
            stream: boolean(map, "stream")?,
            include_usage,
            logprobs,
        })
    }
}

#[cfg(test)]
mod tests;
