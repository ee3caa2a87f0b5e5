//! What one step of either backend runs: its rows (a token at a position of a sequence's KV
//! slot) and the checks both backends make on them before running anything.

use crate::config::ModelConfig;
use crate::error::{Error, Result};

/// Tokens per prefill step: long prompts are processed in chunks of this many.
pub const DEFAULT_CHUNK: usize = crate::model::weights::PREFILL_CHUNK;

/// One sequence's token in a batched step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchToken {
    /// The KV slot holding the sequence (`0..slots`, distinct within a step).
    pub slot: usize,
    /// The token's position: the sequence's positions `0..pos` are cached in the slot.
    pub pos: usize,
    /// The token id.
    pub token: u32,
}

/// The rows of one call of [`super::Backend::run`]: which tokens run, at which positions and
/// over which sequence's keys. Every kind of step the session makes is one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rows<'a> {
    /// `tokens` for the main sequence, from its cached position on (a prompt, cut into
    /// chunks by the backend; one decode token; a speculative step's drafted tokens). The
    /// main sequence's fill mark moves past them.
    Next(&'a [u32]),
    /// `tokens` for the sequence in KV slot `slot`, whose positions before `pos` are cached;
    /// the main sequence's fill mark is left alone, even for slot 0.
    InSlot {
        /// The KV slot (`0..slots`).
        slot: usize,
        /// The first token's position.
        pos: usize,
        /// The tokens, at `pos..`.
        tokens: &'a [u32],
    },
    /// One token for each of several sequences (batched decoding, beam search), each at its
    /// own position in its own slot, in one step.
    Batch(&'a [BatchToken]),
}

/// Fails unless every id of `tokens` is inside a vocabulary of `vocab` (both backends).
pub fn check_ids(tokens: &[u32], vocab: usize) -> Result<()> {
    match tokens.iter().find(|&&t| t as usize >= vocab) {
        Some(bad) => Err(Error::invalid(
            "tokens",
            format!("token id {bad} is outside the vocabulary of {vocab}"),
        )),
        None => Ok(()),
    }
}

/// Fails unless a KV cache of `context` positions is within the model's trained context.
pub fn check_context(config: &ModelConfig, context: usize) -> Result<()> {
    if context == 0 || context > config.context_length {
        return Err(Error::invalid(
            "context",
            format!(
                "must be in 1..={} (the model's context)",
                config.context_length
            ),
        ));
    }
    Ok(())
}

/// Tokens per step of `config`'s model with a cache of `context` positions: `chunk`, or for a
/// bidirectional model (an encoder) the whole context, since its tokens read every position of
/// their text and a text must run in one step.
pub fn step_tokens(config: &ModelConfig, context: usize, chunk: usize) -> usize {
    match config.bidirectional {
        true => chunk.max(context),
        false => chunk,
    }
}

/// Fails unless a bidirectional model's run of `tokens` starts its text (`pos` 0) and fits
/// one step of `chunk` tokens: each of its tokens reads the whole text, so a text can neither
/// continue cached positions nor be cut into steps.
pub fn check_whole_text(
    config: &ModelConfig,
    pos: usize,
    tokens: usize,
    chunk: usize,
) -> Result<()> {
    if !config.bidirectional {
        return Ok(());
    }
    let name = config.arch.name();
    if pos != 0 {
        return Err(Error::invalid(
            "tokens",
            format!(
                "this {name} model reads each text whole (bidirectional attention): {tokens} \
                 tokens cannot continue {pos} cached ones"
            ),
        ));
    }
    if tokens > chunk {
        return Err(Error::invalid(
            "tokens",
            format!(
                "this {name} model reads each text whole (bidirectional attention) in one step \
                 of at most {chunk} tokens; this text is {tokens}"
            ),
        ));
    }
    Ok(())
}
