//! Mistral's two call syntaxes: a list after one marker, `[TOOL_CALLS] [{"name": …,
//! "arguments": {…}}, …]` ([`ToolSyntax::Mistral`]), and a marker before each call,
//! `[TOOL_CALLS]name[ARGS]{…}` ([`ToolSyntax::MistralArgs`]). In both the calls are the whole
//! answer: under `tool_choice: auto` an answer is text that never writes the marker, or calls
//! from its first token.

use serde_json::Value;

use super::{arguments_schema, call_object, marker, MarkerIds, ParsedCall};
use crate::chat::tools::{ToolChoice, ToolDef, ToolRequest, ToolSyntax};

/// What opens Mistral's calls (a control token in Mistral's vocabularies).
pub const MISTRAL_OPEN: &str = "[TOOL_CALLS]";
/// What ends a call's name and starts its arguments in [`ToolSyntax::MistralArgs`].
pub const MISTRAL_ARGS: &str = "[ARGS]";

/// Text that never writes the marker's text (as a Lark terminal).
const TEXT: &str = "TEXT: /(.|\\n)*/ & ~/(.|\\n)*\\[TOOL_CALLS\\](.|\\n)*/\n";

/// The `start` rule: text or the calls under `auto`, the calls otherwise.
fn start(request: &ToolRequest, calls: &str) -> String {
    match request.choice {
        ToolChoice::Auto => format!("start: TEXT | {calls}\n{TEXT}"),
        _ => format!("start: {calls}\n"),
    }
}

/// Completes `lark` (which has the `fns` rule of call objects) for the list syntax: the marker,
/// an optional space, and a JSON list of one call, or of several when `several`.
pub(super) fn list_grammar(
    lark: &mut String,
    request: &ToolRequest,
    several: bool,
    ids: MarkerIds,
) {
    let more = if several { " (\", \" fns)*" } else { "" };
    lark.push_str(&format!(
        "calls: {} \" \"? \"[\" fns{more} \"]\"\n",
        marker(MISTRAL_OPEN, ids)
    ));
    lark.push_str(&start(request, "calls"));
}

/// The whole grammar of the `[ARGS]` syntax: each call is the marker, a function's name, the
/// arguments marker and the arguments object; one call, or several when `several`.
pub(super) fn args_grammar(
    request: &ToolRequest,
    callable: &[&ToolDef],
    several: bool,
    ids: MarkerIds,
) -> String {
    let (open, args) = (marker(MISTRAL_OPEN, ids), marker(MISTRAL_ARGS, ids));
    let mut lark = String::new();
    let names: Vec<String> = (0..callable.len()).map(|i| format!("fn_{i}")).collect();
    lark.push_str(&format!("fns: {}\n", names.join(" | ")));
    for (rule, def) in names.iter().zip(callable) {
        // names are letters, digits, `_` and `-`: a Lark string as they are
        lark.push_str(&format!(
            "{rule}: {open} {} {args} %json {}\n",
            Value::from(def.name.as_str()),
            arguments_schema(def)
        ));
    }
    let calls = if several { "fns+" } else { "fns" };
    lark.push_str(&start(request, calls));
    lark
}

/// The calls in `text`, which starts at the first marker: every complete call, in order. A
/// call cut off ends the reading (the calls before it are kept), as does text that is not the
/// syntax; an item that is JSON but not a call object is passed over.
pub(super) fn read(text: &str, syntax: ToolSyntax) -> Vec<ParsedCall> {
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(MISTRAL_OPEN) {
        let body = &rest[at + MISTRAL_OPEN.len()..];
        let read = match syntax {
            ToolSyntax::MistralArgs => args_call(body, &mut calls),
            _ => list(body, &mut calls),
        };
        match read {
            Some(used) => rest = &body[used..],
            None => break,
        }
    }
    calls
}

/// One JSON value at the start of `text` (after white space): its text and the bytes taken
/// through it. `None` when the value is cut off or is not JSON.
fn json_value(text: &str) -> Option<(&str, usize)> {
    let lead = text.len() - text.trim_start().len();
    let mut values = serde_json::Deserializer::from_str(&text[lead..]).into_iter::<Value>();
    match values.next() {
        Some(Ok(_)) => {
            let end = lead + values.byte_offset();
            Some((&text[lead..end], end))
        }
        _ => None,
    }
}

/// Reads a list `[call, call, …]` after the marker into `calls`: the bytes it took through
/// `]`, or `None` where the list is cut off or malformed (the calls completed before that
/// point are kept).
fn list(body: &str, calls: &mut Vec<ParsedCall>) -> Option<usize> {
    let open = body.trim_start().strip_prefix('[')?;
    let mut at = body.len() - open.len();
    loop {
        let (item, used) = json_value(&body[at..])?;
        calls.extend(call_object(item, ToolSyntax::Mistral));
        at += used;
        let after = body[at..].trim_start();
        at = body.len() - after.len();
        match after.chars().next() {
            Some(',') => at += 1,
            Some(']') => return Some(at + 1),
            _ => return None,
        }
    }
}

/// Reads `name[ARGS]{…}` after the marker into `calls`: the bytes it took, or `None` where
/// the call is cut off or is not one.
fn args_call(body: &str, calls: &mut Vec<ParsedCall>) -> Option<usize> {
    let args_at = body.find(MISTRAL_ARGS)?;
    let name = body[..args_at].trim();
    if name.is_empty() || name.contains(MISTRAL_OPEN) {
        return None;
    }
    let after = args_at + MISTRAL_ARGS.len();
    let (arguments, used) = json_value(&body[after..])?;
    if !arguments.starts_with('{') {
        return None;
    }
    calls.push(ParsedCall {
        name: name.to_string(),
        arguments: arguments.to_string(),
    });
    Some(after + used)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::tool_calls::read_calls;
    use crate::chat::tool_calls::tests::streamed;

    #[test]
    fn list_answers_read_back_call_by_call() {
        let text = "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo]\"}}, {\"name\": \"now\", \"arguments\": {}}]";
        let read = read_calls(text, ToolSyntax::Mistral);
        assert_eq!(read.content, "");
        assert_eq!(read.calls.len(), 2);
        assert_eq!(read.calls[0].arguments, "{\"city\": \"Oslo]\"}");
        assert_eq!(read.calls[1].name, "now");
        // no space after the marker (Nemo), an `id` beside the call
        let nemo = "[TOOL_CALLS][{\"name\": \"now\", \"arguments\": {}, \"id\": \"a1b2c3d4e\"}]";
        assert_eq!(read_calls(nemo, ToolSyntax::Mistral).calls.len(), 1);
        // cut inside the second call: the first is kept
        let cut = &text[..text.len() - 10];
        assert_eq!(read_calls(cut, ToolSyntax::Mistral).calls.len(), 1);
        // text without the marker is text, a list or not
        let plain = "[{\"name\": \"now\", \"arguments\": {}}]";
        assert_eq!(read_calls(plain, ToolSyntax::Mistral).content, plain);
        assert!(read_calls(plain, ToolSyntax::Mistral).calls.is_empty());
        // a list item that is not a call is passed over
        let odd = "[TOOL_CALLS] [3, {\"name\": \"now\"}]";
        let read = read_calls(odd, ToolSyntax::Mistral);
        assert_eq!(read.calls.len(), 1);
        assert_eq!(read.calls[0].arguments, "{}");
    }

    #[test]
    fn args_answers_read_back_call_by_call() {
        let text = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"[ARGS]\"}[TOOL_CALLS]now[ARGS]{}";
        let read = read_calls(text, ToolSyntax::MistralArgs);
        assert_eq!(read.calls.len(), 2);
        assert_eq!(read.calls[0].name, "get_weather");
        assert_eq!(read.calls[0].arguments, "{\"city\": \"[ARGS]\"}");
        assert_eq!(read.calls[1].arguments, "{}");
        assert_eq!(
            read_calls("[TOOL_CALLS]now[ARGS]{\"a\"", ToolSyntax::MistralArgs).calls,
            vec![]
        );
        assert_eq!(
            read_calls("[TOOL_CALLS]now[ARGS][1]", ToolSyntax::MistralArgs).calls,
            vec![]
        );
        let lead = read_calls("Sure.\n[TOOL_CALLS]now[ARGS]{}", ToolSyntax::MistralArgs);
        assert_eq!((lead.content.as_str(), lead.calls.len()), ("Sure.", 1));
    }

    #[test]
    fn a_stream_split_anywhere_gives_the_whole_answers_calls() {
        let answers = [
            (ToolSyntax::Mistral, "[TOOL_CALLS] [{\"name\": \"now\", \"arguments\": {}}, {\"name\": \"w\", \"arguments\": {\"q\": \"[TOOL_CALLS] ]\"}}]"),
            (ToolSyntax::MistralArgs, "Let me see. [TOOL_CALLS]now[ARGS]{}[TOOL_CALLS]w[ARGS]{\"q\": \"}\"}"),
            (ToolSyntax::Mistral, "Plain [TOOL text [TOOL_CALL"),
        ];
        for (syntax, text) in answers {
            let whole = read_calls(text, syntax);
            for step in 1..9 {
                let (content, calls) = streamed(syntax, text, step);
                assert_eq!(content, whole.content, "{text:?} in pieces of {step}");
                assert_eq!(calls, whole.calls, "{text:?} in pieces of {step}");
            }
        }
    }
}
