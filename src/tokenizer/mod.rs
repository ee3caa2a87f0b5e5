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

use std::fmt;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizerSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    AddedToken, AddedVocabulary, DecoderWrapper, Model, ModelWrapper, NormalizerWrapper,
    OffsetType, PreTokenizer, PreTokenizerWrapper, SplitDelimiterBehavior,
};

use crate::format::gguf::GgufHeader;
use crate::{Error, Result};

/// SentencePiece's visible space marker (U+2581).
const SPACE_MARKER: &str = "\u{2581}";

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

fn tk_err(context: &str, e: impl fmt::Display) -> Error {
    Error::Tokenizer(format!("{context}: {e}"))
}

/// A tokenizer: text to ids ([`encode`](Self::encode)) and ids to text ([`decode`](Self::decode),
/// [`stream_decoder`](Self::stream_decoder)), with the model's BOS/EOS conventions.
pub struct Tokenizer {
    /// The pipeline (normalizer, pre-tokenizer, BPE model, decoder) and its added tokens.
    inner: tokenizers::Tokenizer,
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
    /// Whether `encode` prepends BOS when the caller does not say.
    add_bos: bool,
    /// Number of ids, added tokens included.
    vocab_size: usize,
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("bos_id", &self.bos_id)
            .field("eos_ids", &self.eos_ids)
            .field("unk_id", &self.unk_id)
            .field("pad_id", &self.pad_id)
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
    add_bos: bool,
}

impl Tokenizer {
    fn assemble(mut inner: tokenizers::Tokenizer, ids: SpecialIds) -> Result<Self> {
        // A tokenizer.json may ask for truncation or padding; we never want either silently.
        inner
            .with_truncation(None)
            .map_err(|e| tk_err("disabling truncation", e))?;
        inner.with_padding(None);
        let mut plain_added = inner.get_added_vocabulary().clone();
        plain_added.set_encode_special_tokens(true);
        // Ids may have holes (some tokenizer.json files skip ids): size by the largest id.
        let largest = inner.get_vocab(true).into_values().max();
        let vocab_size = inner
            .get_vocab_size(true)
            .max(largest.map_or(0, |id| id as usize + 1));
        let mut eos = Vec::with_capacity(ids.eos.len());
        for id in ids.eos {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
        Ok(Self {
            inner,
            plain_added,
            bos_id: ids.bos,
            eos_ids: eos,
            unk_id: ids.unk,
            pad_id: ids.pad,
            add_bos: ids.add_bos && ids.bos.is_some(),
            vocab_size,
        })
    }

    /// Builds a tokenizer from the bytes of a Hugging Face `tokenizer.json`, plus those of
    /// `tokenizer_config.json` when the model has one (it supplies `add_bos_token` and the
    /// `bos_token` / `eos_token` strings). `file` names the input in errors.
    ///
    /// Without a config, BOS is whatever the post-processor prepends (and BOS is then added by
    /// default), and the EOS ids are the special tokens that end a turn in common chat formats
    /// (`<|endoftext|>`, `<|im_end|>`, `<|eot_id|>`, ...).
    pub fn from_json(
        tokenizer_json: &[u8],
        tokenizer_config_json: Option<&[u8]>,
        file: &str,
    ) -> Result<Self> {
        // `tokenizers` panics on some malformed inputs instead of returning an error (a syntax
        // error inside `decoder`, a bad `Precompiled` normalizer, a template post-processor
        // naming a token it lacks, ...), so the JSON is parsed and those parts are checked here
        // first; `tokenizers` then reads this parse written back: valid JSON, no duplicate keys.
        let json: serde_json::Value = serde_json::from_slice(tokenizer_json)
            .map_err(|e| Error::format(file, format!("not a valid tokenizer.json: {e}")))?;
        let normalizer = json.get("normalizer").unwrap_or(&serde_json::Value::Null);
        if let Some(at) = find_precompiled(normalizer, "normalizer") {
            return Err(Error::Unsupported {
                file: file.to_string(),
                what: format!(
                    "normalizer `Precompiled` (a compiled SentencePiece character map) at `{at}`"
                ),
            });
        }
        if let Some(processor) = json.get("post_processor") {
            check_templates(processor, file)?;
        }
        if let Some(decoder) = json.get("decoder") {
            check_strip_decoders(decoder, file)?;
        }
        if let Some(model) = json.get("model") {
            check_bpe_prefix(model, file)?;
        }
        let inner: tokenizers::Tokenizer = json
            .to_string()
            .parse()
            .map_err(|e| Error::format(file, format!("not a valid tokenizer.json: {e}")))?;
        let config = match tokenizer_config_json {
            Some(bytes) => {
                let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| {
                    Error::format(
                        file,
                        format!("tokenizer_config.json is not valid JSON: {e}"),
                    )
                })?;
                if !v.is_object() {
                    return Err(Error::format(
                        file,
                        "tokenizer_config.json is not a JSON object",
                    ));
                }
                Some(v)
            }
            None => None,
        };

        // What the post-processor would add around a single sequence tells us the BOS
        // convention when the config is silent.
        let template = inner
            .post_process(tokenizers::Encoding::default(), None, true)
            .map_err(|e| tk_err("running the post-processor", e))?;
        let template_bos = template
            .get_ids()
            .first()
            .copied()
            .filter(|&id| is_special_id(&inner, id));

        let token_id = |key: &str| -> Result<Option<u32>> {
            let Some(text) = config.as_ref().and_then(|c| config_token(c, key)) else {
                return Ok(None);
            };
            inner.token_to_id(text).map(Some).ok_or_else(|| {
                Error::format(
                    file,
                    format!(
                        "tokenizer_config.json `{key}` is `{text}`, which is not in the vocabulary"
                    ),
                )
            })
        };
        let config_bool = |key: &str| -> Result<Option<bool>> {
            match config.as_ref().and_then(|c| c.get(key)) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::Bool(b)) => Ok(Some(*b)),
                Some(other) => Err(Error::format(
                    file,
                    format!("tokenizer_config.json `{key}` should be true or false, not {other}"),
                )),
            }
        };

        let bos = token_id("bos_token")?.or(template_bos);
        let add_bos = match config_bool("add_bos_token")? {
            Some(b) => b,
            None => template_bos.is_some() && template_bos == bos,
        };
        let mut eos: Vec<u32> = token_id("eos_token")?.into_iter().collect();
        eos.extend(
            END_OF_TURN_TOKENS
                .iter()
                .filter_map(|t| inner.token_to_id(t))
                .filter(|&id| is_special_id(&inner, id)),
        );
        // UNK and PAD are informational: a config naming one the vocabulary lacks is not fatal.
        let unk = token_id("unk_token").ok().flatten();
        let pad = token_id("pad_token").ok().flatten();
        Self::assemble(
            inner,
            SpecialIds {
                bos,
                eos,
                unk,
                pad,
                add_bos,
            },
        )
    }

    /// Builds a tokenizer from the `tokenizer.ggml.*` metadata of a GGUF file.
    ///
    /// Supports `tokenizer.ggml.model` = `gpt2` (byte-level BPE; `tokenizer.ggml.pre` picks the
    /// pre-tokenizer: `gpt-2`, `smollm`, `llama-bpe`, `qwen2`, `default` and a few aliases) and
    /// `llama` (SentencePiece BPE with scores and byte fallback). Anything else is
    /// [`Error::Unsupported`].
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
            add_bos: header.get_bool("tokenizer.ggml.add_bos_token")?,
            add_space_prefix: header.get_bool("tokenizer.ggml.add_space_prefix")?,
        };
        vocab.build()
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

    /// The text of `ids`. With `skip_special`, control tokens (BOS, EOS, `<|im_start|>`, ...)
    /// are left out. An id outside the vocabulary is an error.
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

    /// Whether `id` is a special (control) token, which `skip_special` decoding leaves out.
    pub fn is_special(&self, id: u32) -> bool {
        is_special_id(&self.inner, id)
    }

    /// The id of a token given as it is stored in the vocabulary (`<|im_end|>`, `Ġthe`, `▁the`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary entry for `id`, as stored (byte-level or `▁`-marked), not decoded text.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

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

fn is_special_id(inner: &tokenizers::Tokenizer, id: u32) -> bool {
    inner
        .id_to_token(id)
        .is_some_and(|t| inner.get_added_vocabulary().is_special_token(&t))
}

/// Where in a tokenizer.json's `normalizer` (at path `at`) a `Precompiled` normalizer is (an
/// object of that `type`, or with a `precompiled_charsmap`), as a path like
/// `normalizer.normalizers[0]`. `tokenizers` trusts that binary trie: a malformed one makes it
/// panic or allocate without bound.
fn find_precompiled(v: &serde_json::Value, at: &str) -> Option<String> {
    match v {
        serde_json::Value::Object(o) => {
            if o.get("type").and_then(|t| t.as_str()) == Some("Precompiled")
                || o.contains_key("precompiled_charsmap")
            {
                return Some(at.to_string());
            }
            o.iter()
                .find_map(|(k, v)| find_precompiled(v, &format!("{at}.{k}")))
        }
        serde_json::Value::Array(a) => a
            .iter()
            .enumerate()
            .find_map(|(i, v)| find_precompiled(v, &format!("{at}[{i}]"))),
        _ => None,
    }
}

/// Checks every `TemplateProcessing` in a tokenizer.json's `post_processor` (any object with
/// `special_tokens`) the way `tokenizers` does when it builds one, but not when it reads one, and
/// then panics applying it: each special token piece must name an entry of `special_tokens`,
/// whose `ids` and `tokens` have the same length, and `single` has no sequence `B`.
fn check_templates(v: &serde_json::Value, file: &str) -> Result<()> {
    use serde_json::Value;
    let bad = |m: String| Err(Error::format(file, format!("post_processor: {m}")));
    match v {
        Value::Object(o) => {
            if let Some(Value::Object(tokens)) = o.get("special_tokens") {
                for (key, token) in tokens {
                    let len =
                        |field: &str| token.get(field).and_then(Value::as_array).map(Vec::len);
                    if len("ids") != len("tokens") {
                        return bad(format!(
                            "special token `{key}` has {:?} ids but {:?} tokens",
                            len("ids"),
                            len("tokens")
                        ));
                    }
                }
                for template in ["single", "pair"] {
                    let pieces = o.get(template).and_then(Value::as_array);
                    for piece in pieces.into_iter().flatten() {
                        if let Some(id) = piece.pointer("/SpecialToken/id").and_then(Value::as_str)
                        {
                            if !tokens.contains_key(id) {
                                return bad(format!(
                                    "`{template}` uses special token `{id}`, which \
                                     `special_tokens` does not define"
                                ));
                            }
                        }
                        if template == "single"
                            && piece.pointer("/Sequence/id").and_then(Value::as_str) == Some("B")
                        {
                            return bad("`single` uses the second sequence `$B`".to_string());
                        }
                    }
                }
            }
            o.values().try_for_each(|v| check_templates(v, file))
        }
        Value::Array(a) => a.iter().try_for_each(|v| check_templates(v, file)),
        _ => Ok(()),
    }
}

/// Refuses `Strip` decoders that strip from the end (`stop` > 0): `tokenizers` panics when a
/// token is shorter than that.
fn check_strip_decoders(v: &serde_json::Value, file: &str) -> Result<()> {
    use serde_json::Value;
    match v {
        Value::Object(o) => {
            if o.get("stop").and_then(Value::as_u64).is_some_and(|n| n > 0) {
                return Err(Error::Unsupported {
                    file: file.to_string(),
                    what: "decoder `Strip` with `stop` > 0".to_string(),
                });
            }
            o.values().try_for_each(|v| check_strip_decoders(v, file))
        }
        Value::Array(a) => a.iter().try_for_each(|v| check_strip_decoders(v, file)),
        _ => Ok(()),
    }
}

/// A BPE model with a `continuing_subword_prefix` merges a token with a continuation, which
/// must start with that prefix: `tokenizers` cuts the prefix off by length and panics when the
/// token is shorter or the cut falls inside a character.
fn check_bpe_prefix(model: &serde_json::Value, file: &str) -> Result<()> {
    use serde_json::Value;
    let Some(prefix) = model
        .get("continuing_subword_prefix")
        .and_then(Value::as_str)
        .filter(|p| !p.is_empty())
    else {
        return Ok(());
    };
    let merges = model.get("merges").and_then(Value::as_array);
    for (i, merge) in merges.into_iter().flatten().enumerate() {
        let right = match merge {
            Value::String(m) => m.split_once(' ').map(|(_, r)| r),
            Value::Array(parts) => parts.get(1).and_then(Value::as_str),
            _ => None,
        };
        if right.is_some_and(|r| !r.starts_with(prefix)) {
            return Err(Error::format(
                file,
                format!(
                    "model: merge #{i} {merge} does not continue with the \
                     continuing_subword_prefix `{prefix}`"
                ),
            ));
        }
    }
    Ok(())
}

/// A `tokenizer_config.json` token entry: a string, or an AddedToken object with `content`.
pub(crate) fn config_token<'a>(config: &'a serde_json::Value, key: &str) -> Option<&'a str> {
    match config.get(key)? {
        serde_json::Value::String(s) => Some(s),
        serde_json::Value::Object(o) => o.get("content")?.as_str(),
        _ => None,
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
    add_bos: Option<bool>,
    add_space_prefix: Option<bool>,
}

/// Which family a GGUF vocabulary belongs to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum GgufModel {
    /// `gpt2`: byte-level BPE.
    Gpt2,
    /// `llama`: SentencePiece BPE.
    Llama,
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
        let bos = check_id("bos_token_id", self.bos)?.or_else(|| spm_default(1));
        let eos = check_id("eos_token_id", self.eos)?.or_else(|| spm_default(2));
        let unk = check_id("unknown_token_id", self.unk)?.or_else(|| spm_default(0));
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

        let mut inner = match kind {
            GgufModel::Gpt2 => self.build_gpt2(vocab)?,
            GgufModel::Llama => self.build_llama(vocab, unk)?,
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
        inner.add_special_tokens(&special);
        inner.add_tokens(&user);

        let add_bos = self.add_bos.unwrap_or(match kind {
            GgufModel::Llama => true,
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
            SpecialIds {
                bos,
                eos: eos_ids,
                unk,
                pad,
                add_bos,
            },
        )
    }

    fn build_gpt2(&self, vocab: Vocab) -> Result<tokenizers::Tokenizer> {
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
                .map(|p| p + first_len);
            let Some(at) = split else {
                return Err(self.format(format!(
                    "`tokenizer.ggml.merges`[{i}] is `{m}`, expected two tokens separated by a space"
                )));
            };
            merges.push((m[..at].to_string(), m[at + 1..].to_string()));
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

        let mut steps = Vec::with_capacity(regexes.len() + 1);
        for r in regexes {
            let split = Split::new(
                SplitPattern::Regex((*r).to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| tk_err("compiling a pre-tokenizer regex", e))?;
            steps.push(PreTokenizerWrapper::Split(split));
        }
        // The regexes did the splitting; ByteLevel only maps bytes to its printable alphabet.
        steps.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
            false, false, false,
        )));
        let mut inner = tokenizers::Tokenizer::new(ModelWrapper::BPE(bpe));
        inner
            .with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(
                PreTokenizerSequence::new(steps),
            )))
            .with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::new(
                false, false, false,
            ))));
        Ok(inner)
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
fn is_byte_token(token: &str) -> bool {
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
            } else if !(self.skip_special && self.tokenizer.is_special(id)) {
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
                        .filter(|&id| !(skip && tokenizer.is_special(id))),
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
            for r in regexes {
                Split::new(
                    SplitPattern::Regex(r.to_string()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                )
                .unwrap_or_else(|e| panic!("{pre}: {r}: {e}"));
            }
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
            add_bos: None,
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
