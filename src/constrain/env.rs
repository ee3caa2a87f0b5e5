//! The grammar engine's view of our tokenizer: every token's bytes in a trie, and
//! tokenization of bytes for the engine's own use.

use std::sync::Arc;

use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};

use crate::tokenizer::{Tokenizer, SPECIAL_MARKER};
use crate::{Error, Result};

/// Longest token the token trie holds (its nodes record up to 1024 parents).
const MAX_TOKEN_BYTES: usize = 1024;

/// Bytes of all tokens together the trie holds (one node per byte at most, 2^22 nodes).
const MAX_TRIE_BYTES: usize = 1 << 22;

struct Env {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        match std::str::from_utf8(s) {
            Ok(text) => match self.tokenizer.encode(text, false, Some(false)) {
                Ok(ids) if ids.iter().all(|&id| (id as usize) < self.trie.vocab_size()) => ids,
                _ => self.trie.greedy_tokenize(s),
            },
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// The environment for ids `0..vocab` of `tokenizer`, `eos` its end of text.
pub(super) fn token_env(tokenizer: &Arc<Tokenizer>, vocab: usize, eos: u32) -> Result<TokEnv> {
    let mut words = tokenizer.token_bytes()?;
    words.truncate(vocab);
    while words.len() < vocab {
        let id = words.len();
        let mut b = vec![SPECIAL_MARKER];
        b.extend_from_slice(format!("<[{id}]>").as_bytes());
        words.push(b);
    }
    let vocab_size = u32::try_from(vocab)
        .map_err(|_| Error::invalid("vocab_size", format!("{vocab} ids do not fit in u32")))?;
    if eos >= vocab_size {
        return Err(Error::invalid(
            "eos_token_id",
            format!("the end id {eos} is outside the vocabulary of {vocab}"),
        ));
    }
    // The trie's own limits (it asserts them): a token's depth and the number of nodes.
    if let Some((id, w)) = words
        .iter()
        .enumerate()
        .find(|(_, w)| w.len() > MAX_TOKEN_BYTES)
    {
        return Err(Error::invalid(
            "response_format",
            format!(
                "token {id} is {} bytes long; constrained generation handles tokens of at most {MAX_TOKEN_BYTES}",
                w.len()
            ),
        ));
    }
    let total: usize = words.iter().map(Vec::len).sum();
    if total >= MAX_TRIE_BYTES {
        return Err(Error::invalid(
            "response_format",
            format!("the vocabulary's tokens hold {total} bytes; constrained generation handles fewer than {MAX_TRIE_BYTES}"),
        ));
    }
    let info = TokRxInfo::new(vocab_size, eos);
    let trie = TokTrie::from(&info, &words);
    Ok(Arc::new(Env {
        trie,
        tokenizer: Arc::clone(tokenizer),
    }))
}
