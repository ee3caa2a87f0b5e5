//! Batched generation: the sequences of several prompts (and a prompt's
//! `num_return_sequences`) decoded together, one forward step advancing all of them, each in
//! its own KV slot with its own sampler, stop rules and token limit.
//!
//! Continuous batching: a prompt is prefilled into a free slot and joins the running batch;
//! a sequence that ends frees its slot for the next waiting one, so a long answer does not
//! hold up the others. The samples of one prompt share its prefill (its KV rows are copied
//! to their slots). Beam search, speculative decoding and `use_cache: false` run each prompt
//! alone, as [`Session::generate`] does. A sequence that reaches the end of its slot's
//! context ends there (finish reason `length`, with a warning): a batch does not slide.

use std::collections::VecDeque;
use std::sync::Arc;

use web_time::Instant;

use super::running::Running;
use super::{
    elapsed_ms, Ctx, FinishReason, GenerateOptions, Generation, Prompt, Sequence, Session, Stats,
    TokenEvent,
};
use crate::backend::{BatchToken, Output, Readback, Rows, StepLogits};
use crate::constrain::Constraint;
use crate::error::{Error, Result};
use crate::sampling::{Sampler, SelectRequest};

/// One prompt of a batch with its own options.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchItem {
    /// What to generate from.
    pub prompt: Prompt,
    /// Its options (sampling, stops, limits, echo ...).
    pub options: GenerateOptions,
}

/// A prompt of the batch, prepared.
pub(super) struct Item {
    pub(super) tokens: Vec<u32>,
    pub(super) stops: Vec<u32>,
    pub(super) start: Instant,
    pub(super) stats: Stats,
    pub(super) warnings: Vec<String>,
    pub(super) echo: Option<String>,
    pub(super) sampler: Sampler,
    /// Its response format, compiled (`None`: free text).
    pub(super) constraint: Option<Constraint>,
    /// Its sequences as they end, by sequence index.
    pub(super) done: Vec<Option<Sequence>>,
    /// When its first sequence started decoding, and when its last one ended.
    pub(super) decode_span: Option<(Instant, Instant)>,
}

/// A sequence in a slot.
pub(super) struct Lane<'t> {
    pub(super) item: usize,
    /// The prompt index its events carry.
    pub(super) prompt: usize,
    pub(super) slot: usize,
    /// Positions cached in the slot (the next token's position).
    pub(super) pos: usize,
    pub(super) run: Running<'t>,
    pub(super) sampler: Sampler,
    /// What the last step read for this sequence, and its row in that step.
    pub(super) logits: Option<(StepLogits, usize)>,
    pub(super) request: Option<SelectRequest>,
    /// The token to feed next.
    pub(super) next: u32,
}

impl Session {
    /// Generates from every item, decoding up to `max_batch` sequences together (default:
    /// as many as the device and the KV memory allow, see [`Session::batch_limit`]); results
    /// in input order, events carry the item's index. Greedy results are those of
    /// [`Session::generate`] on each item alone, and seeded sampling draws the same tokens.
    pub async fn generate_items(
        &mut self,
        items: &[BatchItem],
        max_batch: Option<usize>,
        on_token: &mut dyn FnMut(&TokenEvent),
    ) -> Result<Vec<Generation>> {
        if max_batch == Some(0) {
            return Err(Error::invalid("max_batch", "must be at least 1"));
        }
        self.abort.clear();
        let mut out: Vec<Option<Generation>> = vec![None; items.len()];
        // what cannot run batched runs alone, first
        let alone = |i: &BatchItem| runs_alone(&i.options);
        for (index, item) in items.iter().enumerate().filter(|(_, i)| alone(i)) {
            match self
                .generate_one(index, &item.prompt, &item.options, on_token)
                .await
            {
                Ok(g) => out[index] = Some(g),
                Err(e) => {
                    self.reset();
                    return Err(e);
                }
            }
        }
        let batched: Vec<usize> = (0..items.len()).filter(|&i| !alone(&items[i])).collect();
        if !batched.is_empty() {
            let result = self
                .run_batched(items, &batched, max_batch, on_token, &mut out)
                .await;
            // the slots hold the batch's rows, not a conversation; their memory goes back
            self.reset();
            let shrunk = self.release_slots().await;
            result?;
            shrunk?;
        }
        out.into_iter()
            .map(|g| g.ok_or_else(|| Error::invalid("items", "an item produced no result")))
            .collect()
    }

    /// Gives the KV slots of batched decoding back: one sequence of the context remains.
    pub(super) async fn release_slots(&mut self) -> Result<()> {
        self.forward.set_batch(1).await
    }

    /// Sequences a batched step can hold with a KV cache of the current context: at most
    /// `wanted`, the forward pass's step size and what one layer's binding holds.
    pub fn batch_limit(&self, wanted: usize) -> usize {
        wanted
            .min(self.forward.max_batch())
            .min(self.forward.slots_that_fit())
            .max(1)
    }

    async fn run_batched(
        &mut self,
        items: &[BatchItem],
        which: &[usize],
        max_batch: Option<usize>,
        on_token: &mut dyn FnMut(&TokenEvent),
        out: &mut [Option<Generation>],
    ) -> Result<()> {
        let tokenizer = Arc::clone(&self.tokenizer);
        let mut prepared: Vec<Option<Item>> = (0..items.len()).map(|_| None).collect();
        let mut waiting = VecDeque::new();
        for &i in which {
            let item = self.prepare_item(i, &items[i], on_token)?;
            for s in 0..item.done.len() {
                if items[i].options.sampling.max_new_tokens == 0 {
                    continue;
                }
                waiting.push_back((i, s));
            }
            prepared[i] = Some(item);
        }
        let lanes_wanted = waiting.len();
        let slots = self.batch_limit(max_batch.unwrap_or(usize::MAX).min(lanes_wanted));
        self.cached.clear();
        self.forward.set_batch(slots.max(1)).await?;
        let mut free: Vec<usize> = (0..slots).rev().collect();
        let mut lanes: Vec<Lane<'_>> = Vec::new();
        loop {
            let aborted = self.abort.is_aborted();
            // sample every sequence's next token from what its last step read
            let mut k = 0;
            while k < lanes.len() {
                let finish = match aborted {
                    true => Some(FinishReason::Abort),
                    false => {
                        self.lane_token(&mut lanes[k], &mut prepared, on_token)
                            .await?
                    }
                };
                match finish {
                    None => k += 1,
                    Some(f) => {
                        // keep the batch in admission order (swap_remove would reorder it)
                        let mut lane = lanes.remove(k);
                        free.push(lane.slot);
                        let item = prepared[lane.item].as_mut().ok_or_else(gone)?;
                        item.warnings.extend(lane.run.incomplete(f));
                        let sequence = lane.run.sequence();
                        let seq = lane.run.finish(&lane_ctx(lane.prompt, item), f, on_token)?;
                        item.decode_span = item.decode_span.map(|(s, _)| (s, Instant::now()));
                        item.done[sequence] = Some(seq);
                    }
                }
            }
            if aborted {
                for (i, s) in waiting.drain(..) {
                    let item = prepared[i].as_mut().ok_or_else(gone)?;
                    item.done[s] = Some(self.aborted_sequence());
                }
                break;
            }
            // admit waiting sequences into the free slots: one prefill per prompt
            let mut admitted = false;
            while let (Some(&(i, _)), false) = (waiting.front(), free.is_empty()) {
                let mut group = Vec::new();
                while let (Some(&(j, s)), Some(slot)) = (waiting.front(), free.last().copied()) {
                    if j != i {
                        break;
                    }
                    waiting.pop_front();
                    free.pop();
                    group.push((s, slot));
                }
                let item = prepared[i].as_mut().ok_or_else(gone)?;
                let row = self.prefill_group(item, &group).await?;
                let item = prepared[i].as_mut().ok_or_else(gone)?;
                let params = &items[i].options.sampling;
                let first = FirstRow {
                    row: &row,
                    prompt: i,
                };
                start_lanes(&tokenizer, (i, item), params, &group, first, &mut lanes)?;
                admitted = true;
            }
            if admitted {
                // the new sequences draw their first token before the next step
                continue;
            }
            if lanes.is_empty() {
                break;
            }
            self.batch_step(&mut lanes).await?;
        }
        for &i in which {
            let item = prepared[i].take().ok_or_else(gone)?;
            out[i] = Some(finish_item(item));
        }
        Ok(())
    }

    /// Checks and tokenizes one item, streams its echo, and sets up its sampler.
    pub(super) fn prepare_item(
        &mut self,
        index: usize,
        item: &BatchItem,
        on_token: &mut dyn FnMut(&TokenEvent),
    ) -> Result<Item> {
        let start = Instant::now();
        // the one check of the item's options
        let params = &item.options.check(self.vocab())?;
        let mut warnings = Vec::new();
        let (tokens, _, stops) = self.prepare_prompt(&item.prompt, &item.options, &mut warnings)?;
        let constraint = self.constraint(&item.options)?;
        let mut sampler = Sampler::checked(params)?;
        sampler.set_top_logprobs(item.options.top_logprobs)?;
        let echo = self.echo(index, &item.prompt, &tokens, &item.options, on_token)?;
        let n = params.num_return_sequences;
        let empty = Sequence {
            tokens: Vec::new(),
            text: String::new(),
            finish_reason: FinishReason::Length,
            logprob: 0.0,
        };
        let done = match params.max_new_tokens {
            0 => vec![Some(empty); n],
            _ => vec![None; n],
        };
        Ok(Item {
            stats: Stats {
                prompt_tokens: tokens.len(),
                ..Stats::default()
            },
            tokens,
            stops,
            start,
            warnings,
            echo,
            sampler,
            constraint,
            done,
            decode_span: None,
        })
    }

    /// Prefills `item`'s prompt into the first slot of `group` and copies its KV rows to the
    /// others; returns the prompt's last logits row.
    pub(super) async fn prefill_group(
        &mut self,
        item: &mut Item,
        group: &[(usize, usize)],
    ) -> Result<Vec<f32>> {
        let t = Instant::now();
        let first = group.first().map(|g| g.1).ok_or_else(gone)?;
        let out = self
            .forward
            .run(
                Rows::InSlot {
                    slot: first,
                    pos: 0,
                    tokens: &item.tokens,
                },
                Readback::LastRow,
            )
            .await?;
        let Output::Logits(row) = out else {
            return Err(Error::invalid("prompt", "the prefill returned no logits"));
        };
        let others: Vec<usize> = group.iter().skip(1).map(|g| g.1).collect();
        self.forward
            .copy_slot_prefix(first, &others, item.tokens.len())?;
        if item.stats.prefill_ms == 0.0 {
            item.stats.prefill_ms = elapsed_ms(t);
        }
        item.stats.full_row_steps += group.len();
        Ok(row)
    }

    /// Draws `lane`'s next token from what its last step read, streams it, and says why the
    /// sequence ends, if it does (also when its slot has no room for another position).
    pub(super) async fn lane_token(
        &mut self,
        lane: &mut Lane<'_>,
        items: &mut [Option<Item>],
        on_token: &mut dyn FnMut(&TokenEvent),
    ) -> Result<Option<FinishReason>> {
        let item = items[lane.item].as_mut().ok_or_else(gone)?;
        let Some((logits, row)) = lane.logits.take() else {
            return Ok(None);
        };
        let vocab = self.vocab();
        let s = match (&logits, &lane.request) {
            (StepLogits::Candidates(c), Some(request)) => {
                match lane
                    .sampler
                    .sample_candidates(c, request, &item.tokens, &lane.run.tokens)?
                {
                    Some(s) => {
                        item.stats.candidate_steps += 1;
                        s
                    }
                    None => {
                        item.stats.select_fallbacks += 1;
                        item.stats.full_row_steps += 1;
                        let full = self.forward.logits_row(row).await?;
                        lane.sampler
                            .sample(&full[..vocab], &item.tokens, &lane.run.tokens)?
                    }
                }
            }
            (StepLogits::Full(full), _) => {
                // a sequence's first row is counted at its prefill
                if !lane.run.tokens.is_empty() {
                    item.stats.full_row_steps += 1;
                }
                lane.sampler
                    .sample(&full[..vocab], &item.tokens, &lane.run.tokens)?
            }
            (StepLogits::Candidates(_), None) => {
                item.stats.full_row_steps += 1;
                let full = self.forward.logits_row(row).await?;
                lane.sampler
                    .sample(&full[..vocab], &item.tokens, &lane.run.tokens)?
            }
        };
        if item.decode_span.is_none() {
            let now = Instant::now();
            item.decode_span = Some((now, now));
            item.stats.time_to_first_token_ms = elapsed_ms(item.start);
        }
        let c = lane_ctx(lane.prompt, item);
        if let Some(finish) = lane.run.emit(&c, &s, None, on_token)? {
            return Ok(Some(finish));
        }
        if lane.pos >= self.context() {
            item.warnings.push(format!(
                "sequence {} reached the context of {} positions and ended there (batched decoding does not slide the context)",
                lane.run.sequence(),
                self.context()
            ));
            return Ok(Some(FinishReason::Length));
        }
        lane.next = s.id;
        // the next draw's mask first: the request carries it to the GPU
        lane.run
            .constrain(&mut lane.sampler, &item.stops, &mut item.stats)?;
        lane.request = match self.full_row_readback {
            true => None,
            false => lane
                .sampler
                .select_request(&item.tokens, &lane.run.tokens)?,
        };
        Ok(None)
    }

    /// One forward step for every lane: each feeds its token at its position.
    pub(super) async fn batch_step(&mut self, lanes: &mut [Lane<'_>]) -> Result<()> {
        let tokens: Vec<BatchToken> = lanes
            .iter()
            .map(|l| BatchToken {
                slot: l.slot,
                pos: l.pos,
                token: l.next,
            })
            .collect();
        let requests: Vec<Option<&SelectRequest>> =
            lanes.iter().map(|l| l.request.as_ref()).collect();
        let rows = self.forward.decode_batch(&tokens, &requests).await?;
        for (row, (lane, logits)) in lanes.iter_mut().zip(rows).enumerate() {
            lane.pos += 1;
            lane.logits = Some((logits, row));
        }
        Ok(())
    }
}

/// The result of a prepared item whose sequences all ended.
pub(super) fn finish_item(item: Item) -> Generation {
    let mut stats = item.stats;
    let aborted = || Sequence {
        tokens: Vec::new(),
        text: String::new(),
        finish_reason: FinishReason::Abort,
        logprob: 0.0,
    };
    let mut sequences: Vec<Sequence> = item
        .done
        .into_iter()
        .map(|s| s.unwrap_or_else(aborted))
        .collect();
    if let Some(text) = &item.echo {
        for s in &mut sequences {
            s.text.insert_str(0, text);
        }
    }
    stats.generated_tokens = sequences.iter().map(|s| s.tokens.len()).sum();
    if let Some((first, last)) = item.decode_span {
        stats.decode_ms = last.duration_since(first).as_secs_f64() * 1000.0;
    }
    if stats.decode_ms > 0.0 {
        let steps = stats.generated_tokens.saturating_sub(sequences.len());
        stats.decode_tok_per_s = steps as f64 / (stats.decode_ms / 1000.0);
    }
    let params = item.sampler.params();
    Generation {
        prompt_tokens: item.tokens,
        sequences,
        seed: (!params.is_greedy() && params.max_new_tokens > 0).then(|| item.sampler.seed()),
        stats,
        warnings: item.warnings,
    }
}

/// The prompt's last logits row after its prefill, and the prompt index the events carry.
pub(super) struct FirstRow<'r> {
    pub(super) row: &'r [f32],
    pub(super) prompt: usize,
}

/// Starts a lane for each `(sequence, slot)` of `group` of the prefilled item `(index, item)`:
/// each draws its first token from `first.row` under its own sampler stream, its first mask set.
pub(super) fn start_lanes<'t>(
    tokenizer: &'t crate::tokenizer::Tokenizer,
    (index, item): (usize, &mut Item),
    params: &crate::sampling::SamplingParams,
    group: &[(usize, usize)],
    first: FirstRow<'_>,
    lanes: &mut Vec<Lane<'t>>,
) -> Result<()> {
    for &(s, slot) in group {
        let mut lane = Lane {
            item: index,
            prompt: first.prompt,
            slot,
            pos: item.tokens.len(),
            run: Running::new(tokenizer, params, s, item.constraint.as_ref()),
            sampler: item.sampler.for_sequence(s),
            logits: Some((StepLogits::Full(first.row.to_vec()), 0)),
            request: None,
            next: 0,
        };
        // the first draw's mask (each later one is set after a token is taken)
        lane.run
            .constrain(&mut lane.sampler, &item.stops, &mut item.stats)?;
        lanes.push(lane);
    }
    Ok(())
}

/// Whether a request with `options` runs alone rather than in a batch: beam search,
/// speculative decoding and `use_cache: false`.
pub(super) fn runs_alone(options: &GenerateOptions) -> bool {
    options.sampling.num_beams > 1 || options.speculative.is_some() || options.no_kv_cache
}

pub(super) fn gone() -> Error {
    Error::invalid("batch", "internal: a batched sequence lost its prompt")
}

/// The call context a lane's sequence streams under.
pub(super) fn lane_ctx(index: usize, item: &Item) -> Ctx<'_> {
    Ctx {
        index,
        prompt: &item.tokens,
        n_keep: 0,
        stops: &item.stops,
        start: item.start,
        speculative: None,
        constraint: item.constraint.as_ref(),
    }
}
