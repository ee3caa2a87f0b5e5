//! Chat templates: turning a conversation into the prompt text a chat model was trained on.
//!
//! Models ship their format as a Jinja template (GGUF `tokenizer.chat_template`, or
//! `chat_template` in `tokenizer_config.json`). We render it with `minijinja`, configured like
//! Hugging Face transformers' renderer: `trim_blocks` and `lstrip_blocks`, loop controls,
//! `raise_exception`, `strftime_now`, a `tojson` that writes what Python's `json.dumps` writes,
//! and Python string/dict methods (`.strip()`, `.startswith()`, `.items()`, ...) from
//! `minijinja-contrib`. Templates are untrusted input: every render runs on a fuel budget and a
//! recursion limit, so a template cannot loop forever or exhaust the stack. Fuel also pays for
//! data (one unit per 64 bytes made): minijinja charges its own operators and filters, and the
//! functions, filters and methods added here charge for what they build before building it, so
//! a render allocates at most about `64 × RENDER_FUEL` bytes.

use std::fmt::{self, Write as _};

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Rest, Serde, ValueKind, ValueOrKwargs};
use minijinja::{AutoEscape, Environment, ErrorKind, State, Value};
use serde::{Deserialize, Serialize};

use crate::format::gguf::GgufHeader;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

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

/// Widest field (or longest precision) `str.format` may ask for.
const MAX_FORMAT_WIDTH: u64 = 4096;

/// Longest `strftime_now` format string.
const MAX_STRFTIME_FORMAT: usize = 256;

/// Nesting depth (macro calls, loops, includes) one render may reach.
const RECURSION_LIMIT: usize = 200;

/// Nesting depth `tojson` accepts.
const JSON_DEPTH_LIMIT: usize = 128;

/// One turn of a conversation. `role` is usually `system`, `user` or `assistant`; other roles
/// (`tool`, `ipython`, ...) are passed to the template unchanged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who speaks.
    pub role: String,
    /// What they say.
    pub content: String,
}

impl ChatMessage {
    /// A message from `role`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template and the BOS/EOS strings it may refer to.
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    kind: Kind,
    bos_token: String,
    eos_token: String,
}

/// How a [`ChatTemplate`] renders.
#[derive(Clone, Debug)]
enum Kind {
    /// A Jinja template, compiled into its own environment.
    Jinja(Box<Environment<'static>>),
    /// The plain format of [`ChatTemplate::fallback`].
    Plain,
}

/// The error `raise_exception` attaches, so that `render` can report the template's message.
#[derive(Debug)]
struct Raised(String);

impl fmt::Display for Raised {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

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
        env.set_syntax(syntax);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_fuel(Some(RENDER_FUEL));
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
        })
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
        }
    }

    /// Renders `messages` to prompt text. With `add_generation_prompt`, the text ends where the
    /// assistant's reply begins.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let env = match &self.kind {
            Kind::Jinja(env) => env,
            Kind::Plain => return Ok(render_plain(messages, add_generation_prompt)),
        };
        let template = env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| Error::Template(e.to_string()))?;
        let context = minijinja::context! {
            messages => Value::from(Serde(messages)),
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        template.render(context).map_err(render_error)
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
            "rendering stopped after {RENDER_FUEL} steps: the template does too much work or \
             loops without end"
        ));
    }
    Error::Template(format!("rendering failed: {e}"))
}

/// Charges `bytes` of data to the render's fuel.
fn charge(state: &State, bytes: u64) -> std::result::Result<(), minijinja::Error> {
    state.consume_fuel(bytes.div_ceil(BYTES_PER_FUEL))
}

/// Python's `str`, `dict` and `list` methods (`.strip()`, `.split()`, `.items()`, ... from
/// `minijinja-contrib`), with what each may build paid for before it is built: `replace`,
/// `join`, `split` and `format` can return far more than they are given.
fn python_method(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> std::result::Result<Value, minijinja::Error> {
    charge(state, method_output_bound(state, value, method, args)?)?;
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// An upper bound on the bytes `value.method(*args)` makes.
fn method_output_bound(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> std::result::Result<u64, minijinja::Error> {
    let Some(s) = value.as_str() else {
        // `keys()`, `items()`, `get()`, `count()` on a map or list: an item per element.
        let n = value.len().unwrap_or(1) as u64;
        return Ok(n.saturating_add(1).saturating_mul(ITEM_BYTES));
    };
    let len = s.len() as u64;
    let arg_str = |i: usize| args.get(i).and_then(Value::as_str);
    // Places `pat` matches: between every two characters when it is empty.
    let matches = |pat: &str| {
        if pat.is_empty() {
            s.chars().count() as u64 + 1
        } else {
            s.matches(pat).count() as u64
        }
    };
    Ok(match method {
        "replace" => {
            let new = arg_str(1).unwrap_or_default().len() as u64;
            let mut n = matches(arg_str(0).unwrap_or_default());
            if let Some(count) = args.get(2).and_then(|c| u64::try_from(c.clone()).ok()) {
                n = n.min(count);
            }
            len.saturating_add(n.saturating_mul(new))
        }
        "split" | "splitlines" => {
            let pieces = match (method, arg_str(0)) {
                ("splitlines", _) => matches("\n"),
                (_, Some(sep)) => matches(sep),
                // On runs of whitespace: at most one piece per two bytes.
                (_, None) => len / 2,
            };
            len.saturating_add(pieces.saturating_add(1).saturating_mul(ITEM_BYTES))
        }
        "join" => {
            let mut total = 0u64;
            if let Some(Ok(items)) = args.first().map(Value::try_iter) {
                for item in items {
                    charge(state, ITEM_BYTES)?;
                    let item_len = match item.as_str() {
                        Some(text) => text.len(),
                        None => item.to_string().len(),
                    };
                    total = total.saturating_add(len + item_len as u64);
                }
            }
            total
        }
        "format" => {
            check_format_keys(s, "{", '}')?;
            // Widths and precisions are the digit runs of the format string.
            let widest = s
                .split(|c: char| !c.is_ascii_digit())
                .filter(|run| !run.is_empty())
                .map(|run| run.parse::<u64>().unwrap_or(u64::MAX))
                .max()
                .unwrap_or(0);
            if widest > MAX_FORMAT_WIDTH {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("format: width or precision {widest} is over the limit of {MAX_FORMAT_WIDTH}"),
                ));
            }
            let longest_arg = args
                .iter()
                .map(|a| a.as_str().map_or(ITEM_BYTES, |t| t.len() as u64))
                .max()
                .unwrap_or(0);
            let fields = s.matches('{').count() as u64;
            len.saturating_add(fields.saturating_mul(longest_arg.saturating_add(MAX_FORMAT_WIDTH)))
        }
        // Case mapping makes a string at most three times longer; the others return less.
        _ => len.saturating_mul(3),
    })
}

/// minijinja's format-string parsers step through a field's key byte by byte and panic inside a
/// character of several bytes (`'%(é)s' | format(...)`, `'{0[é]}'.format(...)`): keys of fields
/// opened by `open` (up to `close`) must be ASCII.
fn check_format_keys(
    s: &str,
    open: &str,
    close: char,
) -> std::result::Result<(), minijinja::Error> {
    let mut rest = s;
    while let Some(at) = rest.find(open) {
        rest = &rest[at + open.len()..];
        let field = rest.split(close).next().unwrap_or_default();
        if !field.is_ascii() {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("format: the field `{open}{field}` has a non-ASCII key"),
            ));
        }
    }
    Ok(())
}

/// The `format` filter (printf style), with field keys checked first.
fn format_filter(
    state: &mut State,
    format_str: &Value,
    args: Rest<ValueOrKwargs>,
) -> std::result::Result<Value, minijinja::Error> {
    if let Some(s) = format_str.as_str() {
        check_format_keys(s, "%(", ')')?;
    }
    minijinja::filters::format(state, format_str, args)
}

/// `raise_exception(message)`: templates call it to reject a conversation.
fn raise_exception(message: String) -> std::result::Result<Value, minijinja::Error> {
    Err(
        minijinja::Error::new(ErrorKind::InvalidOperation, "raise_exception called")
            .with_source(Raised(message)),
    )
}

/// `strftime_now(format)`: the local time formatted with C `strftime` directives, as templates
/// that print today's date (Llama 3.x) expect.
fn strftime_now(format: String) -> std::result::Result<String, minijinja::Error> {
    use chrono::format::{Item, StrftimeItems};
    if format.len() > MAX_STRFTIME_FORMAT {
        return Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "strftime_now: the format is {} bytes long, over the limit of \
                 {MAX_STRFTIME_FORMAT}",
                format.len()
            ),
        ));
    }
    let items: Vec<Item<'_>> = StrftimeItems::new(&format).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: invalid format `{format}`"),
        ));
    }
    let mut out = String::new();
    write!(
        out,
        "{}",
        chrono::Local::now().format_with_items(items.iter())
    )
    .map_err(|_| {
        minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: cannot format with `{format}`"),
        )
    })?;
    Ok(out)
}

/// How `tojson` lays out its output (Python `json.dumps` options), and what pays for it.
struct JsonStyle<'a> {
    indent: Option<usize>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
    /// Called with the bytes about to be written (or an item about to be visited) first.
    charge: &'a dyn Fn(u64) -> std::result::Result<(), minijinja::Error>,
}

/// `value | tojson(indent=None, sort_keys=False, ensure_ascii=False, separators=None)`: what
/// transformers' `tojson` (Python `json.dumps`) produces, without Jinja's HTML escaping.
fn tojson(
    state: &State,
    value: &Value,
    indent: Option<usize>,
    kwargs: Kwargs,
) -> std::result::Result<String, minijinja::Error> {
    let indent = match kwargs.get::<Option<usize>>("indent")? {
        Some(i) => Some(i),
        None => indent,
    };
    let (item_sep, key_sep) = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(seps) => match <[String; 2]>::try_from(seps) {
            Ok([item, key]) => (item, key),
            Err(_) => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: `separators` must be a pair of strings",
                ))
            }
        },
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let style = JsonStyle {
        indent,
        item_sep,
        key_sep,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        charge: &|bytes| charge(state, bytes),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(value, &style, 0, &mut out)?;
    Ok(out)
}

fn json_error(message: impl Into<String>) -> minijinja::Error {
    minijinja::Error::new(ErrorKind::InvalidOperation, message.into())
}

fn write_json_string(
    s: &str,
    style: &JsonStyle<'_>,
    out: &mut String,
) -> std::result::Result<(), minijinja::Error> {
    // At most 6 bytes per byte (`\u0001`) once quoted and escaped.
    (style.charge)((s.len() as u64).saturating_mul(6).saturating_add(2))?;
    // serde_json escapes exactly what Python's json.dumps(ensure_ascii=False) escapes.
    let quoted = serde_json::Value::String(s.to_string()).to_string();
    if !style.ensure_ascii {
        out.push_str(&quoted);
        return Ok(());
    }
    for c in quoted.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        }
    }
    Ok(())
}

fn newline_indent(
    style: &JsonStyle<'_>,
    depth: usize,
    out: &mut String,
) -> std::result::Result<(), minijinja::Error> {
    if let Some(width) = style.indent {
        let spaces = width.saturating_mul(depth);
        (style.charge)((spaces as u64).saturating_add(1))?;
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', spaces));
    }
    Ok(())
}

/// Writes a separator, paid for first (`separators` may be long strings).
fn separator(
    sep: &str,
    style: &JsonStyle<'_>,
    out: &mut String,
) -> std::result::Result<(), minijinja::Error> {
    (style.charge)(sep.len() as u64)?;
    out.push_str(sep);
    Ok(())
}

fn write_json(
    value: &Value,
    style: &JsonStyle<'_>,
    depth: usize,
    out: &mut String,
) -> std::result::Result<(), minijinja::Error> {
    if depth > JSON_DEPTH_LIMIT {
        return Err(json_error("tojson: value is nested too deeply"));
    }
    (style.charge)(ITEM_BYTES)?;
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if value.is_integer() {
                // Any width minijinja has (up to 128 bits) prints as Python would.
                let _ = write!(out, "{value}");
            } else if let Ok(f) = f64::try_from(value.clone()) {
                if f.is_nan() {
                    out.push_str("NaN");
                } else if f.is_infinite() {
                    out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
                } else {
                    out.push_str(&serde_json::Value::from(f).to_string());
                }
            } else {
                let _ = write!(out, "{value}");
            }
        }
        ValueKind::String => write_json_string(value.as_str().unwrap_or_default(), style, out)?,
        ValueKind::Bytes => {
            let bytes = value.as_bytes().unwrap_or_default();
            write_json_string(&String::from_utf8_lossy(bytes), style, out)?;
        }
        ValueKind::Seq | ValueKind::Iterable => {
            // An iterable may be lazy and long: each item is paid for as it comes.
            let items = value
                .try_iter()?
                .map(|item| (style.charge)(ITEM_BYTES).map(|()| item))
                .collect::<std::result::Result<Vec<Value>, _>>()?;
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    separator(&style.item_sep, style, out)?;
                }
                newline_indent(style, depth + 1, out)?;
                write_json(item, style, depth + 1, out)?;
            }
            newline_indent(style, depth, out)?;
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if style.sort_keys {
                keys.sort();
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    separator(&style.item_sep, style, out)?;
                }
                newline_indent(style, depth + 1, out)?;
                // JSON keys are strings; Python converts numbers, booleans and None.
                let key_text = match key.kind() {
                    ValueKind::String => key.as_str().unwrap_or_default().to_string(),
                    ValueKind::None | ValueKind::Undefined => "null".to_string(),
                    ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_string(),
                    _ => key.to_string(),
                };
                write_json_string(&key_text, style, out)?;
                separator(&style.key_sep, style, out)?;
                write_json(&value.get_item(key)?, style, depth + 1, out)?;
            }
            newline_indent(style, depth, out)?;
            out.push('}');
        }
        _ => {
            return Err(json_error(format!(
                "tojson: a value of kind {} is not JSON serializable",
                value.kind()
            )))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(v: Value, ensure_ascii: bool) -> String {
        let style = JsonStyle {
            indent: None,
            item_sep: ", ".into(),
            key_sep: ": ".into(),
            sort_keys: false,
            ensure_ascii,
            charge: &|_| Ok(()),
        };
        let mut out = String::new();
        write_json(&v, &style, 0, &mut out).unwrap();
        out
    }

    #[test]
    fn json_edge_cases_match_python() {
        assert_eq!(
            json(Value::from("🚀\u{1}"), true),
            r#""\ud83d\ude80\u0001""#
        );
        assert_eq!(json(Value::from(f64::NAN), false), "NaN");
        assert_eq!(json(Value::from(-f64::INFINITY), false), "-Infinity");
        assert_eq!(json(Value::from(1.0), false), "1.0");
        assert_eq!(json(Value::from(()), false), "null");
        assert_eq!(json(Value::UNDEFINED, false), "null");
        let mut deep = Value::from(1);
        for _ in 0..(JSON_DEPTH_LIMIT + 2) {
            deep = Value::from(vec![deep]);
        }
        let style = JsonStyle {
            indent: None,
            item_sep: ",".into(),
            key_sep: ":".into(),
            sort_keys: false,
            ensure_ascii: false,
            charge: &|_| Ok(()),
        };
        assert!(write_json(&deep, &style, 0, &mut String::new()).is_err());
    }

    #[test]
    fn plain_format_capitalises_any_role() {
        let m = [ChatMessage::new("ärzt", "x"), ChatMessage::new("", "y")];
        assert_eq!(render_plain(&m, false), "Ärzt: x\n\n: y\n\n");
    }
}
