//! Beam search (every beam in a KV slot of its own, all beams advanced in one batched step per
//! position) and scoring a text by its mean negative log-likelihood.

use web_time::Instant;

use crate::backend::{BatchToken, Output, Readback, Rows, StepLogits};
use crate::constrain::{Constraint, GrammarState};
use crate::error::{Error, Result};
use crate::sampling::{log_softmax, Checked, Sampler, StopMatcher};

use super::{
    check_token_ids, elapsed_ms, BeamProgress, Ctx, FinishReason, Score, Sequence, Session, Stats,
    TokenEvent,
};

struct Beam {
    tokens: Vec<u32>,
    /// Sum of processed log-probabilities (the beam score).
    score: f64,
    /// Sum of raw log-probabilities.
    logprob: f64,
    /// The KV slot holding the prompt and `tokens`' rows.
    slot: usize,
    /// Logits after the last token.
    logits: Vec<f32>,
    /// Where the beam stands in the call's constraint, if it has one.
    grammar: Option<GrammarState>,
}

/// A beam grown by one token, before its step runs: parent index, tokens, score, raw
/// log-probability, and its constraint state with the token taken.
type Grown = (usize, Vec<u32>, f64, f64, Option<GrammarState>);

struct Candidate {
    beam: usize,
    id: u32,
    score: f64,
    raw: f64,
}

struct Finished {
    tokens: Vec<u32>,
    logprob: f64,
    normalized: f64,
    reason: FinishReason,
    /// The text is complete in the call's constraint (always, without one).
    complete: bool,
}

impl Finished {
    fn new(
        tokens: Vec<u32>,
        score: f64,
        logprob: f64,
        reason: FinishReason,
        length_penalty: f32,
        grammar: Option<&mut GrammarState>,
    ) -> Self {
        let len = tokens.len().max(1) as f64;
        Self {
            normalized: score / crate::math::pow(len, f64::from(length_penalty)),
            tokens,
            logprob,
            reason,
            complete: grammar.is_none_or(|g| g.is_complete()),
        }
    }
}

impl Session {
    /// Beam search: every beam keeps its rows in a KV slot of its own (the prompt is run
    /// once and copied when a beam branches) and one batched step per position advances all
    /// of them. Stop strings cut the finished texts afterwards.
    ///
    /// Under a response format every beam follows the grammar: its forbidden continuations
    /// score `-inf` (the allowed ones keep the model's log-probabilities, as a constrained
    /// Hugging Face beam search does), an end token is a candidate only where the grammar may
    /// end, and a beam whose grammar can only end finishes. A returned text that is not
    /// complete in the grammar gets a warning.
    pub(super) async fn beam_search(
        &mut self,
        c: &Ctx<'_>,
        params: &Checked,
        stats: &mut Stats,
        warnings: &mut Vec<String>,
        on_token: &mut dyn FnMut(&TokenEvent),
    ) -> Result<Vec<Sequence>> {
        let width = params.num_beams;
        let max_new = params.max_new_tokens;
        let p = c.prompt.len();
        if p + max_new > self.context() {
            return Err(Error::invalid(
                "max_new_tokens",
                format!(
                    "beam search cannot slide the context: {p} prompt tokens + {max_new} new tokens exceed the context of {}",
                    self.context()
                ),
            ));
        }
        // Only the logit bias and the penalties shape beam scores (temperature 1 divides by 1;
        // no filter is on).
        let scorer = Sampler::checked(&params.scoring())?;
        let vocab = self.vocab();
        // every beam in a KV slot of its own, all advanced by one step per position
        if self.batch_limit(width) < width {
            return Err(Error::invalid(
                "num_beams",
                format!(
                    "{width} beams need {width} KV slots of {} positions; this device and step size hold {}",
                    self.context(),
                    self.batch_limit(width)
                ),
            ));
        }
        let prefill_start = Instant::now();
        self.cached.clear();
        self.forward.set_batch(width).await?;
        if self.abort.is_aborted() {
            self.release_slots().await?;
            return Ok(vec![self.aborted_sequence()]);
        }
        let first = match self
            .forward
            .run(
                Rows::InSlot {
                    slot: 0,
                    pos: 0,
                    tokens: c.prompt,
                },
                Readback::LastRow,
            )
            .await?
        {
            Output::Logits(row) => row,
            _ => return Err(Error::invalid("prompt", "the prefill returned no logits")),
        };
        stats.prefill_ms = elapsed_ms(prefill_start);
        let mut running = vec![Beam {
            tokens: Vec::new(),
            score: 0.0,
            logprob: 0.0,
            slot: 0,
            logits: first,
            grammar: c.constraint.map(Constraint::start),
        }];
        let mut finished: Vec<Finished> = Vec::new();
        // the tokens of the last streamed leader
        let mut leader: Vec<u32> = Vec::new();
        let decode_start = Instant::now();
        stats.time_to_first_token_ms = elapsed_ms(c.start);
        for step in 0..max_new {
            // Every running beam proposes its best 2·width continuations.
            let mut cands: Vec<Candidate> = Vec::new();
            for (b, beam) in running.iter_mut().enumerate() {
                let raw = log_softmax(&beam.logits[..vocab])?;
                let mut processed = beam.logits[..vocab].to_vec();
                scorer.process(&mut processed, c.prompt, &beam.tokens)?;
                let mut lp = log_softmax(&processed)?;
                if let Some(grammar) = &mut beam.grammar {
                    let t = Instant::now();
                    grammar.mask(c.stops)?.apply(&mut lp);
                    stats.constraint_ms += elapsed_ms(t);
                    stats.constrained_steps += 1;
                }
                let mut ids: Vec<u32> = (0..vocab as u32).collect();
                let k = (2 * width).min(vocab);
                ids.select_nth_unstable_by(k - 1, |&a, &b| {
                    lp[b as usize].total_cmp(&lp[a as usize])
                });
                for &id in ids[..k]
                    .iter()
                    .filter(|&&id| lp[id as usize] > f32::NEG_INFINITY)
                {
                    cands.push(Candidate {
                        beam: b,
                        id,
                        score: beam.score + f64::from(lp[id as usize]),
                        raw: f64::from(raw[id as usize]),
                    });
                }
            }
            cands.sort_by(|a, b| {
                b.score
                    .total_cmp(&a.score)
                    .then(a.beam.cmp(&b.beam))
                    .then(a.id.cmp(&b.id))
            });
            let mut next: Vec<(usize, u32, f64, f64)> = Vec::with_capacity(width);
            for (rank, cand) in cands.iter().enumerate() {
                let parent = &running[cand.beam];
                if c.stops.contains(&cand.id) {
                    if rank < width {
                        // an end token is allowed only where the grammar may end
                        finished.push(Finished::new(
                            parent.tokens.clone(),
                            cand.score,
                            parent.logprob,
                            FinishReason::Stop,
                            params.length_penalty,
                            None,
                        ));
                    }
                    continue;
                }
                next.push((cand.beam, cand.id, cand.score, parent.logprob + cand.raw));
                if next.len() == width {
                    break;
                }
            }
            // the leader after this step, streamed: its text, and whether the lead moved
            if let Some(&(b, id, _, _)) = next.first() {
                let mut tokens = running[b].tokens.clone();
                tokens.push(id);
                let switched = running[b].tokens != leader;
                on_token(&TokenEvent {
                    prompt: c.index,
                    sequence: 0,
                    id: None,
                    logprob: None,
                    text: String::new(),
                    beam: Some(BeamProgress {
                        step,
                        text: self.tokenizer.decode(&tokens, true)?,
                        switched,
                    }),
                    drafted: None,
                    top_logprobs: None,
                });
                leader = tokens;
            }
            finished.sort_by(|a, b| b.normalized.total_cmp(&a.normalized));
            finished.truncate(width);
            let done = finished.len() >= width
                && (params.early_stopping
                    || next.first().is_none_or(|&(_, _, score, _)| {
                        let len = (step + 1) as f64;
                        let best = score / crate::math::pow(len, f64::from(params.length_penalty));
                        finished[width - 1].normalized >= best
                    }));
            if done || next.is_empty() {
                break;
            }
            let mut grown: Vec<Grown> = Vec::with_capacity(next.len());
            for &(b, id, score, logprob) in &next {
                let mut tokens = running[b].tokens.clone();
                tokens.push(id);
                let mut grammar = running[b].grammar.clone();
                if let Some(g) = &mut grammar {
                    g.accept(id)?;
                    if g.must_end() {
                        // nothing may follow: the beam is done
                        finished.push(Finished::new(
                            tokens,
                            score,
                            logprob,
                            FinishReason::Stop,
                            params.length_penalty,
                            None,
                        ));
                        continue;
                    }
                }
                grown.push((b, tokens, score, logprob, grammar));
            }
            if grown.is_empty() {
                break;
            }
            if step + 1 == max_new || self.abort.is_aborted() {
                let reason = if self.abort.is_aborted() {
                    FinishReason::Abort
                } else {
                    FinishReason::Length
                };
                for (_, tokens, score, logprob, mut grammar) in grown {
                    finished.push(Finished::new(
                        tokens,
                        score,
                        logprob,
                        reason,
                        params.length_penalty,
                        grammar.as_mut(),
                    ));
                }
                break;
            }
            running = self.advance_beams(&running, grown, p, width).await?;
        }
        stats.decode_ms = elapsed_ms(decode_start);
        // The slots hold beams, not a conversation; their memory goes back.
        self.cached.clear();
        self.release_slots().await?;
        if finished.is_empty() {
            for mut beam in running {
                finished.push(Finished::new(
                    beam.tokens,
                    beam.score,
                    beam.logprob,
                    FinishReason::Length,
                    params.length_penalty,
                    beam.grammar.as_mut(),
                ));
            }
        }
        finished.sort_by(|a, b| b.normalized.total_cmp(&a.normalized));
        finished.truncate(params.num_return_sequences);
        let mut out = Vec::with_capacity(finished.len());
        for (i, f) in finished.into_iter().enumerate() {
            let mut text = self.tokenizer.decode(&f.tokens, true)?;
            let mut reason = f.reason;
            let mut matcher = StopMatcher::new(&params.stop);
            let cut = matcher.push(&text);
            if cut.stopped {
                text = cut.text;
                reason = FinishReason::Stop;
            }
            if let Some(kind) = c.constraint.map(Constraint::kind) {
                if cut.stopped {
                    warnings.push(format!(
                        "a stop string cut sequence {i}: its text is a part of the {kind} output and may not satisfy the response format"
                    ));
                } else if !f.complete && f.reason != FinishReason::Abort {
                    warnings.push(format!(
                        "sequence {i} reached its token limit before its {kind} was complete: the text does not satisfy the response format"
                    ));
                }
            }
            on_token(&TokenEvent {
                prompt: c.index,
                sequence: i,
                id: None,
                logprob: None,
                text: text.clone(),
                beam: None,
                drafted: None,
                top_logprobs: None,
            });
            out.push(Sequence {
                tokens: f.tokens,
                text,
                finish_reason: reason,
                logprob: f.logprob,
            });
        }
        Ok(out)
    }

    /// Runs every new beam's last token in one batched step. A beam takes its parent's slot
    /// when it is the parent's first child; the others get a free slot (one of a parent with
    /// no child, or one not yet used) with a copy of their parent's rows.
    async fn advance_beams(
        &mut self,
        running: &[Beam],
        grown: Vec<Grown>,
        prompt: usize,
        width: usize,
    ) -> Result<Vec<Beam>> {
        let mut kept = vec![false; running.len()];
        let mut slots: Vec<Option<usize>> = grown
            .iter()
            .map(|&(b, ..)| match kept[b] {
                true => None,
                false => {
                    kept[b] = true;
                    Some(running[b].slot)
                }
            })
            .collect();
        let held: Vec<usize> = running
            .iter()
            .zip(&kept)
            .filter(|(_, &k)| k)
            .map(|(r, _)| r.slot)
            .collect();
        let mut free: Vec<usize> = (0..width).rev().filter(|s| !held.contains(s)).collect();
        for (i, &(b, ..)) in grown.iter().enumerate() {
            if slots[i].is_none() {
                let slot = free
                    .pop()
                    .ok_or_else(|| Error::invalid("num_beams", "internal: no free beam slot"))?;
                let rows = prompt + running[b].tokens.len();
                self.forward
                    .copy_slot_prefix(running[b].slot, &[slot], rows)?;
                slots[i] = Some(slot);
            }
        }
        let tokens: Vec<BatchToken> = grown
            .iter()
            .zip(&slots)
            .map(|((_, tokens, ..), slot)| BatchToken {
                slot: slot.unwrap_or(0),
                pos: prompt + tokens.len() - 1,
                token: tokens[tokens.len() - 1],
            })
            .collect();
        let rows = self
            .forward
            .decode_batch(&tokens, &vec![None; tokens.len()])
            .await?;
        grown
            .into_iter()
            .zip(tokens)
            .zip(rows)
            .map(
                |(((_, tokens, score, logprob, grammar), t), row)| match row {
                    StepLogits::Full(logits) => Ok(Beam {
                        tokens,
                        score,
                        logprob,
                        slot: t.slot,
                        logits,
                        grammar,
                    }),
                    StepLogits::Candidates(_) => Err(Error::invalid(
                        "num_beams",
                        "internal: a beam step read candidates instead of its row",
                    )),
                },
            )
            .collect()
    }

    /// Mean negative log-likelihood of `tokens` (at least 2), in windows of the context length:
    /// each window starts from an empty cache and predicts all its tokens but its first. Clears
    /// the conversation.
    pub async fn score(&mut self, tokens: &[u32]) -> Result<Score> {
        self.abort.clear();
        let result = self.score_inner(tokens).await;
        self.reset();
        result
    }

    async fn score_inner(&mut self, tokens: &[u32]) -> Result<Score> {
        if tokens.len() < 2 {
            return Err(Error::invalid(
                "text",
                format!("scoring needs at least 2 tokens, got {}", tokens.len()),
            ));
        }
        check_token_ids("tokens", tokens, self.vocab())?;
        // Logits rows are as wide as the model's vocabulary.
        let width = self.forward.config().vocab_size;
        let mut nll = 0.0f64;
        let mut count = 0usize;
        for window in tokens.chunks(self.context()) {
            self.reset();
            // Logits of every position but the last predict the next token.
            let inputs = &window[..window.len() - 1];
            let done = self
                .run_chunks(inputs, true, &mut |first, rows| {
                    for (i, row) in rows.chunks(width).enumerate() {
                        let target = window[first + i + 1] as usize;
                        let lp = log_softmax(row)?;
                        nll -= f64::from(lp[target]);
                        count += 1;
                    }
                    Ok(())
                })
                .await?;
            if !done {
                return Err(Error::invalid("score", "aborted"));
            }
        }
        if count == 0 {
            return Err(Error::invalid(
                "text",
                "no token could be predicted (every context window holds one token)",
            ));
        }
        let nll = nll / count as f64;
        Ok(Score {
            tokens: count,
            nll,
            ppl: crate::math::exp(nll),
        })
    }
}
