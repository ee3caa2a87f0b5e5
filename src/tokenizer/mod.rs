//! Text to token ids and back: a [`Tokenizer`] built from a Hugging Face `tokenizer.json` or from
//! the vocabulary a GGUF file carries, and a [`StreamDecoder`] that turns generated ids into text
//! one token at a time without ever splitting a character.
//!
//! Both sources end up as a `tokenizers::Tokenizer`; for GGUF we assemble one from
//! `tokenizer.ggml.*` the way llama.cpp interprets that metadata:
//! - `model = gpt2`: byte-level BPE from `tokens` + `merges`, split first by the regexes llama.cpp
//!   uses for the `tokenizer.ggml.pre` name;
//! - `model = llama`: SentencePiece-style BPE whose merge priorities come from `scores` (as Hugging
//!   Face's Llama converter derives them), with `<0xNN>` byte fallback and the `▁` space marker.

#![deny(clippy::arithmetic_side_effects)]

mod bytes;
mod gguf_vocab;
mod gguf_wordpiece;
mod hf_json;
mod regex_split;
mod stream;

use std::fmt;

use tokenizers::{AddedVocabulary, Model, OffsetType, PreTokenizer};

use crate::{Error, Result};
use regex_split::RegexSplits;

pub use bytes::SPECIAL_MARKER;
pub(crate) use hf_json::config_token;
pub use stream::StreamDecoder;

/// Text of control tokens that end a turn in common chat formats. llama.cpp treats these as
/// end-of-generation in addition to the ids the metadata names; so do we.
const END_OF_TURN_TOKENS: &[&str] = &[
    "<|endoftext|>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<|end_of_text|>",
    "<end_of_turn>",
    "<EOT>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
];

/// Control tokens that decoding keeps even when it leaves control tokens out: they mark tool
/// calls in an answer (Mistral's), whose text the calls are read back from.
pub const KEPT_SPECIAL_TOKENS: &[&str] = &["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"];

fn tk_err(context: &str, e: impl fmt::Display) -> Error {
    Error::Tokenizer(format!("{context}: {e}"))
}

/// A tokenizer: text to ids ([`encode`](Self::encode)) and ids to text ([`decode`](Self::decode),
/// [`stream_decoder`](Self::stream_decoder)), with the model's BOS/EOS conventions.
pub struct Tokenizer {
    /// The pipeline (normalizer, pre-tokenizer, BPE model, decoder) and its added tokens.
    inner: tokenizers::Tokenizer,
    /// Regex splits that run before `inner`'s pre-tokenizer (GGUF byte-level vocabularies),
    /// kept outside it so that their compiled regexes are shared between tokenizers.
    splits: Option<RegexSplits>,
    /// A copy of `inner`'s added vocabulary that does not split out special tokens, so that
    /// `<|im_start|>` in untrusted text is tokenized as plain characters.
    plain_added: AddedVocabulary,
    /// Beginning-of-sequence token.
    bos_id: Option<u32>,
    /// End-of-generation tokens, the model's EOS first.
    eos_ids: Vec<u32>,
    /// Unknown-token id, when the vocabulary has one.
    unk_id: Option<u32>,
    /// Padding id, when the metadata names one.
    pad_id: Option<u32>,
    /// The token that closes a whole input to be embedded (BERT's `[SEP]`).
    sep_id: Option<u32>,
    /// Whether `encode` prepends BOS when the caller does not say.
    add_bos: bool,
    /// Number of ids, added tokens included.
    vocab_size: usize,
    /// The control tokens of [`KEPT_SPECIAL_TOKENS`] this vocabulary has.
    kept_special: Vec<u32>,
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("bos_id", &self.bos_id)
            .field("eos_ids", &self.eos_ids)
            .field("unk_id", &self.unk_id)
            .field("pad_id", &self.pad_id)
            .field("sep_id", &self.sep_id)
            .field("add_bos", &self.add_bos)
            .finish_non_exhaustive()
    }
}

/// The special-token facts shared by both constructors.
struct SpecialIds {
    bos: Option<u32>,
    eos: Vec<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    /// The token after a whole input (see [`Tokenizer::encode_whole`]).
    sep: Option<u32>,
    add_bos: bool,
    /// The number of ids when the source numbers its tokens 0..n (GGUF); `None` to find the
    /// largest id in the assembled vocabulary.
    vocab_size: Option<usize>,
}

impl Tokenizer {
    fn assemble(
        mut inner: tokenizers::Tokenizer,
        splits: Option<RegexSplits>,
        ids: SpecialIds,
    ) -> Result<Self> {
        // A tokenizer.json may ask for truncation or padding; we never want either silently.
        inner
            .with_truncation(None)
            .map_err(|e| tk_err("disabling truncation", e))?;
        inner.with_padding(None);
        let mut plain_added = inner.get_added_vocabulary().clone();
        plain_added.set_encode_special_tokens(true);
        // Ids may have holes (some tokenizer.json files skip ids): size by the largest id,
        // which a GGUF vocabulary gives (ids 0..n) without a copy of the whole vocabulary.
        let listed = inner.get_vocab_size(true);
        let vocab_size = match ids.vocab_size {
            Some(n) => n.max(listed),
            None => {
                let largest = inner.get_vocab(true).into_values().max();
                listed.max(largest.map_or(0, |id| (id as usize).saturating_add(1)))
            }
        };
        let mut eos = Vec::with_capacity(ids.eos.len());
        for id in ids.eos {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
        let kept_special = KEPT_SPECIAL_TOKENS
            .iter()
            .filter_map(|t| inner.token_to_id(t))
            .filter(|&id| is_special_id(&inner, id))
            .collect();
        Ok(Self {
            kept_special,
            inner,
            splits,
            plain_added,
            bos_id: ids.bos,
            eos_ids: eos,
            unk_id: ids.unk,
            pad_id: ids.pad,
            sep_id: ids.sep,
            add_bos: ids.add_bos && ids.bos.is_some(),
            vocab_size,
        })
    }

    /// Token ids for `text`.
    ///
    /// With `special`, control tokens written in the text (`<|im_start|>`, `<s>`, ...) become
    /// their ids; without it they are tokenized as the characters they are made of, which is what
    /// untrusted user text needs. `add_bos`: prepend BOS; `None` follows the model's default.
    pub fn encode(&self, text: &str, special: bool, add_bos: Option<bool>) -> Result<Vec<u32>> {
        let add_bos = add_bos.unwrap_or(self.add_bos);
        let mut ids = Vec::new();
        if add_bos {
            let bos = self.bos_id.ok_or_else(|| {
                Error::invalid("add_bos", "this tokenizer has no BOS token to add")
            })?;
            ids.push(bos);
        }
        // The steps of `tokenizers::Tokenizer::encode` (added tokens, normalizer, pre-tokenizer,
        // model), with our choice of added-token matcher and no post-processor: BOS is ours.
        let added = if special {
            self.inner.get_added_vocabulary()
        } else {
            &self.plain_added
        };
        let mut pieces = added.extract_and_normalize(self.inner.get_normalizer(), text);
        if let Some(splits) = &self.splits {
            splits.split(&mut pieces)?;
        }
        if let Some(pre) = self.inner.get_pre_tokenizer() {
            pre.pre_tokenize(&mut pieces)
                .map_err(|e| tk_err("pre-tokenizing", e))?;
        }
        let model = self.inner.get_model();
        pieces
            .tokenize(|piece| model.tokenize(piece.get()))
            .map_err(|e| tk_err("tokenizing", e))?;
        let encoding = pieces
            .into_encoding(None, 0, OffsetType::None)
            .map_err(|e| tk_err("tokenizing", e))?;
        ids.extend_from_slice(encoding.get_ids());
        Ok(ids)
    }

    /// `text` as one whole input to be embedded: [`Tokenizer::encode`] with the tokenizer's
    /// default BOS and no special tokens recognised in the text, then the token that closes an
    /// input where the tokenizer has one (BERT's `[SEP]`: `[CLS] text [SEP]`).
    pub fn encode_whole(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.encode(text, false, None)?;
        ids.extend(self.sep_id);
        Ok(ids)
    }

    /// The token that closes a whole input ([`Tokenizer::encode_whole`]), where there is one.
    pub fn sep_id(&self) -> Option<u32> {
        self.sep_id
    }

    /// The text of `ids`. With `skip_special`, control tokens (BOS, EOS, `<|im_start|>`, ...)
    /// are left out, except those that mark tool calls ([`KEPT_SPECIAL_TOKENS`]). An id
    /// outside the vocabulary is an error.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(Error::invalid(
                "ids",
                format!(
                    "token id {bad} is outside the vocabulary (size {})",
                    self.vocab_size
                ),
            ));
        }
        if ids.is_empty() {
            return Ok(String::new());
        }
        if skip_special && ids.iter().any(|id| self.kept_special.contains(id)) {
            let shown: Vec<u32> = ids
                .iter()
                .copied()
                .filter(|&id| !self.skipped(id))
                .collect();
            return self
                .inner
                .decode(&shown, false)
                .map_err(|e| tk_err("decoding", e));
        }
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| tk_err("decoding", e))
    }

    /// Number of token ids, added and special tokens included.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Beginning-of-sequence id, if the model has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// Ids that end generation: the model's EOS first, then end-of-turn tokens (EOT, EOM,
    /// `<|im_end|>`, ...). Empty when the model names none.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// Unknown-token id, if the vocabulary has one.
    pub fn unk_id(&self) -> Option<u32> {
        self.unk_id
    }

    /// Padding id, if the metadata names one.
    pub fn pad_id(&self) -> Option<u32> {
        self.pad_id
    }

    /// Whether [`encode`](Self::encode) prepends BOS when `add_bos` is `None`.
    pub fn add_bos_default(&self) -> bool {
        self.add_bos
    }

    /// Whether `id` is a special (control) token.
    pub fn is_special(&self, id: u32) -> bool {
        is_special_id(&self.inner, id)
    }

    /// Whether `skip_special` decoding leaves `id` out: a control token other than those of
    /// [`KEPT_SPECIAL_TOKENS`].
    pub fn skipped(&self, id: u32) -> bool {
        !self.kept_special.contains(&id) && self.is_special(id)
    }

    /// The id of `text` where it is one control token of this vocabulary (a tool-call marker
    /// a grammar holds to that token).
    pub fn control_token(&self, text: &str) -> Option<u32> {
        self.inner
            .token_to_id(text)
            .filter(|&id| self.is_special(id))
    }

    /// The id of a token given as it is stored in the vocabulary (`<|im_end|>`, `Ġthe`, `▁the`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary entry for `id`, as stored (byte-level or `▁`-marked), not decoded text.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }
}

fn is_special_id(inner: &tokenizers::Tokenizer, id: u32) -> bool {
    inner
        .id_to_token(id)
        .is_some_and(|t| inner.get_added_vocabulary().is_special_token(&t))
}
