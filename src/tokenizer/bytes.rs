//! Every token's bytes: what a token adds to the output, as bytes rather than text, so that a
//! grammar can be matched against partial characters.

#![deny(clippy::arithmetic_side_effects)]

use std::collections::HashMap;

use super::stream::is_byte_token;
use super::{tk_err, Tokenizer};
use crate::Result;

/// Prefix of a special (control) token's bytes: no text starts with it (it is never valid
/// UTF-8), so a grammar over text cannot match a control token by accident.
pub const SPECIAL_MARKER: u8 = 0xff;

/// How the tokenizer's decoder turns a vocabulary entry into bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Spelling {
    /// GPT-2 byte-level BPE: every character stands for one byte.
    ByteLevel,
    /// SentencePiece style: `▁` (or the decoder's marker) is a space, `<0xNN>` is byte NN,
    /// everything else is its UTF-8.
    Pieces { space: char },
}

/// GPT-2's printable stand-in for each byte, inverted: character -> byte.
fn byte_level_chars() -> HashMap<char, u8> {
    let mut map = HashMap::with_capacity(256);
    let mut extra = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, 33..=126 | 161..=172 | 174..=255);
        let c = if printable {
            char::from(b)
        } else {
            // at most 256 bytes: no overflow
            extra = extra.saturating_add(1);
            char::from_u32(255u32.saturating_add(extra)).unwrap_or(char::REPLACEMENT_CHARACTER)
        };
        map.insert(c, b);
    }
    map
}

impl Tokenizer {
    /// How this tokenizer's decoder spells bytes, read from its serialized decoder.
    fn spelling(&self) -> Result<Spelling> {
        let decoder = serde_json::to_value(self.inner.get_decoder())
            .map_err(|e| tk_err("reading the decoder", e))?;
        let kind = |d: &serde_json::Value| d["type"].as_str().unwrap_or_default().to_string();
        let mut parts = vec![decoder.clone()];
        if kind(&decoder) == "Sequence" {
            parts = decoder["decoders"].as_array().cloned().unwrap_or_default();
        }
        if parts.iter().any(|d| kind(d) == "ByteLevel") {
            return Ok(Spelling::ByteLevel);
        }
        let mut space = '\u{2581}';
        for d in &parts {
            if kind(d) == "Replace" && d["content"].as_str() == Some(" ") {
                let mut chars = d["pattern"]["String"].as_str().unwrap_or_default().chars();
                if let (Some(c), None) = (chars.next(), chars.next()) {
                    space = c;
                }
            }
            if kind(d) == "Metaspace" {
                if let Some(c) = d["replacement"].as_str().and_then(|s| s.chars().next()) {
                    space = c;
                }
            }
        }
        Ok(Spelling::Pieces { space })
    }

    /// The bytes of every id in `0..vocab_size()`: byte-level tokens decoded to their bytes,
    /// SentencePiece pieces with their space marker and `<0xNN>` byte tokens resolved, special
    /// tokens as [`SPECIAL_MARKER`] followed by their text, and ids without an entry as the
    /// marker followed by `<[id]>`.
    pub fn token_bytes(&self) -> Result<Vec<Vec<u8>>> {
        let spelling = self.spelling()?;
        let chars = byte_level_chars();
        let added = self.inner.get_added_tokens_decoder();
        let mut out = Vec::with_capacity(self.vocab_size);
        for id in 0..self.vocab_size as u32 {
            let marked = |text: &str| {
                let mut b = vec![SPECIAL_MARKER];
                b.extend_from_slice(text.as_bytes());
                b
            };
            if let Some(token) = added.get(&id) {
                out.push(match token.special {
                    true => marked(&token.content),
                    false => token.content.as_bytes().to_vec(),
                });
                continue;
            }
            let Some(token) = self.inner.id_to_token(id) else {
                out.push(marked(&format!("<[{id}]>")));
                continue;
            };
            let bytes = match spelling {
                Spelling::ByteLevel => {
                    let mapped: Option<Vec<u8>> =
                        token.chars().map(|c| chars.get(&c).copied()).collect();
                    mapped.unwrap_or_else(|| token.into_bytes())
                }
                Spelling::Pieces { .. } if is_byte_token(&token) => {
                    u8::from_str_radix(&token[3..5], 16)
                        .map(|b| vec![b])
                        .unwrap_or_else(|_| token.into_bytes())
                }
                Spelling::Pieces { space } => token.replace(space, " ").into_bytes(),
            };
            out.push(bytes);
        }
        Ok(out)
    }
}
