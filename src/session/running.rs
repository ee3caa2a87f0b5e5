//! One sampled sequence as it runs: its tokens, text and log-probability, its stop rules, its
//! place in the call's constraint, and what each new token does to them (emitted, finished).

use crate::constrain::{Constraint, GrammarState};
use crate::error::Result;
use crate::sampling::{Sampled, Sampler, StopMatcher, TokenMask};

use super::{elapsed_ms, Ctx, FinishReason, Sequence, Stats, TokenEvent};
use web_time::Instant;

/// Live state of one sampled sequence.
pub(super) struct Running<'t> {
    pub tokens: Vec<u32>,
    text: String,
    logprob: f64,
    decoder: crate::tokenizer::StreamDecoder<'t>,
    stops: StopMatcher,
    /// The sequence's index among `num_return_sequences`.
    sequence: usize,
    max_new_tokens: usize,
    /// Where the sequence stands in the call's constraint, if it has one.
    grammar: Option<GrammarState>,
}

/// Restricts `sampler`'s next draw to what `grammar` allows from where it stands (`ends`:
/// the ids that end the text, allowed only where the grammar may end), and counts the work
/// in `stats` (`constraint_ms`, `constrained_steps`). Returns the mask (its bits are shared,
/// not copied), for a caller that meets the same state again.
pub(super) fn restrict(
    grammar: &mut GrammarState,
    sampler: &mut Sampler,
    ends: &[u32],
    stats: &mut Stats,
) -> Result<TokenMask> {
    let t = Instant::now();
    let mask = grammar.mask(ends)?;
    sampler.set_mask(Some(mask.clone()))?;
    stats.constraint_ms += elapsed_ms(t);
    stats.constrained_steps += 1;
    Ok(mask)
}

impl<'t> Running<'t> {
    /// Sequence `sequence` of a call, before its first token.
    pub fn new(
        tokenizer: &'t crate::tokenizer::Tokenizer,
        params: &crate::sampling::SamplingParams,
        sequence: usize,
        constraint: Option<&Constraint>,
    ) -> Self {
        Self {
            tokens: Vec::new(),
            text: String::new(),
            logprob: 0.0,
            decoder: tokenizer.stream_decoder(true),
            stops: StopMatcher::new(&params.stop),
            sequence,
            max_new_tokens: params.max_new_tokens,
            grammar: constraint.map(Constraint::start),
        }
    }

    /// Restricts `sampler`'s next draw to what the sequence's constraint allows (`ends`: the
    /// ids that end the text, allowed only where the grammar may end); nothing without one.
    /// Adds the time it took to `stats.constraint_ms`. Call it once per draw, before the
    /// draw's selection request is made (the request carries the mask to the GPU): before the
    /// first draw, and after each token is taken.
    pub fn constrain(
        &mut self,
        sampler: &mut Sampler,
        ends: &[u32],
        stats: &mut Stats,
    ) -> Result<()> {
        match &mut self.grammar {
            Some(grammar) => restrict(grammar, sampler, ends, stats).map(drop),
            None => Ok(()),
        }
    }

    /// How many of `tokens`, in order from here, the sequence's constraint allows (an end id
    /// ends them); all of them without a constraint. The sequence's state does not move.
    pub fn allowed_prefix(&mut self, tokens: &[u32], ends: &[u32]) -> Result<usize> {
        let Some(grammar) = &mut self.grammar else {
            return Ok(tokens.len());
        };
        let before_end = tokens
            .iter()
            .position(|t| ends.contains(t))
            .unwrap_or(tokens.len());
        grammar.valid_prefix(&tokens[..before_end])
    }

    /// Whether the call has a constraint (a response format) that restricts this sequence.
    pub fn constrained(&self) -> bool {
        self.grammar.is_some()
    }

    /// A copy of where the sequence stands in its constraint (`None` without one), for
    /// drafting ahead of it: the copy moves with the drafts, the sequence's own state only
    /// with the tokens it keeps.
    pub fn grammar_ahead(&self) -> Option<GrammarState> {
        self.grammar.clone()
    }

    /// When the sequence ended (not by abort) before its constraint's text was complete: the
    /// warning that says so.
    pub fn incomplete(&mut self, finish: FinishReason) -> Option<String> {
        let grammar = self.grammar.as_mut()?;
        if self.stops.stopped() {
            return Some(format!(
                "a stop string cut sequence {}: its text is a part of the {} output and may not satisfy the response format",
                self.sequence,
                grammar.kind()
            ));
        }
        if finish == FinishReason::Abort || grammar.is_complete() {
            return None;
        }
        let why = match finish {
            FinishReason::Length => "reached its token limit",
            _ => "was stopped",
        };
        Some(format!(
            "sequence {} {why} before its {} was complete: the text does not satisfy the response format",
            self.sequence,
            grammar.kind()
        ))
    }

    /// The sequence's index among the call's `num_return_sequences`.
    pub fn sequence(&self) -> usize {
        self.sequence
    }

    /// Ends the sequence for `finish`: streams what the decoder and the stop matcher still
    /// held back (unless a stop string ended it) and returns the result.
    pub fn finish(
        mut self,
        c: &Ctx<'_>,
        finish: FinishReason,
        on_token: &mut dyn FnMut(&TokenEvent),
    ) -> Result<Sequence> {
        if !self.stops.stopped() {
            let rest = self.decoder.finish()?;
            let mut tail = self.stops.push(&rest).text;
            if !self.stops.stopped() {
                tail.push_str(&self.stops.finish());
            }
            if !tail.is_empty() {
                self.text.push_str(&tail);
                on_token(&TokenEvent {
                    prompt: c.index,
                    sequence: self.sequence,
                    id: None,
                    logprob: None,
                    text: tail,
                    beam: None,
                    drafted: None,
                    top_logprobs: None,
                });
            }
        }
        Ok(Sequence {
            tokens: self.tokens,
            text: self.text,
            finish_reason: finish,
            logprob: self.logprob,
        })
    }

    /// Takes sampled token `s`: streams its text (held back while it may start a stop
    /// string) and says why the sequence ends with it, if it does (an end id, which is not
    /// kept; a stop string; `max_new_tokens`).
    pub fn emit(
        &mut self,
        c: &Ctx<'_>,
        s: &Sampled,
        drafted: Option<bool>,
        on_token: &mut dyn FnMut(&TokenEvent),
    ) -> Result<Option<FinishReason>> {
        if c.stops.contains(&s.id) {
            return Ok(Some(FinishReason::Stop));
        }
        self.tokens.push(s.id);
        self.logprob += f64::from(s.logprob);
        if let Some(grammar) = &mut self.grammar {
            grammar.accept(s.id)?;
        }
        let piece = self.decoder.push(s.id)?;
        let out = self.stops.push(&piece);
        self.text.push_str(&out.text);
        on_token(&TokenEvent {
            prompt: c.index,
            sequence: self.sequence,
            id: Some(s.id),
            logprob: Some(s.logprob),
            text: out.text,
            beam: None,
            drafted,
            top_logprobs: (!s.top.is_empty()).then(|| s.top.clone()),
        });
        if out.stopped || self.grammar.as_ref().is_some_and(GrammarState::must_end) {
            return Ok(Some(FinishReason::Stop));
        }
        if self.tokens.len() >= self.max_new_tokens {
            return Ok(Some(FinishReason::Length));
        }
        Ok(None)
    }
}
