//! Structured output: a [`ResponseFormat`] (JSON object, JSON schema, regular expression, Lark
//! or GBNF grammar) compiled into a [`Constraint`], whose per-sequence [`GrammarState`] gives
//! the [`TokenMask`] of allowed tokens before each draw and takes each drawn token.
//!
//! The grammar engine is `llguidance` (the one llama.cpp and vLLM use): an Earley parser over
//! lexemes with a token trie, computing a step's mask in tens of microseconds. We give it the
//! bytes of every token ([`Tokenizer::token_bytes`]) and translate GBNF to its Lark dialect
//! ([`gbnf`]). Masks are computed on the calling thread (no thread pool; the same in wasm32).
//!
//! JSON is generated compactly readable: `", "` between items, `": "` after keys, and no other
//! whitespace (a schema's own `x-guidance` options override this), so a small model cannot
//! wander into endless blank lines.
//!
//! End of text: when the grammar may end, the model's end ids (EOS, end of turn, the call's
//! stop ids) are allowed; when it must go on, they are not. A grammar that can only end ends
//! the sequence at once (finish reason `stop`).

mod env;
mod format;
pub mod gbnf;

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};

pub use format::{ResponseFormat, MAX_NESTING, MAX_SOURCE_BYTES};

use crate::sampling::TokenMask;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// The grammar compiler for one tokenizer: the token trie built once (a few hundred
/// milliseconds for a large vocabulary) and shared by every constrained call.
pub struct Grammars {
    factory: Arc<ParserFactory>,
    vocab: usize,
    /// The id the grammar engine treats as the end of text.
    eos: u32,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("vocab", &self.vocab)
            .finish_non_exhaustive()
    }
}

/// A compiled format: [`Constraint::start`] gives each sequence its own state.
#[derive(Clone)]
pub struct Constraint {
    start: Matcher,
    kind: &'static str,
    vocab: usize,
    eos: u32,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

/// Where one sequence stands in its constraint's grammar.
#[derive(Clone)]
pub struct GrammarState {
    matcher: Matcher,
    kind: &'static str,
    vocab: usize,
    eos: u32,
}

impl std::fmt::Debug for GrammarState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarState")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

fn grammar_error(kind: &str, message: impl std::fmt::Display) -> Error {
    engine_error(kind, "does not compile", message)
}

/// A failure while the text goes on (a mask, a token taken, a draft checked): the grammar
/// compiled, but its parser outgrew the engine's limits or failed on the text so far.
fn step_error(kind: &str, message: impl std::fmt::Display) -> Error {
    engine_error(kind, "failed on the text generated so far", message)
}

/// "the {kind} {what}: {message}", naming `response_format`.
fn engine_error(kind: &str, what: &str, message: impl std::fmt::Display) -> Error {
    Error::invalid(
        "response_format",
        format!("the {kind} {what}: {}", engine_message(message)),
    )
}

/// The grammar engine's own message without the parser-state dump it appends (`<state>`,
/// tens of lines of internal counters).
fn engine_message(message: impl std::fmt::Display) -> String {
    let text = message.to_string();
    let cut = text.find("<state>").unwrap_or(text.len());
    text[..cut].trim_end().to_string()
}

/// The JSON layout options every schema gets unless it brings its own `x-guidance`.
fn with_layout(schema: &Value, strict: bool) -> Result<Value> {
    let mut schema = match schema {
        Value::Bool(true) => json!({}),
        Value::Bool(false) => {
            return Err(grammar_error(
                "json_schema",
                "the schema `false` admits no value",
            ))
        }
        other => other.clone(),
    };
    if let Some(map) = schema.as_object_mut() {
        if !map.contains_key("x-guidance") {
            map.insert(
                "x-guidance".into(),
                json!({
                    "item_separator": ", ",
                    "key_separator": ": ",
                    "whitespace_flexible": false,
                    "lenient": !strict,
                }),
            );
        }
    }
    Ok(schema)
}

impl Grammars {
    /// The compiler for `tokenizer`'s ids `0..vocab` (the ids the model can produce); `eos`
    /// is the id the grammar engine treats as the end of text.
    pub fn new(tokenizer: &Arc<Tokenizer>, vocab: usize, eos: u32) -> Result<Self> {
        let env = env::token_env(tokenizer, vocab, eos)?;
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| Error::invalid("response_format", format!("token trie: {e}")))?;
        factory.quiet();
        Ok(Self {
            factory: Arc::new(factory),
            vocab,
            eos,
        })
    }

    /// Compiles `format`: `None` for plain text. A schema or grammar that does not compile,
    /// or whose language is empty, -> Error naming the problem (with the line and column for
    /// GBNF, and the engine's own location for Lark and schemas).
    pub fn compile(&self, format: &ResponseFormat) -> Result<Option<Constraint>> {
        let kind = format.kind();
        format.check_limits()?;
        let grammar = match format {
            ResponseFormat::Text => return Ok(None),
            ResponseFormat::JsonObject => {
                TopLevelGrammar::from_json_schema(with_layout(&json!({"type": "object"}), true)?)
            }
            ResponseFormat::JsonSchema { schema, strict } => {
                TopLevelGrammar::from_json_schema(with_layout(schema, *strict)?)
            }
            ResponseFormat::Regex(rx) => TopLevelGrammar::from_regex(rx),
            ResponseFormat::Lark(src) => TopLevelGrammar::from_lark(src.clone()),
            ResponseFormat::Gbnf(src) => TopLevelGrammar::from_lark(gbnf::to_lark(src)?),
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| grammar_error(kind, e))?;
        let mut start = Matcher::new(Ok(parser));
        if let Some(e) = start.get_error() {
            return Err(grammar_error(kind, e));
        }
        let first = start.compute_mask().map_err(|e| grammar_error(kind, e))?;
        if first.num_set() == 0 {
            return Err(grammar_error(
                kind,
                "its language is empty (no text satisfies it)",
            ));
        }
        Ok(Some(Constraint {
            start,
            kind,
            vocab: self.vocab,
            eos: self.eos,
        }))
    }
}

impl Constraint {
    /// A fresh state at the start of the text.
    pub fn start(&self) -> GrammarState {
        GrammarState {
            matcher: self.start.clone(),
            kind: self.kind,
            vocab: self.vocab,
            eos: self.eos,
        }
    }

    /// The format's kind (`json_schema`, `regex` ...).
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// The same constraint under another name in messages (`tool call` for the grammar of
    /// a request's tools, which is a Lark grammar the caller never wrote).
    pub fn named(mut self, kind: &'static str) -> Self {
        self.kind = kind;
        self
    }
}

impl GrammarState {
    /// The tokens allowed next, `[vocab]`: what continues the text within the grammar, and
    /// every id of `ends` exactly when the text may end here.
    pub fn mask(&mut self, ends: &[u32]) -> Result<TokenMask> {
        let vob = self
            .matcher
            .compute_mask()
            .map_err(|e| step_error(self.kind, e))?;
        let may_end = vob.is_allowed(self.eos);
        let mut mask = TokenMask::from_words(vob.as_slice().to_vec(), self.vocab)?;
        mask.set(self.eos, false);
        for &id in ends {
            mask.set(id, may_end);
        }
        if mask.count() == 0 {
            return Err(Error::invalid(
                "response_format",
                format!(
                    "the {} allows no token here{}",
                    self.kind,
                    if may_end {
                        " and the call has no end token to finish with"
                    } else {
                        ""
                    }
                ),
            ));
        }
        Ok(mask)
    }

    /// Takes drawn token `id` (one the last mask allowed).
    pub fn accept(&mut self, id: u32) -> Result<()> {
        self.matcher
            .consume_token(id)
            .map_err(|e| step_error(self.kind, e))
    }

    /// How many of `tokens`, taken in order from here, the grammar allows (the length of
    /// their longest allowed prefix); the state does not move. Speculative decoding keeps a
    /// lookup draft to that prefix.
    pub fn valid_prefix(&mut self, tokens: &[u32]) -> Result<usize> {
        if tokens.iter().any(|&t| t as usize >= self.vocab) {
            return Err(Error::invalid(
                "response_format",
                format!("a token id is outside the vocabulary of {}", self.vocab),
            ));
        }
        self.matcher
            .validate_tokens(tokens)
            .map_err(|e| step_error(self.kind, e))
    }

    /// Whether the grammar can only end here (nothing may follow).
    pub fn must_end(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Whether the text so far is complete in the grammar (it may end here).
    pub fn is_complete(&mut self) -> bool {
        self.matcher.is_stopped() || self.matcher.is_accepting().unwrap_or(false)
    }

    /// The format's kind (`json_schema`, `regex` ...).
    pub fn kind(&self) -> &'static str {
        self.kind
    }
}
