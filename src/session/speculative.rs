//! Speculative decoding: draft `k` tokens cheaply (a draft model or prompt lookup), run them
//! through the model in one multi-token step, keep the longest verified prefix and one token
//! from the model itself.
//!
//! A step starts with `x`, the last generated token, not yet in the model's KV cache. The
//! model runs `[x, d_0 .. d_{k-1}]` as one step (the prefill path) and reads back what
//! acceptance needs of the k + 1 rows (each row's candidates where they decide it, see
//! [`super::verify`]); row i is the model's distribution after `d_{i-1}` (after `x` for
//! i = 0). Each `d_i`
//! is verified against row i ([`Sampler::verify`]) with the sampler's processors applied to
//! the history as it would be in plain decoding; the first rejection is replaced by a token
//! from the residual distribution, and when every draft stands, row k gives one more token
//! (`extra_token`). The cache then keeps `x` and the accepted drafts: rejected positions are
//! dropped by moving the cache's end back, nothing runs again. The new token becomes the
//! next step's `x`.
//!
//! Greedy output is token for token that of plain decoding; sampled output has the model's
//! distribution (not the same tokens for a seed: the random draws are used differently).
//!
//! Under a response format every distribution is the constrained one: a draft model drafts
//! from its rows restricted by a copy of the sequence's grammar state that moves with the
//! drafts, a lookup draft is cut where the grammar stops allowing it, and each verified row
//! is restricted by the sequence's own state, which moves only with the tokens kept (so a
//! rejection needs no rollback).

use crate::error::Result;
use crate::sampling::speculative::{DraftLength, Verdict};
use crate::sampling::{Sampled, Sampler};

use super::running::Running;
use super::spec_options::{SpecOptions, SpecSource};
use super::{Ctx, FinishReason, Session, Stats, TokenEvent};

/// A call's speculation: where drafts come from and the settings.
#[derive(Clone, Copy, Debug)]
pub(super) struct Speculation<'a> {
    pub source: SpecSource,
    pub options: &'a SpecOptions,
}

impl Session {
    /// Keeps the first `n` cached positions (drops rejected drafts).
    fn keep_cached(&mut self, n: usize) -> Result<()> {
        self.forward.truncate(n)?;
        self.cached.truncate(n);
        Ok(())
    }

    /// Generates the rest of a sequence speculatively after its first token `x` (emitted,
    /// not yet in the cache). Steps that cannot draft (nothing found, no room left in the
    /// context, speculation turned off by its acceptance rate) run as plain decode steps.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn speculate(
        &mut self,
        c: &Ctx<'_>,
        sampler: &mut Sampler,
        stats: &mut Stats,
        warnings: &mut Vec<String>,
        on_token: &mut dyn FnMut(&TokenEvent),
        run: &mut Running<'_>,
        mut x: u32,
        spec: Speculation<'_>,
    ) -> Result<FinishReason> {
        let o = spec.options;
        let mut length = DraftLength::new(o.k, o.adaptive, o.disable_below_accept);
        let max_new = sampler.params().max_new_tokens;
        let vocab = self.vocab();
        let finish = loop {
            if self.abort.is_aborted() {
                break FinishReason::Abort;
            }
            // room for x and the drafts in the cache; a block never drafts past the length
            let room = self.context().saturating_sub(self.cached.len() + 1);
            let remaining = max_new.saturating_sub(run.tokens.len());
            // rejected drafts are forgotten by moving the fill mark back: no further than a
            // local layer's ring allows
            let k = length
                .next()
                .min(room)
                .min(remaining.saturating_sub(1))
                .min(self.forward.rewind_limit());
            let proposal = match k {
                0 => None,
                _ => Some(
                    self.propose(spec.source, c, run, x, k, sampler, stats)
                        .await?,
                ),
            };
            let Some(proposal) = proposal.filter(|p| !p.tokens.is_empty()) else {
                // a plain step
                run.constrain(sampler, c.stops, stats)?;
                let request = sampler.select_request(c.prompt, &run.tokens)?;
                let Some(logits) = self
                    .advance(x, c.n_keep, warnings, request.as_ref())
                    .await?
                else {
                    break FinishReason::Abort;
                };
                self.count_step(stats, 0, 0, &length);
                let s = self
                    .sample_step(
                        sampler,
                        &logits,
                        request.as_ref(),
                        c.prompt,
                        &run.tokens,
                        stats,
                    )
                    .await?;
                if let Some(finish) = run.emit(c, &s, Some(false), on_token)? {
                    break finish;
                }
                x = s.id;
                continue;
            };
            let drafts = proposal.tokens;
            let base = self.cached.len();
            let mut fed = Vec::with_capacity(drafts.len() + 1);
            fed.push(x);
            fed.extend_from_slice(&drafts);
            let rows = self
                .verification_step(&fed, sampler, c.prompt, &run.tokens, run.constrained())
                .await?;
            self.cached.extend_from_slice(&fed);
            let mut accepted = 0;
            let mut replaced = None;
            let mut ended = None;
            for (i, &d) in drafts.iter().enumerate() {
                // under a format, row i is restricted to what may follow the kept tokens: the
                // mask draft i was drawn under when a draft model made it (every draft before
                // it stood), else computed here
                match proposal.masks.get(i) {
                    Some(mask) => sampler.set_mask(Some(mask.clone()))?,
                    None => run.constrain(sampler, c.stops, stats)?,
                }
                let (p, row) = self
                    .row_distribution(&rows, i, sampler, c.prompt, &run.tokens, stats)
                    .await?;
                let q = proposal.q.get(i).map(Vec::as_slice);
                let verdict = sampler.verify(&p, q, d)?;
                let id = match verdict {
                    Verdict::Accept => d,
                    Verdict::Replace(id) => id,
                };
                let s = Sampled {
                    id,
                    logprob: rows.logprob(i, row.as_deref(), id, vocab),
                    top: Vec::new(),
                };
                if verdict != Verdict::Accept {
                    replaced = Some(s);
                    break;
                }
                accepted += 1;
                if let Some(finish) = run.emit(c, &s, Some(true), on_token)? {
                    ended = Some(finish);
                    break;
                }
            }
            length.record(drafts.len(), accepted);
            self.count_step(stats, drafts.len(), accepted, &length);
            // x and the accepted drafts stay in the cache
            let keep = base + 1 + accepted;
            if let Some(finish) = ended {
                self.keep_cached(keep)?;
                break finish;
            }
            let next = match replaced {
                Some(s) => s,
                None if o.extra_token => {
                    run.constrain(sampler, c.stops, stats)?;
                    self.sample_row(&rows, drafts.len(), sampler, c.prompt, &run.tokens, stats)
                        .await?
                }
                None => {
                    // the last draft becomes the next step's x, run again there
                    self.keep_cached(keep - 1)?;
                    x = drafts[drafts.len() - 1];
                    continue;
                }
            };
            self.keep_cached(keep)?;
            if let Some(finish) = run.emit(c, &next, Some(false), on_token)? {
                break finish;
            }
            x = next.id;
        };
        Ok(finish)
    }

    /// Counts one model step in the call's speculation statistics.
    fn count_step(&self, stats: &mut Stats, drafted: usize, accepted: usize, length: &DraftLength) {
        if let Some(s) = stats.speculative.as_mut() {
            s.target_steps += 1;
            s.drafted += drafted;
            s.accepted += accepted;
            s.acceptance_rate = if s.drafted == 0 {
                0.0
            } else {
                s.accepted as f64 / s.drafted as f64
            };
            s.k_final = length.next();
        }
    }
}
