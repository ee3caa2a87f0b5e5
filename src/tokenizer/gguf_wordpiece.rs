//! A GGUF `bert` vocabulary (WordPiece, as llama.cpp's converter writes it) made back into the
//! Hugging Face WordPiece tokenizer it came from: BERT's normaliser (uncased, accents
//! stripped, control characters dropped, CJK characters split) and pre-tokenizer (whitespace
//! and punctuation), then greedy longest-match word pieces.
//!
//! llama.cpp's converter stores a word-initial piece `w` as `▁w` and a continuation `##w` as
//! `w`, and keeps bracketed special tokens (`[CLS]`, `[SEP]`, `[unused0]`) as they are; a file
//! whose pieces carry no `▁` is read as Hugging Face's own spelling (`##` continuations).

#![deny(clippy::arithmetic_side_effects)]

use tokenizers::decoders::wordpiece::WordPiece as WordPieceDecoder;
use tokenizers::models::bpe::Vocab;
use tokenizers::models::wordpiece::WordPiece;
use tokenizers::normalizers::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::{DecoderWrapper, ModelWrapper, NormalizerWrapper, PreTokenizerWrapper};

use crate::{Error, Result};

/// The visible space marker llama.cpp puts before word-initial pieces (U+2581).
const WORD_START: &str = "\u{2581}";

/// Hugging Face's mark of a piece that continues a word.
const CONTINUES: &str = "##";

/// The longest word (in characters) cut into pieces; longer ones are the unknown token, as in
/// BERT's own tokenizer.
const MAX_WORD_CHARS: usize = 100;

/// `token` of a GGUF WordPiece vocabulary in Hugging Face's spelling; `phantom` when the file
/// marks word starts with `▁` (llama.cpp's converter), `special` for control tokens.
pub(super) fn hf_piece(token: &str, phantom: bool, special: bool) -> String {
    if !phantom || special || is_bracketed(token) {
        return token.to_string();
    }
    match token.strip_prefix(WORD_START) {
        Some(word) => word.to_string(),
        None => format!("{CONTINUES}{token}"),
    }
}

/// `[CLS]`, `[unused3]`: BERT's bracketed special tokens, which the converter keeps as they are
/// (as it does any token that starts with `[` and ends with `]`, `[]` too).
fn is_bracketed(token: &str) -> bool {
    token.len() >= 2 && token.starts_with('[') && token.ends_with(']')
}

/// The WordPiece tokenizer of `tokens` (ids are positions; `special[i]` marks control tokens),
/// with `unk` the unknown token's id; `file` names the model in errors.
pub(super) fn build(
    tokens: &[String],
    special: &dyn Fn(usize) -> bool,
    unk: u32,
    file: &str,
) -> Result<tokenizers::Tokenizer> {
    // llama.cpp's spelling has word starts marked and no `##`; Hugging Face's the reverse
    let phantom = tokens.iter().any(|t| t.starts_with(WORD_START))
        && !tokens.iter().any(|t| t.starts_with(CONTINUES));
    let mut vocab = Vocab::with_capacity(tokens.len());
    let mut unk_piece = None;
    for (i, t) in tokens.iter().enumerate() {
        let id = u32::try_from(i)
            .map_err(|_| Error::format(file, format!("{} tokens overflow u32", tokens.len())))?;
        let piece = hf_piece(t, phantom, special(i));
        if id == unk {
            unk_piece = Some(piece.clone());
        }
        // later duplicates win, as in llama.cpp's token-to-id map
        vocab.insert(piece, id);
    }
    let unk_piece = unk_piece.ok_or_else(|| {
        Error::format(
            file,
            format!("the unknown token's id {unk} is outside the vocabulary"),
        )
    })?;
    let model = WordPiece::builder()
        .vocab(vocab)
        .unk_token(unk_piece)
        .continuing_subword_prefix(CONTINUES.to_string())
        .max_input_chars_per_word(MAX_WORD_CHARS)
        .build()
        .map_err(|e| Error::format(file, format!("building the WordPiece vocabulary: {e}")))?;
    let mut inner = tokenizers::Tokenizer::new(ModelWrapper::WordPiece(model));
    inner
        .with_normalizer(Some(NormalizerWrapper::BertNormalizer(
            BertNormalizer::default(),
        )))
        .with_pre_tokenizer(Some(PreTokenizerWrapper::BertPreTokenizer(
            BertPreTokenizer,
        )))
        .with_decoder(Some(DecoderWrapper::WordPiece(WordPieceDecoder::new(
            CONTINUES.to_string(),
            true,
        ))));
    Ok(inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_take_back_their_hugging_face_spelling() {
        assert_eq!(hf_piece("\u{2581}hello", true, false), "hello");
        assert_eq!(hf_piece("llo", true, false), "##llo");
        assert_eq!(hf_piece("[CLS]", true, true), "[CLS]");
        assert_eq!(hf_piece("[unused7]", true, false), "[unused7]");
        // a lone bracket is a piece like any other; a bracketed pair is kept
        assert_eq!(hf_piece("[", true, false), "##[");
        assert_eq!(hf_piece("[]", true, false), "[]");
        assert_eq!(hf_piece("##llo", false, false), "##llo");
    }

    #[test]
    fn words_are_cut_into_the_longest_pieces() {
        let tokens: Vec<String> = [
            "[PAD]", "[UNK]", "[CLS]", "[SEP]", "▁hello", "▁he", "llo", "▁,", "▁world",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let tk = build(&tokens, &|i| i < 4, 1, "t.gguf").unwrap();
        let ids = |text: &str| tk.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(ids("Hello, WORLD"), vec![4, 7, 8]);
        assert_eq!(ids("hellollo"), vec![4, 6]);
        // a word with no complete cut is the unknown token whole
        assert_eq!(ids("hehello"), vec![1]);
        assert_eq!(ids("hello zzz"), vec![4, 1]);
        assert!(build(&tokens, &|_| false, 99, "t.gguf")
            .unwrap_err()
            .to_string()
            .contains("outside the vocabulary"));
    }
}
