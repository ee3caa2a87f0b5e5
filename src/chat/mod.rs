//! Chat templates: turning a conversation into the prompt text a chat model was trained on.
//!
//! Models ship their format as a Jinja template (GGUF `tokenizer.chat_template`, or
//! `chat_template` in `tokenizer_config.json`). We render it with `minijinja`, configured like
//! Hugging Face transformers' renderer: `trim_blocks` and `lstrip_blocks`, loop controls,
//! `raise_exception`, `strftime_now`, a `tojson` that writes what Python's `json.dumps` writes,
//! and Python string/dict methods (`.strip()`, `.startswith()`, `.items()`, ...) from
//! `minijinja-contrib`. Templates are untrusted input: every render runs on a fuel budget and a
//! recursion limit, and its nesting is bounded before it is compiled (`nesting`), so a template
//! cannot loop forever or exhaust the stack. Fuel also pays for data (one unit per 64 bytes
//! made): minijinja charges its own operators and filters, and the functions, filters and
//! methods added here charge for what they build before building it, so a render allocates at
//! most about `64 × RENDER_FUEL` bytes.

mod functions;
mod nesting;
mod tojson;
pub mod tool_calls;
pub mod tools;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::Serde;
use minijinja::{AutoEscape, Environment, ErrorKind, State, Value};
use serde::{Deserialize, Serialize};

use crate::format::gguf::GgufHeader;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

pub use nesting::{MAX_BLOCKS, MAX_BRACKETS, MAX_OPERATORS};

use functions::{format_filter, python_method, raise_exception, strftime_now, Raised};
use nesting::check_nesting;
use tojson::tojson;
pub use tools::{AssistantCall, ToolFormat, ToolRequest};

/// Name under which the template is stored in its environment.
const TEMPLATE_NAME: &str = "chat_template";

/// Fuel for one render: an instruction costs one unit, and 64 bytes of data made cost one. Real
/// templates spend a few hundred per message; this allows conversations of thousands of turns
/// and stops a runaway template in well under a second, before it has built 128 MiB.
pub const RENDER_FUEL: u64 = 2_000_000;

/// Bytes of data one unit of fuel pays for (minijinja's rate).
const BYTES_PER_FUEL: u64 = 64;

/// Bytes charged for each element a method or `tojson` visits or makes (a value and its slot).
const ITEM_BYTES: u64 = 64;

/// Longest text one render may write (16 MiB, millions of tokens: far past any model's
/// context). minijinja does not charge fuel for what `{{ … }}` prints, and a lazily repeated
/// list (`{{ [7] * 99999999 }}`) costs nothing until it is printed.
pub const MAX_RENDER_BYTES: usize = 16 << 20;

/// Nesting depth (macro calls, loops, includes) one render may reach.
const RECURSION_LIMIT: usize = 200;

/// One turn of a conversation. `role` is usually `system`, `user` or `assistant`; other roles
/// (`tool`, `ipython`, ...) are passed to the template unchanged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who speaks.
    pub role: String,
    /// What they say.
    pub content: String,
    /// The calls an assistant turn made (OpenAI's `tool_calls`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<AssistantCall>,
    /// The call a `tool` turn answers (`tool_call_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    /// A message from `role`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    /// The message as a template reads it: `role` and `content`, and `tool_calls` (OpenAI's
    /// shape, arguments as an object) and `tool_call_id` where the message has them.
    fn to_template(&self) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        m.insert("role".into(), self.role.clone().into());
        m.insert("content".into(), self.content.clone().into());
        if !self.tool_calls.is_empty() {
            let calls = self.tool_calls.iter().map(AssistantCall::to_template);
            m.insert("tool_calls".into(), calls.collect());
        }
        if let Some(id) = &self.tool_call_id {
            m.insert("tool_call_id".into(), id.clone().into());
        }
        serde_json::Value::Object(m)
    }
}

/// A compiled chat template and the BOS/EOS strings it may refer to.
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    kind: Kind,
    bos_token: String,
    eos_token: String,
    /// Longest output of one render, in bytes.
    output_limit: usize,
    /// How the template takes tools.
    tool_format: ToolFormat,
}

/// How a [`ChatTemplate`] renders.
#[derive(Clone, Debug)]
enum Kind {
    /// A Jinja template, compiled into its own environment.
    Jinja(Box<Environment<'static>>),
    /// The plain format of [`ChatTemplate::fallback`].
    Plain,
}

impl ChatTemplate {
    /// Compiles a Jinja chat template. `bos_token` and `eos_token` are the strings the template
    /// sees as `bos_token` / `eos_token`.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(|e| Error::Template(format!("cannot configure the template syntax: {e}")))?;
        check_nesting(source, syntax.clone())?;
        env.set_syntax(syntax);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_fuel(Some(RENDER_FUEL));
        set_print_limit(&mut env, MAX_RENDER_BYTES);
        env.set_recursion_limit(RECURSION_LIMIT);
        env.set_unknown_method_callback(python_method);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_filter("format", format_filter);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| Error::Template(format!("cannot compile the template: {e:#}")))?;
        Ok(Self {
            kind: Kind::Jinja(Box::new(env)),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            output_limit: MAX_RENDER_BYTES,
            tool_format: ToolFormat::of_template(source),
        })
    }

    /// The same template with a render budget of `fuel` units (at least 1) instead of
    /// [`RENDER_FUEL`]: a page that renders templates it does not trust may stop them sooner.
    /// A render that runs out fails with a template error, as at the default budget. The
    /// output is held to what the fuel would pay for as data (64 bytes a unit) where that is
    /// less than [`MAX_RENDER_BYTES`].
    pub fn with_fuel(mut self, fuel: u64) -> Self {
        let paid = fuel.max(1).saturating_mul(BYTES_PER_FUEL);
        self.output_limit = MAX_RENDER_BYTES.min(usize::try_from(paid).unwrap_or(usize::MAX));
        if let Kind::Jinja(env) = &mut self.kind {
            env.set_fuel(Some(fuel.max(1)));
            set_print_limit(env, self.output_limit);
        }
        self
    }

    /// A template the caller gives (a model whose file has none, such as Gemma 3's GGUF), with
    /// BOS/EOS strings from `tokenizer`.
    pub fn from_source(source: &str, tokenizer: &Tokenizer) -> Result<Self> {
        let (bos, eos) = special_strings(tokenizer);
        Self::new(source, &bos, &eos)
    }

    /// The template in GGUF metadata `tokenizer.chat_template`, if there is one. BOS/EOS strings
    /// come from `tokenizer`.
    pub fn from_gguf(header: &GgufHeader, tokenizer: &Tokenizer) -> Result<Option<Self>> {
        let Some(source) = header.get_str("tokenizer.chat_template")? else {
            return Ok(None);
        };
        let (bos, eos) = special_strings(tokenizer);
        Self::new(source, &bos, &eos).map(Some)
    }

    /// The template in a `tokenizer_config.json`: `chat_template` as a string, or as a list of
    /// `{name, template}` entries, of which we take `default`. `bos_token` / `eos_token` come
    /// from the config when it has them, otherwise from `tokenizer`.
    pub fn from_tokenizer_config(json: &[u8], tokenizer: &Tokenizer) -> Result<Option<Self>> {
        const FILE: &str = "tokenizer_config.json";
        let config: serde_json::Value = serde_json::from_slice(json)
            .map_err(|e| Error::format(FILE, format!("not valid JSON: {e}")))?;
        let source = match config.get("chat_template") {
            None | Some(serde_json::Value::Null) => return Ok(None),
            Some(serde_json::Value::String(s)) => s.as_str(),
            Some(serde_json::Value::Array(list)) => {
                let mut names = Vec::new();
                let mut found = None;
                for entry in list {
                    let name = entry.get("name").and_then(|n| n.as_str());
                    let template = entry.get("template").and_then(|t| t.as_str());
                    let (Some(name), Some(template)) = (name, template) else {
                        return Err(Error::format(
                            FILE,
                            "`chat_template` list entries need string `name` and `template`",
                        ));
                    };
                    if name == "default" {
                        found = Some(template);
                    }
                    names.push(name);
                }
                found.ok_or_else(|| {
                    Error::format(
                        FILE,
                        format!(
                            "`chat_template` has no `default` entry (it has: {})",
                            names.join(", ")
                        ),
                    )
                })?
            }
            Some(other) => {
                return Err(Error::format(
                    FILE,
                    format!("`chat_template` should be a string or a list, not {other}"),
                ))
            }
        };
        let (bos, eos) = special_strings(tokenizer);
        let bos = crate::tokenizer::config_token(&config, "bos_token").map_or(bos, str::to_string);
        let eos = crate::tokenizer::config_token(&config, "eos_token").map_or(eos, str::to_string);
        Self::new(source, &bos, &eos).map(Some)
    }

    /// A plain format for models without a template (base models):
    ///
    /// ```text
    /// System: You are terse.
    ///
    /// User: Hello
    ///
    /// Assistant:
    /// ```
    ///
    /// Each message is its role with the first letter upper-cased and the rest lower-cased, `": "`,
    /// the content and a blank line; with `add_generation_prompt` the text ends in `Assistant:`
    /// (no trailing space, which byte-level tokenizers would make a token of its own).
    pub fn fallback() -> Self {
        Self {
            kind: Kind::Plain,
            bos_token: String::new(),
            eos_token: String::new(),
            output_limit: MAX_RENDER_BYTES,
            tool_format: ToolFormat::GENERIC,
        }
    }

    /// How this template takes tools: natively (it reads `tools`, in a syntax we know) or in
    /// the generic system-prompt form.
    pub fn tool_format(&self) -> ToolFormat {
        self.tool_format
    }

    /// Renders `messages` to prompt text. With `add_generation_prompt`, the text ends where the
    /// assistant's reply begins.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// As [`Self::render`], with the tools the model may call: a template that takes tools
    /// natively reads them as `tools`; any other gets them in the generic form
    /// ([`ToolRequest::messages_for`]).
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&ToolRequest>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let converted;
        let messages = match tools {
            Some(t) => {
                converted = t.messages_for(self.tool_format, messages);
                converted.as_slice()
            }
            None => messages,
        };
        let env = match &self.kind {
            Kind::Jinja(env) => env,
            Kind::Plain => return Ok(render_plain(messages, add_generation_prompt)),
        };
        let template = env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| Error::Template(e.to_string()))?;
        let listed: Vec<serde_json::Value> =
            messages.iter().map(ChatMessage::to_template).collect();
        let tools = tools
            .filter(|_| self.tool_format.native)
            .map(|t| Value::from(Serde(t.template_tools())));
        let base = minijinja::context! {
            messages => Value::from(Serde(listed)),
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        // `tools` stays undefined without tools, as templates expect.
        let context = match tools {
            Some(tools) => minijinja::context! { tools => tools, ..base },
            None => base,
        };
        let mut out = CappedOutput {
            text: Vec::new(),
            limit: self.output_limit,
        };
        if let Err(e) = template.render_captured_to(context, &mut out) {
            if e.kind() == ErrorKind::WriteFailure {
                return Err(Error::Template(format!(
                    "the template wrote more than {} bytes, the limit of one render",
                    self.output_limit
                )));
            }
            return Err(render_error(e));
        }
        String::from_utf8(out.text)
            .map_err(|_| Error::Template("the template wrote text that is not UTF-8".into()))
    }
}

/// Prints `{{ … }}` values as minijinja does, after counting the items a printed list or map
/// holds (nested ones included): printing a value of more than `limit / 2` items (each prints
/// at least two bytes) is refused before it starts. Needed because the output limit alone
/// stops the writing but not the walk: minijinja's list printing goes on through every item
/// after a write fails, and a lazily repeated list has up to 10^8 of them.
fn set_print_limit(env: &mut Environment<'static>, limit: usize) {
    let items = limit / 2;
    env.set_formatter(move |out, state, value| {
        check_printed_items(value, items)?;
        minijinja::escape_formatter(out, state, value)
    });
}

/// Refuses `value` when it holds more than `limit` items, counting nested lists and maps; at
/// most `limit + 1` items are visited.
fn check_printed_items(value: &Value, limit: usize) -> std::result::Result<(), minijinja::Error> {
    use minijinja::value::ValueKind;
    let too_many = || {
        minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("printing a value of more than {limit} items"),
        )
    };
    let mut count = 0usize;
    let mut pending = vec![value.clone()];
    while let Some(v) = pending.pop() {
        let map = match v.kind() {
            ValueKind::Seq | ValueKind::Iterable => false,
            ValueKind::Map => true,
            _ => continue,
        };
        // Containers without a length print without iterating.
        let Some(len) = v.len() else { continue };
        if count.saturating_add(len) > limit {
            return Err(too_many());
        }
        for item in v.try_iter()? {
            count += 1;
            if count > limit {
                return Err(too_many());
            }
            let item = if map { v.get_item(&item)? } else { item };
            if matches!(
                item.kind(),
                ValueKind::Seq | ValueKind::Iterable | ValueKind::Map
            ) {
                pending.push(item);
            }
        }
    }
    Ok(())
}

/// A render's output, refusing to grow past `limit` bytes.
struct CappedOutput {
    text: Vec<u8>,
    limit: usize,
}

impl std::io::Write for CappedOutput {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if self.text.len().saturating_add(bytes.len()) > self.limit {
            return Err(std::io::Error::other("the render's output limit"));
        }
        self.text.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// [`ChatTemplate::fallback`]'s format.
fn render_plain(messages: &[ChatMessage], add_generation_prompt: bool) -> String {
    let mut out = String::new();
    for m in messages {
        let mut chars = m.role.chars();
        if let Some(first) = chars.next() {
            out.extend(first.to_uppercase());
            out.push_str(&chars.as_str().to_lowercase());
        }
        out.push_str(": ");
        out.push_str(&m.content);
        out.push_str("\n\n");
    }
    if add_generation_prompt {
        out.push_str("Assistant:");
    }
    out
}

/// The BOS and first EOS token strings of `tokenizer` (empty when it has none).
fn special_strings(tokenizer: &Tokenizer) -> (String, String) {
    let text = |id: Option<u32>| {
        id.and_then(|id| tokenizer.id_to_token(id))
            .unwrap_or_default()
    };
    (
        text(tokenizer.bos_id()),
        text(tokenizer.eos_ids().first().copied()),
    )
}

fn render_error(e: minijinja::Error) -> Error {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(err) = source {
        if let Some(raised) = err.downcast_ref::<Raised>() {
            return Error::Template(format!("the template raised an exception: {raised}"));
        }
        source = err.source();
    }
    if e.kind() == ErrorKind::OutOfFuel {
        return Error::Template(format!(
            "rendering ran out of its budget ({RENDER_FUEL} steps, or data to match, by \
             default): the template does too much work or loops without end"
        ));
    }
    Error::Template(format!("rendering failed: {e}"))
}

/// Charges `bytes` of data to the render's fuel.
fn charge(state: &State, bytes: u64) -> std::result::Result<(), minijinja::Error> {
    state.consume_fuel(bytes.div_ceil(BYTES_PER_FUEL))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_format_capitalises_any_role() {
        let m = [ChatMessage::new("ärzt", "x"), ChatMessage::new("", "y")];
        assert_eq!(render_plain(&m, false), "Ärzt: x\n\n: y\n\n");
    }
}
