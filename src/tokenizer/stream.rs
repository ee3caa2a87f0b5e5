//! [`StreamDecoder`]: generated ids to text, one token at a time, never splitting a character.

use std::fmt;

use crate::{Error, Result};

use super::Tokenizer;

impl Tokenizer {
    /// An incremental decoder for generated ids.
    pub fn stream_decoder(&self, skip_special: bool) -> StreamDecoder<'_> {
        StreamDecoder {
            tokenizer: self,
            skip_special,
            ids: Vec::new(),
            context: 0,
            emitted: String::new(),
        }
    }
}

/// Incremental detokenizer for generated ids: each [`push`](Self::push) returns the text that
/// became complete, so a caller can show it at once.
///
/// Guarantees: the concatenation of everything `push` and [`finish`](Self::finish) return equals
/// `tokenizer.decode(all ids, skip_special)`; no piece ends inside a character that later tokens
/// complete (an emoji spread over byte tokens appears once, whole); SentencePiece's leading-space
/// marker is handled as in a full decode (the first word after BOS gains no space). These hold
/// for the decoders of GGUF vocabularies and of byte-level BPE and SentencePiece tokenizer.json
/// files; a decoder that looks further back than the window (CTC's merging of repeats, a strip
/// of several leading spaces) may stream text that differs from the full decode.
///
/// How: the decoder keeps a small window of ids, `context` ids already shown followed by pending
/// ones, and decodes the window with and without the pending part. The difference is the new
/// text; decoding with context keeps the space rules of a full decode. Two things hold text back:
/// a decode that ends in U+FFFD (bytes that do not yet form a character), and a trailing run of
/// `<0xNN>` byte-fallback tokens, because the decoder turns a whole run into U+FFFDs when any
/// byte of it is invalid, so its text is only final once a non-byte token ends the run.
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    skip_special: bool,
    /// The window: `ids[..context]` were fully shown, `ids[context..]` are pending.
    ids: Vec<u32>,
    /// Length of the context part of `ids`.
    context: usize,
    /// Text of the pending part already returned (it ended before held-back text).
    emitted: String,
}

impl fmt::Debug for StreamDecoder<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamDecoder")
            .field("skip_special", &self.skip_special)
            .field("ids", &self.ids)
            .field("context", &self.context)
            .field("emitted", &self.emitted)
            .finish()
    }
}

/// Whether a vocabulary entry is a SentencePiece byte-fallback token `<0xNN>`.
pub(super) fn is_byte_token(token: &str) -> bool {
    let b = token.as_bytes();
    b.len() == 6
        && token.starts_with("<0x")
        && b[5] == b'>'
        && b[3].is_ascii_hexdigit()
        && b[4].is_ascii_hexdigit()
}

impl StreamDecoder<'_> {
    /// Text of `ids[context..end]`, decoded after the context.
    fn text_after_context(&self, end: usize) -> Result<String> {
        let context = self
            .tokenizer
            .decode(&self.ids[..self.context], self.skip_special)?;
        let all = self.tokenizer.decode(&self.ids[..end], self.skip_special)?;
        all.strip_prefix(&context)
            .map(str::to_string)
            .ok_or_else(|| self.not_incremental(&all, &context))
    }

    fn not_incremental(&self, text: &str, expected_prefix: &str) -> Error {
        Error::Tokenizer(format!(
            "stream decoding of ids {:?} is not incremental: `{text}` does not extend `{expected_prefix}`",
            self.ids
        ))
    }

    /// Start of the trailing run of byte tokens in the pending ids (`ids.len()` if none). Special
    /// tokens that decoding skips do not end a run: the decoder never sees them.
    fn byte_run_start(&self) -> usize {
        let mut start = self.ids.len();
        for i in (self.context..self.ids.len()).rev() {
            let id = self.ids[i];
            if self
                .tokenizer
                .id_to_token(id)
                .is_some_and(|t| is_byte_token(&t))
            {
                start = i;
            } else if !(self.skip_special && self.tokenizer.skipped(id)) {
                break;
            }
        }
        start
    }

    /// Adds one generated id and returns the text it completes (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        if id as usize >= self.tokenizer.vocab_size() {
            return Err(Error::invalid(
                "id",
                format!(
                    "token id {id} is outside the vocabulary (size {})",
                    self.tokenizer.vocab_size()
                ),
            ));
        }
        self.ids.push(id);
        let result = self.advance();
        if result.is_err() {
            self.ids.pop();
        }
        result
    }

    fn advance(&mut self) -> Result<String> {
        let run_start = self.byte_run_start();
        let tail = self.text_after_context(self.ids.len())?;
        if run_start == self.ids.len() && !tail.ends_with(char::REPLACEMENT_CHARACTER) {
            // Everything pending is final: return the rest and make it the next context.
            let new = tail
                .strip_prefix(&self.emitted)
                .map(str::to_string)
                .ok_or_else(|| self.not_incremental(&tail, &self.emitted))?;
            if tail.is_empty() {
                // The pending ids show nothing (skipped special tokens, empty pieces): keep the
                // old context, or the decoder's rules for the start of a text (SentencePiece's
                // leading-space strip) would apply to the next token. Skipped ids are invisible
                // to the decoder and can go.
                let pending = self.ids.split_off(self.context);
                let (tokenizer, skip) = (self.tokenizer, self.skip_special);
                self.ids.extend(
                    pending
                        .into_iter()
                        .filter(|&id| !(skip && tokenizer.skipped(id))),
                );
            } else {
                self.ids.drain(..self.context);
            }
            self.context = self.ids.len();
            self.emitted.clear();
            return Ok(new);
        }
        // Return what precedes the byte run and any incomplete character, if that grew.
        let settled = if run_start == self.ids.len() {
            tail
        } else {
            self.text_after_context(run_start)?
        };
        let stable = settled.trim_end_matches(char::REPLACEMENT_CHARACTER);
        let new = stable
            .strip_prefix(self.emitted.as_str())
            .map(str::to_string)
            .unwrap_or_default();
        if !stable.starts_with(self.emitted.as_str()) && !self.emitted.starts_with(stable) {
            return Err(self.not_incremental(stable, &self.emitted));
        }
        self.emitted.push_str(&new);
        Ok(new)
    }

    /// Returns whatever text is still held back (incomplete characters come out as U+FFFD, as in
    /// a full decode) and resets the decoder for a new sequence.
    pub fn finish(&mut self) -> Result<String> {
        let tail = self.text_after_context(self.ids.len())?;
        let rest = tail
            .strip_prefix(&self.emitted)
            .map(str::to_string)
            .ok_or_else(|| self.not_incremental(&tail, &self.emitted))?;
        self.ids.clear();
        self.context = 0;
        self.emitted.clear();
        Ok(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_tokens_are_recognised() {
        assert!(is_byte_token("<0x0A>") && is_byte_token("<0xff>"));
        for t in ["<0x0>", "<0x0AB>", "<0xGG>", "0x0A", "<0x0A]", "▁<0x0A>"] {
            assert!(!is_byte_token(t), "{t}");
        }
    }
}
