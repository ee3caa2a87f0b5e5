//! llama.cpp's GBNF grammars, translated to the Lark dialect the constraint engine compiles.
//!
//! GBNF: rules `name ::= alternatives`, alternatives separated by `|`, sequences of string
//! literals `"..."`, character classes `[a-z]` / `[^...]`, the any-character `.`, rule names,
//! groups `( ... )`, and the repetitions `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`, `{,n}`; `#`
//! starts a comment; `root` is the start rule. A rule may span lines: it ends where the next
//! `name ::=` begins. Errors name the line and column.
//!
//! Written here rather than taken from a crate: no maintained Rust crate parses GBNF, and the
//! translation is a small tokenizer and recursive-descent parser.

use std::collections::BTreeMap;

use crate::{Error, Result};

/// Most nested groups a grammar may open (deeper is refused, not a stack overflow).
const MAX_DEPTH: usize = 64;

/// A GBNF grammar as Lark, or an error naming the line and column of the problem.
pub fn to_lark(source: &str) -> Result<String> {
    let tokens = lex(source)?;
    let mut parser = Parser {
        tokens: &tokens,
        pos: 0,
        names: BTreeMap::new(),
        source,
    };
    let mut rules: Vec<(String, String)> = Vec::new();
    while parser.pos < tokens.len() {
        let (name, at) = match &tokens[parser.pos] {
            (Tok::Name(n), at) => (n.clone(), *at),
            (_, at) => return Err(parser.error(*at, "expected a rule name")),
        };
        parser.pos += 1;
        parser.name(&name, at);
        match tokens.get(parser.pos) {
            Some((Tok::Define, _)) => parser.pos += 1,
            _ => return Err(parser.error(at, &format!("expected `::=` after `{name}`"))),
        }
        if rules.iter().any(|(n, _)| *n == name) {
            return Err(parser.error(at, &format!("rule `{name}` is defined twice")));
        }
        let body = parser.alternatives(0)?;
        if parser.pos < tokens.len() && !parser.at_rule_start() {
            let at = tokens[parser.pos].1;
            return Err(parser.error(at, "unexpected symbol"));
        }
        rules.push((name, body));
    }
    if !rules.iter().any(|(n, _)| n == "root") {
        return Err(Error::invalid("gbnf", "the grammar has no `root` rule"));
    }
    for (name, (at, _)) in &parser.names {
        if !rules.iter().any(|(n, _)| n == name) {
            return Err(parser.error(*at, &format!("rule `{name}` is used but never defined")));
        }
    }
    let mut out = format!("start: {}\n", lark_name(&parser.names, "root"));
    for (name, body) in &rules {
        // placeholders at odd places of the split are rule names
        let body: String = body
            .split('\u{0}')
            .enumerate()
            .map(|(i, part)| match i % 2 {
                1 => lark_name(&parser.names, part),
                _ => part.to_string(),
            })
            .collect();
        out.push_str(&format!("{}: {body}\n", lark_name(&parser.names, name)));
    }
    Ok(out)
}

/// The Lark spelling of GBNF rule `name`: lower case, unique (GBNF names are case-sensitive).
fn lark_name(names: &BTreeMap<String, (usize, usize)>, name: &str) -> String {
    let index = names.keys().position(|n| n == name).unwrap_or(names.len());
    let clean: String = name
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '_',
        })
        .collect();
    format!("r{index}_{clean}")
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Name(String),
    Define,
    Literal(String),
    /// A character class as a regular expression.
    Class(String),
    Any,
    Bar,
    Open,
    Close,
    Op(char),
    Repeat(u32, Option<u32>),
}

fn position(source: &str, offset: usize) -> (usize, usize) {
    let before = &source[..offset.min(source.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

fn err_at(source: &str, offset: usize, message: &str) -> Error {
    let (line, column) = position(source, offset);
    Error::invalid("gbnf", format!("line {line}, column {column}: {message}"))
}

/// One escaped or plain character of a literal or class at `chars[*i]`.
fn char_at(source: &str, chars: &[(usize, char)], i: &mut usize) -> Result<char> {
    let (at, c) = chars[*i];
    *i += 1;
    if c != '\\' {
        return Ok(c);
    }
    let Some(&(_, e)) = chars.get(*i) else {
        return Err(err_at(source, at, "the escape is cut off"));
    };
    *i += 1;
    let hex = |n: usize, i: &mut usize| -> Result<char> {
        let digits: String = chars.iter().skip(*i).take(n).map(|c| c.1).collect();
        *i += n;
        u32::from_str_radix(&digits, 16)
            .ok()
            .filter(|_| digits.len() == n)
            .and_then(char::from_u32)
            .ok_or_else(|| {
                err_at(
                    source,
                    at,
                    &format!("`\\{e}` needs {n} hex digits of a character"),
                )
            })
    };
    match e {
        'x' => hex(2, i),
        'u' => hex(4, i),
        'U' => hex(8, i),
        't' => Ok('\t'),
        'n' => Ok('\n'),
        'r' => Ok('\r'),
        '\\' | '"' | '[' | ']' | '-' | '^' => Ok(e),
        _ => Err(err_at(source, at, &format!("unknown escape `\\{e}`"))),
    }
}

/// A character inside a regex class, escaped so that nothing in it is special.
fn class_char(c: char) -> String {
    format!("\\x{{{:X}}}", c as u32)
}

fn lex(source: &str) -> Result<Vec<(Tok, usize)>> {
    let chars: Vec<(usize, char)> = source.char_indices().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let (at, c) = chars[i];
        match c {
            c if c.is_whitespace() => i += 1,
            '#' => {
                while i < chars.len() && chars[i].1 != '\n' {
                    i += 1;
                }
            }
            ':' if source[at..].starts_with("::=") => {
                out.push((Tok::Define, at));
                i += 3;
            }
            '|' => {
                out.push((Tok::Bar, at));
                i += 1;
            }
            '(' | ')' => {
                out.push((if c == '(' { Tok::Open } else { Tok::Close }, at));
                i += 1;
            }
            '*' | '+' | '?' => {
                out.push((Tok::Op(c), at));
                i += 1;
            }
            '.' => {
                out.push((Tok::Any, at));
                i += 1;
            }
            '"' => {
                i += 1;
                let mut text = String::new();
                loop {
                    match chars.get(i) {
                        None => return Err(err_at(source, at, "the string is not closed")),
                        Some((_, '"')) => break,
                        Some(_) => text.push(char_at(source, &chars, &mut i)?),
                    }
                }
                i += 1;
                out.push((Tok::Literal(text), at));
            }
            '[' => {
                i += 1;
                let mut class = String::from("[");
                if chars.get(i).is_some_and(|c| c.1 == '^') {
                    class.push('^');
                    i += 1;
                }
                let mut empty = true;
                loop {
                    match chars.get(i) {
                        None => {
                            return Err(err_at(source, at, "the character class is not closed"))
                        }
                        Some((_, ']')) => break,
                        Some(_) => {
                            let first = char_at(source, &chars, &mut i)?;
                            class.push_str(&class_char(first));
                            empty = false;
                            let dash = chars.get(i).is_some_and(|c| c.1 == '-');
                            let closes = chars.get(i + 1).is_none_or(|c| c.1 == ']');
                            if dash && !closes {
                                i += 1;
                                let last = char_at(source, &chars, &mut i)?;
                                if last < first {
                                    return Err(err_at(
                                        source,
                                        at,
                                        &format!("the range {first:?}-{last:?} is backwards"),
                                    ));
                                }
                                class.push('-');
                                class.push_str(&class_char(last));
                            }
                        }
                    }
                }
                i += 1;
                if empty {
                    return Err(err_at(source, at, "the character class is empty"));
                }
                class.push(']');
                out.push((Tok::Class(class), at));
            }
            '{' => {
                let end = source[at..]
                    .find('}')
                    .ok_or_else(|| err_at(source, at, "the repetition `{` is not closed"))?;
                let inner = &source[at + 1..at + end];
                let bad = || err_at(source, at, &format!("bad repetition `{{{inner}}}`"));
                let num = |s: &str| s.trim().parse::<u32>().map_err(|_| bad());
                let (min, max) = match inner.split_once(',') {
                    None => (num(inner)?, Some(num(inner)?)),
                    Some((a, b)) => {
                        let a = if a.trim().is_empty() { 0 } else { num(a)? };
                        let b = if b.trim().is_empty() {
                            None
                        } else {
                            Some(num(b)?)
                        };
                        (a, b)
                    }
                };
                if max.is_some_and(|m| m < min || m == 0) {
                    return Err(bad());
                }
                out.push((Tok::Repeat(min, max), at));
                while i < chars.len() && chars[i].0 <= at + end {
                    i += 1;
                }
            }
            c if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                let mut name = String::new();
                while let Some(&(_, c)) = chars.get(i) {
                    if !(c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                        break;
                    }
                    name.push(c);
                    i += 1;
                }
                out.push((Tok::Name(name), at));
            }
            _ => return Err(err_at(source, at, &format!("unexpected character {c:?}"))),
        }
    }
    Ok(out)
}

struct Parser<'a> {
    tokens: &'a [(Tok, usize)],
    pos: usize,
    /// Every rule name seen, with where it was first seen.
    names: BTreeMap<String, (usize, usize)>,
    source: &'a str,
}

impl Parser<'_> {
    fn error(&self, offset: usize, message: &str) -> Error {
        err_at(self.source, offset, message)
    }

    /// Whether the next tokens are `name ::=` (the start of the next rule).
    fn at_rule_start(&self) -> bool {
        matches!(
            (self.tokens.get(self.pos), self.tokens.get(self.pos + 1)),
            (Some((Tok::Name(_), _)), Some((Tok::Define, _)))
        )
    }

    fn name(&mut self, name: &str, at: usize) -> String {
        let (line, _) = position(self.source, at);
        self.names.entry(name.to_string()).or_insert((at, line));
        // names are resolved after the whole grammar is read; a placeholder keeps the order
        format!("\u{0}{name}\u{0}")
    }

    fn alternatives(&mut self, depth: usize) -> Result<String> {
        let mut alts = vec![self.sequence(depth)?];
        while matches!(self.tokens.get(self.pos), Some((Tok::Bar, _))) {
            self.pos += 1;
            alts.push(self.sequence(depth)?);
        }
        Ok(alts.join(" | "))
    }

    fn sequence(&mut self, depth: usize) -> Result<String> {
        let mut items = Vec::new();
        while let Some((tok, at)) = self.tokens.get(self.pos).cloned() {
            if self.at_rule_start() {
                break;
            }
            let atom = match tok {
                Tok::Name(n) => {
                    self.pos += 1;
                    self.name(&n, at)
                }
                Tok::Literal(text) => {
                    self.pos += 1;
                    if text.is_empty() {
                        "\"\"".to_string()
                    } else {
                        serde_json::to_string(&text).map_err(|e| self.error(at, &e.to_string()))?
                    }
                }
                Tok::Class(class) => {
                    self.pos += 1;
                    format!("/{class}/")
                }
                Tok::Any => {
                    self.pos += 1;
                    "/(?s:.)/".to_string()
                }
                Tok::Open => {
                    if depth >= MAX_DEPTH {
                        return Err(self.error(at, &format!("groups nest deeper than {MAX_DEPTH}")));
                    }
                    self.pos += 1;
                    let inner = self.alternatives(depth + 1)?;
                    match self.tokens.get(self.pos) {
                        Some((Tok::Close, _)) => self.pos += 1,
                        _ => return Err(self.error(at, "the group `(` is not closed")),
                    }
                    format!("({inner})")
                }
                Tok::Bar | Tok::Close => break,
                Tok::Define => return Err(self.error(at, "`::=` without a rule name before it")),
                Tok::Op(_) | Tok::Repeat(..) => {
                    return Err(self.error(at, "a repetition needs something before it"))
                }
            };
            let mut atom = atom;
            let mut repeated = false;
            loop {
                let suffix = match self.tokens.get(self.pos) {
                    Some((Tok::Op(op), _)) => op.to_string(),
                    Some((Tok::Repeat(min, Some(max)), _)) => format!("{{{min},{max}}}"),
                    Some((Tok::Repeat(min, None), _)) => format!("{{{min},}}"),
                    _ => break,
                };
                // a second repetition applies to the first one's result
                atom = match repeated {
                    true => format!("({atom}){suffix}"),
                    false => format!("{atom}{suffix}"),
                };
                repeated = true;
                self.pos += 1;
            }
            items.push(atom);
        }
        Ok(match items.is_empty() {
            true => "\"\"".to_string(),
            false => items.join(" "),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_literals_classes_and_repetitions_translate() {
        let lark = to_lark(
            "root ::= Item (\", \" Item){0,2} # a list\nItem ::= [a-c\\x41] \"\\\"q\\n\"? | .+\n",
        )
        .expect("valid GBNF");
        let lines: Vec<&str> = lark.lines().collect();
        assert_eq!(lines[0], "start: r1_root");
        assert_eq!(lines[1], "r1_root: r0_item (\", \" r0_item){0,2}");
        assert_eq!(
            lines[2],
            "r0_item: /[\\x{61}-\\x{63}\\x{41}]/ \"\\\"q\\n\"? | /(?s:.)/+"
        );
    }

    #[test]
    fn a_rule_may_continue_on_the_next_lines() {
        let lark = to_lark("root ::=\n  \"a\"\n  | \"b\"\nother ::= \"c\"\n").expect("valid");
        assert!(lark.contains("r1_root: \"a\" | \"b\""), "{lark}");
    }

    #[test]
    fn errors_give_the_line_and_column() {
        let cases = [
            (
                "root ::= \"abc",
                "line 1, column 10: the string is not closed",
            ),
            (
                "root ::= [abc",
                "line 1, column 10: the character class is not closed",
            ),
            ("root ::= \"\\q\"", "unknown escape `\\q`"),
            ("root ::= \"a\"\n  foo", "line 2, column 3"),
            ("root ::= (\"a\"", "the group `(` is not closed"),
            ("root ::= \"a\"{3,1}", "bad repetition `{3,1}`"),
            ("root ::= * \"a\"", "needs something before it"),
            ("item ::= \"a\"", "no `root` rule"),
            (
                "root ::= \"a\"\nroot ::= \"b\"",
                "line 2, column 1: rule `root` is defined twice",
            ),
            ("root ::= []", "the character class is empty"),
        ];
        for (source, want) in cases {
            let e = match to_lark(source) {
                Ok(lark) => panic!("{source:?} was accepted as {lark:?}"),
                Err(e) => e.to_string(),
            };
            assert!(e.contains(want), "{source:?}: {e}");
        }
    }
}
