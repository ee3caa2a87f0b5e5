//! The functions, filters and methods added to a template's environment: `raise_exception`,
//! `strftime_now`, the `format` filter and Python's string, dict and list methods, each paying
//! for what it builds before building it.

use std::fmt::{self, Write as _};

use minijinja::value::{Rest, ValueOrKwargs};
use minijinja::{ErrorKind, State, Value};

use super::{charge, ITEM_BYTES};

/// Widest field (or longest precision) `str.format` may ask for.
const MAX_FORMAT_WIDTH: u64 = 4096;

/// Longest `strftime_now` format string.
const MAX_STRFTIME_FORMAT: usize = 256;

/// The error `raise_exception` attaches, so that `render` can report the template's message.
#[derive(Debug)]
pub(super) struct Raised(String);

impl fmt::Display for Raised {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

/// Python's `str`, `dict` and `list` methods (`.strip()`, `.split()`, `.items()`, ... from
/// `minijinja-contrib`), with what each may build paid for before it is built: `replace`,
/// `join`, `split` and `format` can return far more than they are given.
pub(super) fn python_method(
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
/// character of several bytes (`'%(é)s' | format(...)`, `'{0[é]}'.format(...)`): what they may
/// step through must be ASCII. A printf-style key runs from `%(` to `)`. A `str.format` field
/// runs from `{` to `}`, except that a `[key]` in it runs to the next `]` wherever that is (past
/// the `}`, or to the end of the string), and the field goes on after it (`'{0[}][é]}'`).
fn check_format_keys(
    s: &str,
    open: &str,
    close: char,
) -> std::result::Result<(), minijinja::Error> {
    let bracketed = close == '}';
    let mut rest = s;
    while let Some(at) = rest.find(open) {
        rest = &rest[at + open.len()..];
        let mut end = 0;
        let scanned = loop {
            let next = rest[end..].find(|c: char| c == close || (bracketed && c == '['));
            match next.map(|i| end + i) {
                None => break rest,
                Some(i) if rest[i..].starts_with(close) => break &rest[..i],
                Some(i) => match rest[i..].find(']') {
                    Some(j) => end = i + j + 1,
                    None => break rest,
                },
            }
        };
        if !scanned.is_ascii() {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("format: the field `{open}{scanned}` has a non-ASCII key"),
            ));
        }
    }
    Ok(())
}

/// The `format` filter (printf style), with field keys checked first.
pub(super) fn format_filter(
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
pub(super) fn raise_exception(message: String) -> std::result::Result<Value, minijinja::Error> {
    Err(
        minijinja::Error::new(ErrorKind::InvalidOperation, "raise_exception called")
            .with_source(Raised(message)),
    )
}

/// `strftime_now(format)`: the local time formatted with C `strftime` directives, as templates
/// that print today's date (Llama 3.x) expect.
pub(super) fn strftime_now(format: String) -> std::result::Result<String, minijinja::Error> {
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
