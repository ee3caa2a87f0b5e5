//! The `tojson` filter: what Python's `json.dumps` writes, paid for as it is written.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{ErrorKind, State, Value};

use super::{charge, ITEM_BYTES};

/// Nesting depth `tojson` accepts.
const JSON_DEPTH_LIMIT: usize = 128;

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
pub(super) fn tojson(
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
}
