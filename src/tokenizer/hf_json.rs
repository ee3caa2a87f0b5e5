//! [`Tokenizer::from_json`]: a Hugging Face `tokenizer.json` (and `tokenizer_config.json`),
//! with the parts `tokenizers` would panic on checked first.

use crate::{Error, Result};

use super::{is_special_id, tk_err, SpecialIds, Tokenizer, END_OF_TURN_TOKENS};

impl Tokenizer {
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
            check_empty_replacements(decoder, file)?;
        }
        check_empty_replacements(normalizer, file)?;
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
        // convention when the config is silent, and the token that closes an input (BERT's
        // `[SEP]`): it runs on one stand-in token, which the special tokens surround.
        let stand_in = tokenizers::Token::new(u32::MAX, String::new(), (0, 0));
        let template = inner
            .post_process(
                tokenizers::Encoding::from_tokens(vec![stand_in], 0),
                None,
                true,
            )
            .map_err(|e| tk_err("running the post-processor", e))?;
        let around = template.get_ids();
        let at = around.iter().position(|&id| id == u32::MAX);
        let template_bos = around
            .first()
            .copied()
            .filter(|&id| id != u32::MAX && is_special_id(&inner, id));
        let sep = at
            .and_then(|at| around.get(at.saturating_add(1)))
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
            None,
            SpecialIds {
                bos,
                eos,
                unk,
                pad,
                sep,
                add_bos,
                vocab_size: None,
            },
        )
    }
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

/// Refuses a `Replace` (normalizer or decoder) whose pattern matches the empty string: it
/// inserts its content between every two characters, so a chain of them multiplies a text's
/// length (a fuzzed tokenizer.json took 24 s to encode a few words). Found by replacing a probe
/// character the pattern does not match: the content appears beside it.
fn check_empty_replacements(v: &serde_json::Value, file: &str) -> Result<()> {
    use serde_json::Value;
    use tokenizers::normalizers::replace::Replace;
    const PROBE: &str = "\u{e000}";
    match v {
        Value::Object(o) => {
            if o.get("type").and_then(Value::as_str) == Some("Replace") {
                // one that does not parse is refused by `tokenizers` itself
                if let Ok(replace) = serde_json::from_value::<Replace>(v.clone()) {
                    let out = tokenizers::Decoder::decode_chain(&replace, vec![PROBE.into()]);
                    let out = out.map(|pieces| pieces.concat()).unwrap_or_default();
                    if out != PROBE && out.contains(PROBE) {
                        return Err(Error::Unsupported {
                            file: file.to_string(),
                            what: "`Replace` whose pattern matches the empty string".to_string(),
                        });
                    }
                }
            }
            o.values()
                .try_for_each(|v| check_empty_replacements(v, file))
        }
        Value::Array(a) => a.iter().try_for_each(|v| check_empty_replacements(v, file)),
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
