//! What a speculative step's verification reads back: for the k + 1 positions of
//! `[x, d_0 .. d_{k-1}]`, each row's candidate selection (one small readback for the whole
//! step, the logits staying on the device) where the sampler can decide from candidates, and
//! every row's logits otherwise (the CPU backend, a format's masks, parameters the candidates
//! cannot serve, a forced full readback). A row whose candidates do not decide its
//! distribution is read on its own afterwards, as a plain decode step reads its row.

use crate::backend::{Output, Readback};
use crate::candidates::{Candidates, SelectRequest};
use crate::error::{Error, Result};
use crate::sampling::speculative::raw_logprob;
use crate::sampling::{Sampled, Sampler};

use super::{Session, Stats};

/// The rows of one verification step as read back.
pub(super) enum Rows {
    /// Every row's logits, `[rows · row_len]` (a row holds `row_len` logits, of which the
    /// sampler's vocabulary comes first).
    Logits { all: Vec<f32>, row_len: usize },
    /// Each row's candidates and the request they answer.
    Candidates {
        rows: Vec<Candidates>,
        requests: Vec<SelectRequest>,
    },
}

impl Rows {
    /// The raw log-probability of `id` at row `i` (before any processor, as
    /// [`Sampled::logprob`] reports it): from the row when it was read (`row`, or all of them),
    /// else from the candidates' raw max and sum (the last bits may differ, as in plain
    /// decoding from candidates). `NaN` when neither holds `id`.
    pub(super) fn logprob(&self, i: usize, row: Option<&[f32]>, id: u32, vocab: usize) -> f32 {
        if let Some(row) = row {
            return raw_logprob(row, id);
        }
        match self {
            Rows::Logits { all, row_len } => raw_logprob(&all[i * row_len..][..vocab], id),
            Rows::Candidates { rows, requests } => rows
                .get(i)
                .zip(requests.get(i))
                .and_then(|(c, r)| candidate_raw(c, r, id))
                .map_or(f32::NAN, |raw| {
                    let lse =
                        f64::from(rows[i].raw_max) + crate::math::ln(f64::from(rows[i].raw_sum));
                    (f64::from(raw) - lse) as f32
                }),
        }
    }
}

/// The raw logit of `id` in a selection: a candidate's, or an adjusted token's.
fn candidate_raw(c: &Candidates, request: &SelectRequest, id: u32) -> Option<f32> {
    if let Some(i) = c.ids.iter().position(|&x| x == id) {
        return c.raw.get(i).copied();
    }
    let i = request.adjustments.iter().position(|a| a.id == id)?;
    c.adjusted_raw.get(i).copied()
}

impl Session {
    /// Runs the verification step `fed` (`[x, d_0 .. d_{k-1}]`) and reads back what acceptance
    /// needs: each row's candidates when every row's distribution can come from them (row i's
    /// history is `generated` and the drafts before it; not under a format, whose masks move
    /// with the accepted tokens), else every row.
    pub(super) async fn verification_step(
        &mut self,
        fed: &[u32],
        sampler: &Sampler,
        prompt: &[u32],
        generated: &[u32],
        constrained: bool,
    ) -> Result<Rows> {
        let row_len = self.forward.config().vocab_size;
        let mut requests = Vec::new();
        if !constrained && !self.full_row_readback {
            let mut history = generated.to_vec();
            for &d in &fed[1..] {
                match sampler.select_request(prompt, &history)? {
                    Some(r) => requests.push(r),
                    None => break,
                }
                history.push(d);
            }
            match sampler.select_request(prompt, &history)? {
                Some(r) if requests.len() + 1 == fed.len() => requests.push(r),
                _ => requests.clear(),
            }
        }
        let readback = match requests.is_empty() {
            true => Readback::AllRows,
            false => Readback::RowCandidates(&requests),
        };
        match self
            .forward
            .run(crate::backend::Rows::Next(fed), readback)
            .await?
        {
            Output::RowCandidates(rows) if rows.len() == fed.len() => {
                Ok(Rows::Candidates { rows, requests })
            }
            Output::Logits(all) if all.len() >= fed.len() * row_len => {
                Ok(Rows::Logits { all, row_len })
            }
            _ => Err(Error::invalid(
                "speculative",
                "the verification step returned too few rows",
            )),
        }
    }

    /// Row `i`'s distribution after every processor ([`Sampler::distribution`]; `history`:
    /// the tokens generated before that position), from its candidates when they decide it,
    /// else from the row (read now if the step did not); with the row when it was read now.
    pub(super) async fn row_distribution(
        &mut self,
        rows: &Rows,
        i: usize,
        sampler: &Sampler,
        prompt: &[u32],
        history: &[u32],
        stats: &mut Stats,
    ) -> Result<(Vec<f64>, Option<Vec<f32>>)> {
        let vocab = self.vocab();
        match rows {
            Rows::Logits { all, row_len } => {
                stats.full_row_steps += 1;
                let row = &all[i * row_len..][..vocab];
                Ok((sampler.distribution(row, prompt, history)?, None))
            }
            Rows::Candidates { rows, requests } => {
                let (c, r) = (&rows[i], &requests[i]);
                if let Some(p) = sampler.distribution_candidates(c, r, prompt, history)? {
                    stats.candidate_steps += 1;
                    return Ok((p, None));
                }
                stats.select_fallbacks += 1;
                stats.full_row_steps += 1;
                let mut row = self.forward.logits_row(i).await?;
                row.truncate(vocab);
                Ok((sampler.distribution(&row, prompt, history)?, Some(row)))
            }
        }
    }

    /// Samples from row `i` (the extra token after a fully accepted draft), from its
    /// candidates when they decide the token, else from the row.
    pub(super) async fn sample_row(
        &mut self,
        rows: &Rows,
        i: usize,
        sampler: &mut Sampler,
        prompt: &[u32],
        history: &[u32],
        stats: &mut Stats,
    ) -> Result<Sampled> {
        let vocab = self.vocab();
        match rows {
            Rows::Logits { all, row_len } => {
                stats.full_row_steps += 1;
                sampler.sample(&all[i * row_len..][..vocab], prompt, history)
            }
            Rows::Candidates { rows, requests } => {
                if let Some(s) =
                    sampler.sample_candidates(&rows[i], &requests[i], prompt, history)?
                {
                    stats.candidate_steps += 1;
                    return Ok(s);
                }
                stats.select_fallbacks += 1;
                stats.full_row_steps += 1;
                let row = self.forward.logits_row(i).await?;
                sampler.sample(&row[..vocab], prompt, history)
            }
        }
    }
}
