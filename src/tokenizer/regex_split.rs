//! [`RegexSplits`]: the pre-tokenizer regexes of a GGUF vocabulary, each compiled once per
//! process and shared by every tokenizer that uses it.
//!
//! The `tokenizers` crate's `Split` compiles its regex whenever one is built or cloned, and the
//! Unicode classes of GPT-2's pattern make that the largest part of assembling a tokenizer from
//! GGUF metadata (several milliseconds, longer in wasm). The patterns are a fixed set of
//! constants, so a compiled copy is kept per pattern and a new tokenizer shares it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use fancy_regex::Regex;
use tokenizers::pattern::Pattern;
use tokenizers::{Offsets, PreTokenizedString, SplitDelimiterBehavior};

use super::tk_err;
use crate::Result;

/// Regexes applied in order: each splits every piece the previous ones produced, keeping the
/// matches and the text between them as separate pieces (`Isolated`, as llama.cpp splits).
#[derive(Clone)]
pub(super) struct RegexSplits {
    regexes: Vec<Arc<Regex>>,
}

/// Compiled patterns, keyed by the pattern's text.
fn compiled() -> &'static Mutex<HashMap<&'static str, Arc<Regex>>> {
    static COMPILED: OnceLock<Mutex<HashMap<&'static str, Arc<Regex>>>> = OnceLock::new();
    COMPILED.get_or_init(|| Mutex::new(HashMap::new()))
}

impl RegexSplits {
    /// The splits for `patterns`, compiling those not seen before in this process.
    pub(super) fn new(patterns: &[&'static str]) -> Result<Self> {
        // A panic while the lock was held cannot leave a half-inserted entry: take the map.
        let mut cache = compiled()
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut regexes = Vec::with_capacity(patterns.len());
        for &pattern in patterns {
            let regex = match cache.get(pattern) {
                Some(r) => Arc::clone(r),
                None => {
                    let r = Arc::new(Regex::new(pattern).map_err(|e| {
                        tk_err(&format!("compiling the pre-tokenizer regex `{pattern}`"), e)
                    })?);
                    cache.insert(pattern, Arc::clone(&r));
                    r
                }
            };
            regexes.push(regex);
        }
        Ok(Self { regexes })
    }

    /// Splits the pieces of `pretok` by every regex in turn.
    pub(super) fn split(&self, pretok: &mut PreTokenizedString) -> Result<()> {
        for regex in &self.regexes {
            pretok
                .split(|_, piece| piece.split(Matches(regex), SplitDelimiterBehavior::Isolated))
                .map_err(|e| tk_err("pre-tokenizing", e))?;
        }
        Ok(())
    }
}

/// A compiled regex as the `tokenizers` crate's [`Pattern`].
struct Matches<'a>(&'a Regex);

impl Pattern for Matches<'_> {
    /// Byte ranges covering `inside`, each marked as a match or as the text between matches.
    /// Matching stops at the first error of the backtracking engine (its step limit), leaving
    /// the rest as one unmatched piece, as the `tokenizers` crate's own regex split does.
    fn find_matches(&self, inside: &str) -> tokenizers::Result<Vec<(Offsets, bool)>> {
        if inside.is_empty() {
            return Ok(vec![((0, 0), false)]);
        }
        let mut pieces = Vec::new();
        let mut prev = 0;
        for found in self.0.find_iter(inside) {
            let Ok(m) = found else {
                break;
            };
            if m.start() != prev {
                pieces.push(((prev, m.start()), false));
            }
            pieces.push(((m.start(), m.end()), true));
            prev = m.end();
        }
        if prev != inside.len() {
            pieces.push(((prev, inside.len()), false));
        }
        Ok(pieces)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizer};

    fn pieces(pretok: &PreTokenizedString) -> Vec<String> {
        pretok
            .get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(s, _, _)| s.to_string())
            .collect()
    }

    /// The shared regexes split exactly as the `tokenizers` crate's `Split` does, on text with
    /// contractions, digits, punctuation runs, several spaces, newlines and non-Latin letters.
    #[test]
    fn splits_as_the_tokenizers_split_does() {
        let patterns = [
            r"\p{N}",
            r"'s|'t| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
        ];
        let text = "It's 2026!!  Ünïcode   text\n\n\tcafé 12345 ?? 東京タワー  ";
        let ours = RegexSplits::new(&patterns).unwrap();
        let mut a = PreTokenizedString::from(text);
        ours.split(&mut a).unwrap();
        let mut b = PreTokenizedString::from(text);
        for p in patterns {
            Split::new(
                SplitPattern::Regex(p.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .unwrap()
            .pre_tokenize(&mut b)
            .unwrap();
        }
        assert_eq!(pieces(&a), pieces(&b));
        assert!(pieces(&a).len() > 20);
        // Empty text stays one empty piece.
        let mut empty = PreTokenizedString::from("");
        ours.split(&mut empty).unwrap();
        assert_eq!(pieces(&empty), Vec::<String>::new());
    }

    /// A second tokenizer shares the first one's compiled regex instead of compiling again.
    #[test]
    fn a_pattern_is_compiled_once() {
        let a = RegexSplits::new(&[r"[0-9]+x"]).unwrap();
        let b = RegexSplits::new(&[r"[0-9]+x"]).unwrap();
        assert!(Arc::ptr_eq(&a.regexes[0], &b.regexes[0]));
    }

    /// A pattern that does not compile is an error naming it.
    #[test]
    fn a_bad_pattern_is_named() {
        let Err(e) = RegexSplits::new(&[r"(unclosed"]) else {
            panic!("a bad pattern compiled");
        };
        assert!(e.to_string().contains("(unclosed"), "{e}");
    }
}
