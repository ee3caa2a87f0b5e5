//! Serving: requests that arrive one by one, each joining the batch that is already decoding
//! (continuous batching across calls, for a server's clients).
//!
//! [`Session::serve`] takes requests from an [`ItemFeed`] while KV slots are free, prefills
//! each into free slots and decodes every running sequence in one forward step; a request
//! that ends gives its slots to the next one at once and is answered through the feed
//! without waiting for the others. Requests join in the order the feed gives them. Greedy
//! answers are those each request would get alone ([`Session::generate`]), and seeded
//! sampling draws the same tokens, as in [`Session::generate_items`]. A request the feed
//! cancels (its client went away) ends with [`FinishReason::Abort`] at the next step. A
//! request that cannot be batched (beam search, speculative decoding, `use_cache: false`)
//! waits until the batch has drained and runs alone. A request's own error (a bad option, a
//! prompt longer than the context) fails that request only; an error of the device fails
//! every request in flight and ends the call.

use std::collections::VecDeque;
use std::sync::Arc;

use web_time::Instant;

use super::batched::{
    finish_item, gone, lane_ctx, runs_alone, start_lanes, BatchItem, FirstRow, Item, Lane,
};
use super::{FinishReason, Generation, Session, TokenEvent};
use crate::backend::gpu::GpuContext;
use crate::error::{Error, Result};

/// Where the requests of [`Session::serve`] come from and where their answers go. The feed
/// names each request with a ticket of its own choosing.
pub trait ItemFeed {
    /// The next request, if one is there. With `wait` (nothing is decoding) it may block
    /// until one comes; `None` then means the feed is closed and serving ends.
    fn next(&mut self, wait: bool) -> Option<(u64, BatchItem)>;
    /// Whether the request no longer wants its answer: its sequences end with
    /// [`FinishReason::Abort`] at the next step (or before its prefill) and it is finished.
    fn cancelled(&mut self, ticket: u64) -> bool;
    /// A token event of the request (`prompt` is always 0).
    fn event(&mut self, ticket: u64, event: &TokenEvent);
    /// The request's answer, once all its sequences have ended, or its error.
    fn finished(&mut self, ticket: u64, result: Result<Generation>);
    /// Called before every batched step with the number of sequences it decodes.
    fn step(&mut self, _sequences: usize) {}
}

/// The requests in the batch, by index (indices are reused once a request is answered).
#[derive(Default)]
struct InFlight {
    items: Vec<Option<Item>>,
    tickets: Vec<Option<u64>>,
    /// A request's own error: its sequences end and it is answered with it.
    errors: Vec<Option<Error>>,
    free: Vec<usize>,
}

impl InFlight {
    fn insert(&mut self, ticket: u64, item: Item) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.items[i] = Some(item);
                self.tickets[i] = Some(ticket);
                self.errors[i] = None;
                i
            }
            None => {
                self.items.push(Some(item));
                self.tickets.push(Some(ticket));
                self.errors.push(None);
                self.items.len() - 1
            }
        }
    }

    fn ticket(&self, index: usize) -> Result<u64> {
        self.tickets.get(index).copied().flatten().ok_or_else(gone)
    }

    fn item(&mut self, index: usize) -> Result<&mut Item> {
        self.items
            .get_mut(index)
            .and_then(Option::as_mut)
            .ok_or_else(gone)
    }

    /// Answers request `index` if all its sequences have ended.
    fn answer_if_done(&mut self, index: usize, feed: &mut dyn ItemFeed) -> Result<()> {
        if !self.item(index)?.done.iter().all(Option::is_some) {
            return Ok(());
        }
        let ticket = self.ticket(index)?;
        let item = self.items[index].take().ok_or_else(gone)?;
        self.tickets[index] = None;
        self.free.push(index);
        match self.errors[index].take() {
            Some(e) => feed.finished(ticket, Err(e)),
            None => feed.finished(ticket, Ok(finish_item(item))),
        }
        Ok(())
    }

    /// Fails every request still in flight with `e`.
    fn fail_all(&mut self, e: &Error, feed: &mut dyn ItemFeed) {
        for (index, ticket) in self.tickets.iter_mut().enumerate() {
            if let Some(t) = ticket.take() {
                self.items[index] = None;
                feed.finished(t, Err(e.clone()));
            }
        }
        self.free = (0..self.items.len()).collect();
    }
}

impl Session {
    /// Serves the feed's requests, up to `slots` sequences decoded together (at most what
    /// [`Session::batch_limit`] allows), until the feed closes (see the
    /// [module documentation](self)). Returns the device's error when one ends the call (every
    /// request in flight has been failed with it); the conversation is forgotten either way.
    pub async fn serve(&mut self, feed: &mut dyn ItemFeed, slots: usize) -> Result<()> {
        self.abort.clear();
        self.reset();
        let slots = self.batch_limit(slots.max(1));
        let mut in_flight = InFlight::default();
        let mut result = self.forward.set_batch(slots).await;
        if result.is_ok() {
            result = self.serve_steps(feed, slots, &mut in_flight).await;
        }
        if let Err(e) = &result {
            in_flight.fail_all(e, feed);
        }
        self.reset();
        let shrunk = self.release_slots().await;
        result?;
        shrunk
    }

    /// Whether `e` concerns the device (every request then fails), not one request.
    fn fails_all(&self, e: &Error) -> bool {
        matches!(e, Error::DeviceLost { .. }) || self.gpu().is_some_and(GpuContext::is_lost)
    }

    async fn serve_steps(
        &mut self,
        feed: &mut dyn ItemFeed,
        slots: usize,
        in_flight: &mut InFlight,
    ) -> Result<()> {
        let tokenizer = Arc::clone(&self.tokenizer);
        let mut waiting: VecDeque<(usize, usize)> = VecDeque::new();
        let mut free: Vec<usize> = (0..slots).rev().collect();
        let mut lanes: Vec<Lane<'_>> = Vec::new();
        let mut alone: Option<(u64, BatchItem)> = None;
        loop {
            // requests join while slots are free, one request's sequences at a time
            while alone.is_none() && waiting.is_empty() && !free.is_empty() {
                let idle = lanes.is_empty();
                let Some((ticket, request)) = feed.next(idle) else {
                    if idle {
                        return Ok(());
                    }
                    break;
                };
                if runs_alone(&request.options) {
                    alone = Some((ticket, request));
                    break;
                }
                let mut route = |e: &TokenEvent| feed.event(ticket, e);
                match self.prepare_item(0, &request, &mut route) {
                    Err(e) => feed.finished(ticket, Err(e)),
                    Ok(item) => {
                        let sequences = item.done.len();
                        let index = in_flight.insert(ticket, item);
                        if request.options.sampling.max_new_tokens > 0 {
                            waiting.extend((0..sequences).map(|s| (index, s)));
                        }
                        in_flight.answer_if_done(index, feed)?;
                    }
                }
            }
            // an abort of the session ends every sequence decoding now; serving goes on
            let aborted = self.abort.is_aborted();
            self.abort.clear();
            // draw every sequence's next token from what its last step read
            let mut k = 0;
            while k < lanes.len() {
                let index = lanes[k].item;
                let ticket = in_flight.ticket(index)?;
                let ended = aborted || in_flight.errors[index].is_some();
                let finish = match ended || feed.cancelled(ticket) {
                    true => Some(FinishReason::Abort),
                    false => match self
                        .lane_token(&mut lanes[k], &mut in_flight.items, &mut |e| {
                            feed.event(ticket, e)
                        })
                        .await
                    {
                        Ok(f) => f,
                        Err(e) if self.fails_all(&e) => return Err(e),
                        Err(e) => {
                            in_flight.errors[index] = Some(e);
                            Some(FinishReason::Abort)
                        }
                    },
                };
                let Some(f) = finish else {
                    k += 1;
                    continue;
                };
                // keep the batch in arrival order (swap_remove would reorder it)
                let mut lane = lanes.remove(k);
                free.push(lane.slot);
                let item = in_flight.item(index)?;
                item.warnings.extend(lane.run.incomplete(f));
                let sequence = lane.run.sequence();
                let mut route = |e: &TokenEvent| feed.event(ticket, e);
                let seq = lane
                    .run
                    .finish(&lane_ctx(lane.prompt, item), f, &mut route)?;
                item.decode_span = item.decode_span.map(|(s, _)| (s, Instant::now()));
                item.done[sequence] = Some(seq);
                in_flight.answer_if_done(index, feed)?;
            }
            // waiting sequences into the free slots: one prefill per request
            let mut admitted = false;
            while let (Some(&(i, _)), false) = (waiting.front(), free.is_empty()) {
                let ticket = in_flight.ticket(i)?;
                if feed.cancelled(ticket) || in_flight.errors[i].is_some() {
                    while waiting.front().is_some_and(|&(j, _)| j == i) {
                        if let Some((_, s)) = waiting.pop_front() {
                            let aborted = self.aborted_sequence();
                            in_flight.item(i)?.done[s] = Some(aborted);
                        }
                    }
                    in_flight.answer_if_done(i, feed)?;
                    continue;
                }
                let mut group = Vec::new();
                while let (Some(&(j, s)), Some(slot)) = (waiting.front(), free.last().copied()) {
                    if j != i {
                        break;
                    }
                    waiting.pop_front();
                    free.pop();
                    group.push((s, slot));
                }
                let row = match self.prefill_group(in_flight.item(i)?, &group).await {
                    Ok(row) => row,
                    Err(e) if self.fails_all(&e) => return Err(e),
                    Err(e) => {
                        // the request fails; its slots and unstarted sequences go
                        in_flight.errors[i] = Some(e);
                        free.extend(group.iter().map(|g| g.1));
                        let none = self.aborted_sequence();
                        let item = in_flight.item(i)?;
                        for &(s, _) in &group {
                            item.done[s] = Some(none.clone());
                        }
                        waiting.retain(|&(j, s)| {
                            if j == i {
                                item.done[s] = Some(none.clone());
                            }
                            j != i
                        });
                        in_flight.answer_if_done(i, feed)?;
                        continue;
                    }
                };
                let item = in_flight.item(i)?;
                let params = item.sampler.params().clone();
                let first = FirstRow {
                    row: &row,
                    prompt: 0,
                };
                start_lanes(&tokenizer, (i, item), &params, &group, first, &mut lanes)?;
                admitted = true;
            }
            if admitted {
                // the new sequences draw their first token before the next step
                continue;
            }
            if lanes.is_empty() {
                if let Some((ticket, request)) = alone.take() {
                    self.serve_alone(feed, ticket, &request, slots).await?;
                }
                continue;
            }
            feed.step(lanes.len());
            self.batch_step(&mut lanes).await?;
        }
    }

    /// Runs a request that cannot be batched by itself, the batch's slots given back for its
    /// duration. Only a device error is returned; the request's own goes to the feed.
    async fn serve_alone(
        &mut self,
        feed: &mut dyn ItemFeed,
        ticket: u64,
        request: &BatchItem,
        slots: usize,
    ) -> Result<()> {
        self.release_slots().await?;
        // the feed's cancellation reaches a lone request through the session's abort
        let abort = self.abort.clone();
        let mut cancelled = false;
        let mut route = |e: &TokenEvent| {
            feed.event(ticket, e);
            if !cancelled && feed.cancelled(ticket) {
                cancelled = true;
                abort.abort();
            }
        };
        let result = self
            .generate_one(0, &request.prompt, &request.options, &mut route)
            .await;
        self.abort.clear();
        self.reset();
        match result {
            Err(e) if self.fails_all(&e) => {
                feed.finished(ticket, Err(e.clone()));
                Err(e)
            }
            result => {
                feed.finished(ticket, result);
                self.forward.set_batch(slots).await
            }
        }
    }
}
