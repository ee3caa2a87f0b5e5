//! [`ResponseFormat`]: what shape a generation's text must have, parsed from the OpenAI-style
//! `response_format` object (and its extensions for regular expressions and grammars).

use serde_json::{json, Map, Value};

use crate::{Error, Result};

/// Largest grammar, regular expression or schema accepted, in bytes of its text.
pub const MAX_SOURCE_BYTES: usize = 1 << 20;

/// Deepest nesting accepted: JSON levels of a schema, brackets of a grammar or regex. The
/// compilers recurse once or more per level; deeper input would overflow a thread's stack
/// (wasm's 1 MiB first), which aborts instead of failing.
pub const MAX_NESTING: usize = 48;

/// The shape the generated text must have.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum ResponseFormat {
    /// Free text (no constraint).
    #[default]
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON valid under a JSON schema.
    JsonSchema {
        /// The schema (draft 2020-12 and earlier keywords; `x-guidance` options allowed).
        schema: Value,
        /// `true`: a keyword the compiler does not support is an error; `false`: it is
        /// ignored (the output then obeys the rest of the schema).
        strict: bool,
    },
    /// Text matching a regular expression (Rust `regex` syntax), anchored at both ends.
    Regex(String),
    /// Text of a Lark grammar (`start` is the start rule).
    Lark(String),
    /// Text of a llama.cpp GBNF grammar (`root` is the start rule).
    Gbnf(String),
}

fn field<'a>(map: &'a Map<String, Value>, key: &str, kind: &str) -> Result<&'a Value> {
    map.get(key).ok_or_else(|| {
        Error::invalid(
            "response_format",
            format!("`{{ type: \"{kind}\" }}` needs the field `{key}`"),
        )
    })
}

fn text_field(map: &Map<String, Value>, key: &str, kind: &str) -> Result<String> {
    let text = field(map, key, kind)?
        .as_str()
        .ok_or_else(|| Error::invalid("response_format", format!("`{key}` must be a string")))?;
    check_size(key, text.len())?;
    Ok(text.to_string())
}

pub(super) fn check_size(what: &str, bytes: usize) -> Result<()> {
    if bytes > MAX_SOURCE_BYTES {
        return Err(Error::invalid(
            "response_format",
            format!("the {what} is {bytes} bytes; at most {MAX_SOURCE_BYTES} are accepted"),
        ));
    }
    Ok(())
}

/// Refuses fields other than `allowed`, naming the first.
fn only(map: &Map<String, Value>, allowed: &[&str], kind: &str) -> Result<()> {
    match map.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(Error::invalid(
            "response_format",
            format!(
                "unknown field `{k}` for type \"{kind}\" (known: {})",
                allowed.join(", ")
            ),
        )),
        None => Ok(()),
    }
}

/// A schema given as an object or as a string holding one.
fn schema_value(value: &Value) -> Result<Value> {
    match value {
        Value::String(text) => {
            check_size("schema", text.len())?;
            serde_json::from_str(text).map_err(|e| {
                Error::invalid(
                    "response_format",
                    format!("the schema is not valid JSON: {e}"),
                )
            })
        }
        Value::Object(_) | Value::Bool(_) => {
            check_size("schema", value.to_string().len())?;
            Ok(value.clone())
        }
        _ => Err(Error::invalid(
            "response_format",
            "the schema must be a JSON object (or a string holding one)",
        )),
    }
}

/// How deeply `value`'s arrays and objects nest (a scalar is 0), without recursion.
fn json_depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 1usize)];
    while let Some((v, depth)) = stack.pop() {
        match v {
            Value::Array(a) => stack.extend(a.iter().map(|c| (c, depth + 1))),
            Value::Object(o) => stack.extend(o.values().map(|c| (c, depth + 1))),
            _ => continue,
        }
        deepest = deepest.max(depth);
    }
    deepest
}

/// The deepest run of unclosed `(`, `[` and `{` in `text` (quotes are not understood: a
/// bracket inside a string literal counts too, which only errs on the safe side).
fn bracket_depth(text: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    for b in text.bytes() {
        match b {
            b'(' | b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

impl ResponseFormat {
    /// Parses `{ type: "text" | "json_object" | "json_schema" | "regex" | "lark" | "gbnf" |
    /// "grammar", ... }`: `json_schema` takes `json_schema: { name, description, schema,
    /// strict }` (OpenAI); `json_object` may carry a `schema` (object or string, as WebLLM
    /// allows); `regex` takes `regex`, `lark` takes `lark`, `gbnf` takes `gbnf`, and
    /// `grammar` takes a GBNF `grammar` (WebLLM's spelling). Unknown fields are errors.
    pub fn from_value(value: &Value) -> Result<Self> {
        let map = value.as_object().ok_or_else(|| {
            Error::invalid(
                "response_format",
                "must be an object such as { type: \"json_object\" }",
            )
        })?;
        let kind = field(map, "type", "...")?
            .as_str()
            .ok_or_else(|| Error::invalid("response_format", "`type` must be a string"))?;
        match kind {
            "text" => {
                only(map, &["type"], kind)?;
                Ok(Self::Text)
            }
            "json_object" => {
                only(map, &["type", "schema"], kind)?;
                match map.get("schema") {
                    None | Some(Value::Null) => Ok(Self::JsonObject),
                    Some(s) => Ok(Self::JsonSchema {
                        schema: schema_value(s)?,
                        strict: true,
                    }),
                }
            }
            "json_schema" => {
                only(map, &["type", "json_schema"], kind)?;
                let inner = field(map, "json_schema", kind)?.as_object().ok_or_else(|| {
                    Error::invalid("response_format", "`json_schema` must be an object")
                })?;
                only(inner, &["name", "description", "schema", "strict"], "json_schema")?;
                let schema = match inner.get("schema") {
                    Some(s) => schema_value(s)?,
                    None => json!({}),
                };
                let strict = match inner.get("strict") {
                    None | Some(Value::Null) => true,
                    Some(Value::Bool(b)) => *b,
                    Some(other) => {
                        return Err(Error::invalid(
                            "response_format",
                            format!("`json_schema.strict` must be true or false, got {other}"),
                        ))
                    }
                };
                Ok(Self::JsonSchema { schema, strict })
            }
            "regex" => {
                only(map, &["type", "regex"], kind)?;
                Ok(Self::Regex(text_field(map, "regex", kind)?))
            }
            "lark" => {
                only(map, &["type", "lark"], kind)?;
                Ok(Self::Lark(text_field(map, "lark", kind)?))
            }
            "gbnf" => {
                only(map, &["type", "gbnf"], kind)?;
                Ok(Self::Gbnf(text_field(map, "gbnf", kind)?))
            }
            "grammar" => {
                only(map, &["type", "grammar"], kind)?;
                Ok(Self::Gbnf(text_field(map, "grammar", kind)?))
            }
            other => Err(Error::invalid(
                "response_format",
                format!(
                    "unknown type \"{other}\" (known: text, json_object, json_schema, regex, lark, gbnf, grammar)"
                ),
            )),
        }
    }

    /// The object [`Self::from_value`] reads back as this format.
    pub fn to_value(&self) -> Value {
        match self {
            Self::Text => json!({ "type": "text" }),
            Self::JsonObject => json!({ "type": "json_object" }),
            Self::JsonSchema { schema, strict } => {
                json!({ "type": "json_schema", "json_schema": { "schema": schema, "strict": strict } })
            }
            Self::Regex(r) => json!({ "type": "regex", "regex": r }),
            Self::Lark(g) => json!({ "type": "lark", "lark": g }),
            Self::Gbnf(g) => json!({ "type": "gbnf", "gbnf": g }),
        }
    }

    /// Refuses a source larger than [`MAX_SOURCE_BYTES`] or nested deeper than
    /// [`MAX_NESTING`].
    pub fn check_limits(&self) -> Result<()> {
        let (what, bytes, depth) = match self {
            Self::Text | Self::JsonObject => return Ok(()),
            Self::JsonSchema { schema, .. } => {
                ("schema", schema.to_string().len(), json_depth(schema))
            }
            Self::Regex(t) => ("regex", t.len(), bracket_depth(t)),
            Self::Lark(t) => ("lark", t.len(), bracket_depth(t)),
            Self::Gbnf(t) => ("gbnf", t.len(), bracket_depth(t)),
        };
        check_size(what, bytes)?;
        if depth > MAX_NESTING {
            return Err(Error::invalid(
                "response_format",
                format!("the {what} nests {depth} levels deep; at most {MAX_NESTING} are accepted"),
            ));
        }
        Ok(())
    }

    /// Whether this format constrains the text at all.
    pub fn is_constrained(&self) -> bool {
        !matches!(self, Self::Text)
    }

    /// The format's name for messages: `json_object`, `json_schema`, `regex` ...
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::JsonObject => "json_object",
            Self::JsonSchema { .. } => "json_schema",
            Self::Regex(_) => "regex",
            Self::Lark(_) => "lark",
            Self::Gbnf(_) => "gbnf",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ResponseFormat> {
        ResponseFormat::from_value(&serde_json::from_str(text).expect("test JSON"))
    }

    #[test]
    fn every_kind_round_trips_through_its_object() {
        for text in [
            r#"{"type":"text"}"#,
            r#"{"type":"json_object"}"#,
            r#"{"type":"json_schema","json_schema":{"schema":{"type":"integer"},"strict":false}}"#,
            r#"{"type":"regex","regex":"[0-9]+"}"#,
            r#"{"type":"lark","lark":"start: \"a\""}"#,
            r#"{"type":"gbnf","gbnf":"root ::= \"a\""}"#,
        ] {
            let format = parse(text).expect(text);
            assert_eq!(
                ResponseFormat::from_value(&format.to_value()).expect(text),
                format
            );
        }
        assert_eq!(
            parse(r#"{"type":"grammar","grammar":"root ::= \"a\""}"#).expect("grammar"),
            ResponseFormat::Gbnf("root ::= \"a\"".into())
        );
        assert_eq!(
            parse(r#"{"type":"json_object","schema":"{\"type\":\"string\"}"}"#).expect("webllm"),
            ResponseFormat::JsonSchema {
                schema: json!({"type":"string"}),
                strict: true
            }
        );
    }

    #[test]
    fn errors_name_the_unknown_field_or_type() {
        let e = parse(r#"{"type":"json_object","shema":{}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `shema`"), "{e}");
        let e = parse(r#"{"type":"xml"}"#).unwrap_err().to_string();
        assert!(e.contains("unknown type \"xml\""), "{e}");
        let e = parse(r#"{"type":"regex"}"#).unwrap_err().to_string();
        assert!(e.contains("needs the field `regex`"), "{e}");
        let e = parse(r#"{"type":"json_schema","json_schema":{"schema":"{"}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not valid JSON"), "{e}");
        let deep = format!(
            "{}a{}",
            "(".repeat(MAX_NESTING + 1),
            ")".repeat(MAX_NESTING + 1)
        );
        let e = ResponseFormat::Regex(deep)
            .check_limits()
            .unwrap_err()
            .to_string();
        assert!(e.contains("nests 49 levels deep"), "{e}");
        // the innermost object is the first level
        let mut schema = json!({"type": "integer"});
        for _ in 1..MAX_NESTING {
            schema = json!({ "items": schema });
        }
        let format = ResponseFormat::JsonSchema {
            schema: schema.clone(),
            strict: true,
        };
        assert!(format.check_limits().is_ok(), "{MAX_NESTING} levels pass");
        let format = ResponseFormat::JsonSchema {
            schema: json!({ "items": schema }),
            strict: true,
        };
        assert!(format.check_limits().is_err(), "one more does not");
        let big = "a".repeat(MAX_SOURCE_BYTES + 1);
        let e = ResponseFormat::from_value(&json!({"type":"regex","regex":big}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("at most"), "{e}");
    }
}
