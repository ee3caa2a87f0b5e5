//! Nesting limits checked before a template is compiled.
//!
//! minijinja parses, compiles and frees a template by recursion over its syntax tree. It guards
//! some of that recursion (bracket and statement nesting, at a depth that a 2 MiB stack holds
//! only in optimized builds), but not chains of prefix and infix operators: `{{ ------1 }}` or
//! `{{ a.b.c.d… }}` build a tree as deep as the chain is long, and a few thousand links overflow
//! a 1 MiB stack (a WebAssembly module's default). A template is untrusted input, so the depth
//! it can reach is bounded here, on minijinja's own tokens, before anything recursive runs:
//!
//! - brackets (`(`, `[`, `{`) open inside one tag: at most [`MAX_BRACKETS`];
//! - block statements (`if`, `for`, `macro`, …) open around a point: at most [`MAX_BLOCKS`];
//! - operators in one tag (each can add a level to its expression's tree): at most
//!   [`MAX_OPERATORS`].
//!
//! Real chat templates stay far inside all three (their tags hold a few dozen operators and nest
//! a handful of blocks), and a template at every limit at once compiles and renders on a 1 MiB
//! stack in an unoptimized build (`tests/engine/chat.rs` checks it).

use minijinja::machinery::{tokenize, Span, Token};
use minijinja::syntax::SyntaxConfig;

use crate::{Error, Result};

/// Brackets one tag may have open at once.
pub const MAX_BRACKETS: usize = 16;

/// Block statements that may enclose one point of a template.
pub const MAX_BLOCKS: usize = 32;

/// Operators (arithmetic, `~`, `.`, `|`, `not`, `and`, `or`, `if`, `else`, `is`, `in`,
/// comparisons, and every bracket: grouping, literals, subscripts and calls) one tag may hold.
pub const MAX_OPERATORS: usize = 128;

/// Block statements that open a body closed by an `end…` tag. `set` opens one only in its block
/// form, without `=`.
const OPENING_BLOCKS: [&str; 8] = [
    "if",
    "for",
    "macro",
    "call",
    "filter",
    "with",
    "autoescape",
    "block",
];

/// What the scanner is inside.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tag {
    /// Template text, between tags.
    Outside,
    /// A `{{ … }}` tag.
    Variable,
    /// A `{% … %}` tag.
    Block,
}

/// Refuses `source` when it nests deeper than the limits above, naming the limit and the line.
/// A template the lexer rejects passes: compiling it reports minijinja's own error.
pub fn check_nesting(source: &str, syntax: SyntaxConfig) -> Result<()> {
    let mut tag = Tag::Outside;
    let mut brackets = 0usize;
    let mut operators = 0usize;
    let mut blocks = 0usize;
    // The first word of the current block tag, and whether the tag assigns (`set x = …`).
    let mut keyword: Option<&str> = None;
    let mut assigns = false;
    for item in tokenize(source, false, syntax) {
        let Ok((token, span)) = item else {
            return Ok(());
        };
        match token {
            Token::VariableStart => start(&mut tag, Tag::Variable, &mut brackets, &mut operators),
            Token::BlockStart => {
                start(&mut tag, Tag::Block, &mut brackets, &mut operators);
                keyword = None;
                assigns = false;
            }
            Token::VariableEnd => tag = Tag::Outside,
            Token::BlockEnd => {
                tag = Tag::Outside;
                match keyword {
                    Some(word) if word.starts_with("end") => blocks = blocks.saturating_sub(1),
                    Some(word) if OPENING_BLOCKS.contains(&word) || (word == "set" && !assigns) => {
                        blocks += 1;
                        if blocks > MAX_BLOCKS {
                            return Err(too_deep(
                                &format!("{blocks} block statements deep"),
                                MAX_BLOCKS,
                                span,
                            ));
                        }
                    }
                    _ => {}
                }
            }
            Token::TemplateData(_) => {}
            Token::ParenOpen | Token::BracketOpen | Token::BraceOpen => {
                brackets += 1;
                operators += 1;
                if brackets > MAX_BRACKETS {
                    return Err(too_deep(
                        &format!("{brackets} brackets deep in one tag"),
                        MAX_BRACKETS,
                        span,
                    ));
                }
            }
            Token::ParenClose | Token::BracketClose | Token::BraceClose => {
                brackets = brackets.saturating_sub(1);
            }
            Token::Ident(word) => {
                if tag == Tag::Block && keyword.is_none() {
                    keyword = Some(word);
                } else if matches!(word, "not" | "and" | "or" | "if" | "else" | "is" | "in") {
                    operators += 1;
                }
            }
            Token::Assign => assigns = true,
            Token::Str(_)
            | Token::String(_)
            | Token::Int(_)
            | Token::Int128(_)
            | Token::Float(_)
            | Token::Comma
            | Token::Colon => {}
            Token::Plus
            | Token::Minus
            | Token::Mul
            | Token::Div
            | Token::FloorDiv
            | Token::Pow
            | Token::Mod
            | Token::Dot
            | Token::Tilde
            | Token::Pipe
            | Token::Eq
            | Token::Ne
            | Token::Gt
            | Token::Gte
            | Token::Lt
            | Token::Lte => operators += 1,
        }
        if operators > MAX_OPERATORS {
            return Err(too_deep(
                &format!("more than {MAX_OPERATORS} operators in one tag"),
                MAX_OPERATORS,
                span,
            ));
        }
    }
    Ok(())
}

/// Enters a tag: its brackets and operators count from zero.
fn start(tag: &mut Tag, kind: Tag, brackets: &mut usize, operators: &mut usize) {
    *tag = kind;
    *brackets = 0;
    *operators = 0;
}

/// The error for a template past one of the limits.
fn too_deep(what: &str, limit: usize, span: Span) -> Error {
    Error::Template(format!(
        "the template nests too deeply: {what} at line {} (the limit is {limit})",
        span.start_line
    ))
}
