//! [`Tokenizer::from_gguf`]: a tokenizer assembled from a GGUF file's `tokenizer.ggml.*`
//! metadata, byte-level BPE (`gpt2`), SentencePiece BPE (`llama`) or WordPiece (`bert`).

#![deny(clippy::arithmetic_side_effects)]

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{
    AddedToken, DecoderWrapper, ModelWrapper, NormalizerWrapper, PreTokenizerWrapper,
};

use crate::format::gguf::GgufHeader;
use crate::{Error, Result};

use super::regex_split::RegexSplits;
use super::{tk_err, SpecialIds, Tokenizer, END_OF_TURN_TOKENS};

/// SentencePiece's visible space marker (U+2581).
const SPACE_MARKER: &str = "\u{2581}";

/// GGUF `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
mod token_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    pub const BYTE: i32 = 6;
}

/// GPT-2's pre-tokenizer regex (llama.cpp's `gpt-2` pre-type and the second pass of others).
const GPT2_REGEX: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Llama 3's pre-tokenizer regex with the case-insensitive group spelled out, as llama.cpp has it.
const LLAMA3_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's: Llama 3's with single digits.
const QWEN2_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The regexes llama.cpp applies, in order, for a `tokenizer.ggml.pre` name; `None` if unknown.
/// Each regex splits every piece the previous ones produced, keeping matches and the text
/// between them as separate pieces.
fn pre_tokenizer_regexes(pre: &str) -> Option<(&'static [&'static str], bool)> {
    // The bool is BPE `ignore_merges`: Llama 3 looks whole words up in the vocabulary first.
    Some(match pre {
        "gpt-2" | "phi-2" | "mpt" | "olmo" => (&[GPT2_REGEX], false),
        "smollm" | "starcoder" | "refact" | "codeshell" => (&[r"\p{N}", GPT2_REGEX], false),
        "llama-bpe" | "llama3" | "llama-v3" => (&[LLAMA3_REGEX], true),
        "qwen2" | "deepseek-r1-qwen" => (&[QWEN2_REGEX], false),
        "default" => (
            &[
                r"[\p{P}\$\+<=>\^~\|]+",
                GPT2_REGEX,
                r"\p{N}+",
                r"[0-9][0-9][0-9]",
            ],
            false,
        ),
        _ => return None,
    })
}

impl Tokenizer {
    /// Builds a tokenizer from the `tokenizer.ggml.*` metadata of a GGUF file.
    ///
    /// Supports `tokenizer.ggml.model` = `gpt2` (byte-level BPE; `tokenizer.ggml.pre` picks the
    /// pre-tokenizer: `gpt-2`, `smollm`, `llama-bpe`, `qwen2`, `default` and a few aliases),
    /// `llama` (SentencePiece BPE with scores and byte fallback) and `bert` (WordPiece, uncased;
    /// every text read as `[CLS] text [SEP]`). Anything else is [`Error::Unsupported`].
    pub fn from_gguf(header: &GgufHeader) -> Result<Self> {
        let file = header.file();
        let required = |key: &str| Error::format(file, format!("missing metadata key `{key}`"));
        let model = header
            .get_str("tokenizer.ggml.model")?
            .ok_or_else(|| required("tokenizer.ggml.model"))?;
        let tokens = header
            .get_str_array("tokenizer.ggml.tokens")?
            .ok_or_else(|| required("tokenizer.ggml.tokens"))?;
        let vocab = GgufVocab {
            file,
            model,
            pre: header.get_str("tokenizer.ggml.pre")?,
            tokens,
            token_types: header.get_i32_array("tokenizer.ggml.token_type")?,
            scores: header.get_f32_array("tokenizer.ggml.scores")?,
            merges: header.get_str_array("tokenizer.ggml.merges")?,
            bos: header.get_u32("tokenizer.ggml.bos_token_id")?,
            eos: header.get_u32("tokenizer.ggml.eos_token_id")?,
            eot: header.get_u32("tokenizer.ggml.eot_token_id")?,
            eom: header.get_u32("tokenizer.ggml.eom_token_id")?,
            unk: header.get_u32("tokenizer.ggml.unknown_token_id")?,
            pad: header.get_u32("tokenizer.ggml.padding_token_id")?,
            cls: header.get_u32("tokenizer.ggml.cls_token_id")?,
            // llama.cpp's key, spelled as it writes it
            sep: header.get_u32("tokenizer.ggml.seperator_token_id")?,
            add_bos: header.get_bool("tokenizer.ggml.add_bos_token")?,
            add_eos: header.get_bool("tokenizer.ggml.add_eos_token")?,
            add_space_prefix: header.get_bool("tokenizer.ggml.add_space_prefix")?,
        };
        vocab.build()
    }
}

/// The `tokenizer.ggml.*` metadata, borrowed from a GGUF header.
struct GgufVocab<'a> {
    file: &'a str,
    model: &'a str,
    pre: Option<&'a str>,
    tokens: &'a [String],
    token_types: Option<&'a [i32]>,
    scores: Option<&'a [f32]>,
    merges: Option<&'a [String]>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    cls: Option<u32>,
    sep: Option<u32>,
    add_bos: Option<bool>,
    add_eos: Option<bool>,
    add_space_prefix: Option<bool>,
}

/// Which family a GGUF vocabulary belongs to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum GgufModel {
    /// `gpt2`: byte-level BPE.
    Gpt2,
    /// `llama`: SentencePiece BPE.
    Llama,
    /// `bert`: WordPiece.
    Bert,
}

impl GgufVocab<'_> {
    fn format(&self, message: impl Into<String>) -> Error {
        Error::format(self.file, message)
    }

    fn token_type(&self, id: usize) -> i32 {
        self.token_types
            .and_then(|t| t.get(id).copied())
            .unwrap_or(token_type::NORMAL)
    }

    fn build(&self) -> Result<Tokenizer> {
        let kind = match self.model {
            "gpt2" => GgufModel::Gpt2,
            "llama" => GgufModel::Llama,
            "bert" => GgufModel::Bert,
            other => {
                return Err(Error::Unsupported {
                    file: self.file.to_string(),
                    what: format!("tokenizer model `{other}` (tokenizer.ggml.model)"),
                })
            }
        };
        let n = self.tokens.len();
        if n == 0 {
            return Err(self.format("`tokenizer.ggml.tokens` is empty"));
        }
        if u32::try_from(n).is_err() {
            return Err(self.format(format!("`tokenizer.ggml.tokens` has {n} entries")));
        }
        if let Some(types) = self.token_types {
            if types.len() != n {
                return Err(self.format(format!(
                    "`tokenizer.ggml.token_type` has {} entries but there are {n} tokens",
                    types.len()
                )));
            }
        }
        if let Some(scores) = self.scores {
            if scores.len() != n {
                return Err(self.format(format!(
                    "`tokenizer.ggml.scores` has {} entries but there are {n} tokens",
                    scores.len()
                )));
            }
        }
        let check_id = |key: &str, id: Option<u32>| -> Result<Option<u32>> {
            match id {
                Some(id) if id as usize >= n => Err(self.format(format!(
                    "`tokenizer.ggml.{key}` is {id}, outside the vocabulary of {n} tokens"
                ))),
                _ => Ok(id),
            }
        };
        // llama.cpp's defaults for SentencePiece vocabularies that omit the ids.
        let spm_default = |id: u32| (kind == GgufModel::Llama && (id as usize) < n).then_some(id);
        // BERT's own names where the file gives no id
        let named = |name: &str| {
            (kind == GgufModel::Bert)
                .then(|| self.tokens.iter().position(|t| t == name))
                .flatten()
                .and_then(|i| u32::try_from(i).ok())
        };
        let bos = check_id("bos_token_id", self.bos)?.or_else(|| spm_default(1));
        let eos = check_id("eos_token_id", self.eos)?.or_else(|| spm_default(2));
        let unk = check_id("unknown_token_id", self.unk)?
            .or_else(|| spm_default(0))
            .or_else(|| named("[UNK]"));
        // a WordPiece text opens with [CLS] and closes with [SEP] (unless the file says it adds
        // no closing token); another vocabulary's whole input closes with EOS where the file
        // says to add one
        let (bos, sep) = match kind {
            GgufModel::Bert => (
                check_id("cls_token_id", self.cls)?
                    .or(bos)
                    .or_else(|| named("[CLS]")),
                match self.add_eos {
                    Some(false) => None,
                    _ => check_id("seperator_token_id", self.sep)?
                        .or(eos)
                        .or_else(|| named("[SEP]")),
                },
            ),
            _ => (bos, eos.filter(|_| self.add_eos == Some(true))),
        };
        let eot = check_id("eot_token_id", self.eot)?;
        let eom = check_id("eom_token_id", self.eom)?;
        let pad = check_id("padding_token_id", self.pad)?;

        // Later duplicates win, as in llama.cpp's token-to-id map.
        let vocab: Vocab = self
            .tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();

        let (mut inner, splits) = match kind {
            GgufModel::Gpt2 => {
                let (inner, splits) = self.build_gpt2(vocab)?;
                (inner, Some(splits))
            }
            GgufModel::Llama => (self.build_llama(vocab, unk)?, None),
            GgufModel::Bert => {
                let unk = unk.ok_or_else(|| {
                    self.format("a WordPiece vocabulary needs an unknown token (`[UNK]`)")
                })?;
                let special = |i: usize| {
                    matches!(
                        self.token_type(i),
                        token_type::CONTROL | token_type::UNKNOWN
                    )
                };
                (
                    super::gguf_wordpiece::build(self.tokens, &special, unk, self.file)?,
                    None,
                )
            }
        };

        // Control and unknown tokens are special (matched in text only when asked, dropped by
        // skip-special decoding); user-defined ones are always matched as whole tokens.
        let mut special = Vec::new();
        let mut user = Vec::new();
        for (i, t) in self.tokens.iter().enumerate() {
            // An empty pattern would match everywhere.
            if t.is_empty() {
                continue;
            }
            match self.token_type(i) {
                token_type::CONTROL | token_type::UNKNOWN => {
                    special.push(AddedToken::from(t.clone(), true).normalized(false))
                }
                token_type::USER_DEFINED => {
                    user.push(AddedToken::from(t.clone(), false).normalized(false))
                }
                // Normal, unused and `<0xNN>` byte tokens live in the BPE vocabulary only.
                token_type::NORMAL | token_type::UNUSED | token_type::BYTE => {}
                _ => {}
            }
        }
        // Tokens without a type table: treat the BOS/EOS/UNK entries as control tokens.
        if self.token_types.is_none() {
            for id in [bos, eos, unk, eot, eom].into_iter().flatten() {
                let Some(t) = self.tokens.get(id as usize) else {
                    continue;
                };
                if !special.iter().any(|a: &AddedToken| &a.content == t) {
                    special.push(AddedToken::from(t.clone(), true).normalized(false));
                }
            }
        }
        // One call: each call rebuilds the added vocabulary's matchers over every added token,
        // and specialness travels with each token, so this is the two calls' result at half
        // the cost.
        special.extend(user);
        inner.add_tokens(&special);

        let add_bos = self.add_bos.unwrap_or(match kind {
            GgufModel::Llama | GgufModel::Bert => true,
            GgufModel::Gpt2 => matches!(self.pre, Some("llama-bpe" | "llama3" | "llama-v3")),
        });
        let mut eos_ids: Vec<u32> = [eos, eot, eom].into_iter().flatten().collect();
        for (i, t) in self.tokens.iter().enumerate() {
            if self.token_type(i) == token_type::CONTROL && END_OF_TURN_TOKENS.contains(&t.as_str())
            {
                eos_ids.push(i as u32);
            }
        }
        Tokenizer::assemble(
            inner,
            splits,
            SpecialIds {
                bos,
                eos: eos_ids,
                unk,
                pad,
                sep,
                add_bos,
                vocab_size: Some(n),
            },
        )
    }

    /// Byte-level BPE, and the regex splits that run before its byte mapping.
    fn build_gpt2(&self, vocab: Vocab) -> Result<(tokenizers::Tokenizer, RegexSplits)> {
        let merges_raw = self
            .merges
            .ok_or_else(|| self.format("missing metadata key `tokenizer.ggml.merges`"))?;
        let mut merges = Vec::with_capacity(merges_raw.len());
        for (i, m) in merges_raw.iter().enumerate() {
            // Split at the first space after the first character, as llama.cpp does, so a
            // merge whose left part starts with a space still parses.
            let first_len = m.chars().next().map_or(0, char::len_utf8);
            let split = m
                .get(first_len..)
                .and_then(|rest| rest.find(' '))
                .map(|p| p.saturating_add(first_len));
            let Some(at) = split else {
                return Err(self.format(format!(
                    "`tokenizer.ggml.merges`[{i}] is `{m}`, expected two tokens separated by a space"
                )));
            };
            // `at` is a space, one byte: the right part starts right after it
            let (left, right) = m.split_at(at);
            merges.push((left.to_string(), right[1..].to_string()));
        }
        let pre = self.pre.unwrap_or("default");
        let (regexes, ignore_merges) =
            pre_tokenizer_regexes(pre).ok_or_else(|| Error::Unsupported {
                file: self.file.to_string(),
                what: format!("pre-tokenizer `{pre}` (tokenizer.ggml.pre)"),
            })?;
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(ignore_merges)
            .build()
            .map_err(|e| self.format(format!("`tokenizer.ggml.merges`: {e}")))?;

        // The regexes split (compiled once per process and shared); ByteLevel only maps
        // bytes to its printable alphabet.
        let splits = RegexSplits::new(regexes)?;
        let mut inner = tokenizers::Tokenizer::new(ModelWrapper::BPE(bpe));
        inner
            .with_pre_tokenizer(Some(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
                false, false, false,
            ))))
            .with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::new(
                false, false, false,
            ))));
        Ok((inner, splits))
    }

    fn build_llama(&self, vocab: Vocab, unk: Option<u32>) -> Result<tokenizers::Tokenizer> {
        let scores = self
            .scores
            .ok_or_else(|| self.format("missing metadata key `tokenizer.ggml.scores`"))?;
        let merges = self.spm_merges(&vocab, scores);
        let mut builder = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .byte_fallback(true)
            .fuse_unk(true);
        if let Some(unk) = unk.and_then(|id| self.tokens.get(id as usize)) {
            builder = builder.unk_token(unk.clone());
        }
        let bpe = builder
            .build()
            .map_err(|e| self.format(format!("building the SentencePiece BPE: {e}")))?;

        let add_space_prefix = self.add_space_prefix.unwrap_or(true);
        let to_marker = Replace::new(" ", SPACE_MARKER).map_err(|e| tk_err("normalizer", e))?;
        let normalizer = if add_space_prefix {
            NormalizerWrapper::Sequence(NormalizerSequence::new(vec![
                NormalizerWrapper::Prepend(Prepend::new(SPACE_MARKER.to_string())),
                NormalizerWrapper::Replace(to_marker),
            ]))
        } else {
            NormalizerWrapper::Replace(to_marker)
        };
        let from_marker = Replace::new(SPACE_MARKER, " ").map_err(|e| tk_err("decoder", e))?;
        let mut decoders = vec![
            DecoderWrapper::Replace(from_marker),
            DecoderWrapper::ByteFallback(ByteFallback::new()),
            DecoderWrapper::Fuse(Fuse::new()),
        ];
        if add_space_prefix {
            decoders.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
        }
        let mut inner = tokenizers::Tokenizer::new(ModelWrapper::BPE(bpe));
        inner
            .with_normalizer(Some(normalizer))
            .with_decoder(Some(DecoderWrapper::Sequence(DecoderSequence::new(
                decoders,
            ))));
        Ok(inner)
    }

    /// BPE merges for a SentencePiece vocabulary: every split of a normal token into two
    /// vocabulary entries is a merge, ranked by the merged token's score (higher first; ties by
    /// token id, then by the ids of the two parts), as Hugging Face's Llama converter does.
    fn spm_merges(&self, vocab: &Vocab, scores: &[f32]) -> Vec<(String, String)> {
        struct Found<'t> {
            score: f32,
            id: usize,
            ids: (u32, u32),
            parts: (&'t str, &'t str),
        }
        let mut found = Vec::new();
        for (id, (piece, &score)) in self.tokens.iter().zip(scores).enumerate() {
            // Only pieces that SentencePiece itself could produce by merging, and not ones that
            // lost their id to a later duplicate.
            if self.token_type(id) != token_type::NORMAL || vocab.get(piece) != Some(&(id as u32)) {
                continue;
            }
            for (at, _) in piece.char_indices().skip(1) {
                let (l, r) = piece.split_at(at);
                if let (Some(&li), Some(&ri)) = (vocab.get(l), vocab.get(r)) {
                    found.push(Found {
                        score,
                        id,
                        ids: (li, ri),
                        parts: (l, r),
                    });
                }
            }
        }
        found.sort_by(|a, b| {
            b.score
                .total_cmp(&a.score)
                .then(a.id.cmp(&b.id))
                .then(a.ids.cmp(&b.ids))
        });
        found
            .into_iter()
            .map(|f| (f.parts.0.to_string(), f.parts.1.to_string()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pre_tokenizer_regex_compiles() {
        for pre in [
            "gpt-2",
            "phi-2",
            "mpt",
            "olmo",
            "smollm",
            "starcoder",
            "refact",
            "codeshell",
            "llama-bpe",
            "llama3",
            "llama-v3",
            "qwen2",
            "deepseek-r1-qwen",
            "default",
        ] {
            let (regexes, _) = pre_tokenizer_regexes(pre).unwrap();
            RegexSplits::new(regexes).unwrap_or_else(|e| panic!("{pre}: {e}"));
        }
        assert!(pre_tokenizer_regexes("gpt2").is_none());
    }

    /// Merges are ranked by the merged piece's score, best first; control and byte tokens are
    /// never merge results.
    #[test]
    fn spm_merges_follow_scores() {
        let tokens: Vec<String> = ["<s>", "a", "b", "c", "ab", "bc", "abc", "<0x61>", "<s"]
            .map(String::from)
            .to_vec();
        let types = [3, 1, 1, 1, 1, 1, 1, 6, 3];
        let scores = [0.0, -1.0, -2.0, -3.0, -5.0, -4.0, -6.0, 0.0, 0.0];
        let v = GgufVocab {
            file: "t",
            model: "llama",
            pre: None,
            tokens: &tokens,
            token_types: Some(&types),
            scores: Some(&scores),
            merges: None,
            bos: None,
            eos: None,
            eot: None,
            eom: None,
            unk: None,
            pad: None,
            cls: None,
            sep: None,
            add_bos: None,
            add_eos: None,
            add_space_prefix: None,
        };
        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let merges = v.spm_merges(&vocab, &scores);
        let pairs: Vec<(&str, &str)> = merges
            .iter()
            .map(|(l, r)| (l.as_str(), r.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [("b", "c"), ("a", "b"), ("a", "bc"), ("ab", "c")],
            "bc (-4) before ab (-5) before abc (-6); abc's splits by part ids"
        );
    }
}
