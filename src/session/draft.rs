//! The draft model of speculative decoding: a second, smaller model with the target's
//! vocabulary on the same device, with its own KV cache; and how drafts are proposed (by it,
//! or by prompt lookup).

use crate::backend::{Backend, Output, Readback, Rows};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::loader::ModelFiles;
use crate::sampling::speculative::lookup_draft;
use crate::sampling::{Sampler, TokenMask};
use crate::tokenizer::Tokenizer;

use super::context::common_prefix;
use super::running::{restrict, Running};
use super::spec_options::SpecSource;
use super::{Ctx, Session, Stats};

/// Longest n-gram prompt lookup matches (it tries n from here down to 1).
const LOOKUP_MAX_N: usize = 3;

/// Ids whose vocabulary pieces are compared between two tokenizers: the first and last 32 and
/// 192 spread between.
fn sample_ids(vocab: usize) -> Vec<u32> {
    let mut ids: Vec<usize> = (0..vocab.min(32)).collect();
    ids.extend(vocab.saturating_sub(32)..vocab);
    let step = (vocab / 192).max(1);
    ids.extend((0..vocab).step_by(step));
    ids.sort_unstable();
    ids.dedup();
    ids.into_iter().map(|i| i as u32).collect()
}

/// Checks that a draft model can propose tokens for a target: the same vocabulary size (in
/// the tokenizers and at least as many logits rows in the draft), the same BOS and EOS ids,
/// and the same pieces for a sample of ids. The error names the first difference.
pub fn check_same_vocabulary(
    target: (&Tokenizer, &ModelConfig),
    draft: (&Tokenizer, &ModelConfig),
) -> Result<()> {
    let differ = |what: String| {
        Err(Error::invalid(
            "draft",
            format!("the draft model's vocabulary differs from the model's: {what}"),
        ))
    };
    let (t, d) = (target.0, draft.0);
    if t.vocab_size() != d.vocab_size() {
        return differ(format!(
            "{} tokens in the draft's tokenizer, {} in the model's",
            d.vocab_size(),
            t.vocab_size()
        ));
    }
    let vocab = t.vocab_size().min(target.1.vocab_size);
    if draft.1.vocab_size < vocab {
        return differ(format!(
            "the draft scores {} tokens, the model samples from {vocab}",
            draft.1.vocab_size
        ));
    }
    if t.bos_id() != d.bos_id() {
        return differ(format!(
            "BOS id {:?} in the draft, {:?} in the model",
            d.bos_id(),
            t.bos_id()
        ));
    }
    if t.eos_ids() != d.eos_ids() {
        return differ(format!(
            "end ids {:?} in the draft, {:?} in the model",
            d.eos_ids(),
            t.eos_ids()
        ));
    }
    for id in sample_ids(t.vocab_size()) {
        let (a, b) = (t.id_to_token(id), d.id_to_token(id));
        if a != b {
            return differ(format!(
                "token {id} is {:?} in the draft, {:?} in the model",
                b.unwrap_or_default(),
                a.unwrap_or_default()
            ));
        }
    }
    Ok(())
}

/// A loaded draft model and the tokens its KV cache holds.
pub(super) struct Draft {
    pub forward: Box<dyn Backend>,
    pub cached: Vec<u32>,
    pub name: String,
}

/// Drafted tokens and, for a draft model, the distributions they were drawn from (`[vocab]`
/// each; empty for prompt lookup, whose drafts are deterministic).
pub(super) struct Proposal {
    pub tokens: Vec<u32>,
    pub q: Vec<Vec<f64>>,
    /// Under a response format, the mask each draft model token was drawn under (`[vocab]`
    /// bits): the grammar state before draft i is the one verification meets at row i, so
    /// verification takes these instead of computing them again. Empty otherwise.
    pub masks: Vec<TokenMask>,
}

impl Session {
    /// Loads `files` as the draft model for speculative decoding, on this session's device
    /// with a KV cache as long as the session's (or the draft's own context, if shorter).
    /// Replaces a draft loaded before. Errors when its vocabulary differs from the model's
    /// (naming the first difference; the previous draft stays) or it does not fit the device
    /// (the previous draft was freed first to make room, so none is left).
    pub async fn load_draft(&mut self, files: &ModelFiles) -> Result<()> {
        let weights = files.weights()?;
        let tokenizer = files.tokenizer()?;
        check_same_vocabulary(
            (&self.tokenizer, self.forward.config()),
            (&tokenizer, &weights.config),
        )?;
        // the old draft's memory goes first
        self.draft = None;
        let context = self.context().min(weights.config.context_length);
        let forward = self.forward.load_beside(&weights, context).await?;
        self.draft = Some(Draft {
            forward,
            cached: Vec::new(),
            name: files.name().to_string(),
        });
        Ok(())
    }

    /// Drops the draft model (and frees its GPU memory).
    pub fn unload_draft(&mut self) {
        self.draft = None;
    }

    /// The loaded draft model's name and its forward pass (`None`: no draft).
    pub fn draft(&self) -> Option<(&str, &dyn Backend)> {
        self.draft
            .as_ref()
            .map(|d| (d.name.as_str(), d.forward.as_ref()))
    }

    /// Where drafts come from for a call asking for `source`: the draft model needs one
    /// loaded; no preference means the draft model when loaded, else lookup.
    pub(super) fn spec_source(&self, source: Option<SpecSource>) -> Result<SpecSource> {
        match (source, self.draft.is_some()) {
            (Some(SpecSource::Draft), false) => Err(Error::invalid(
                "draft",
                "speculation from a draft model needs one loaded first (--draft-model, loadDraft)",
            )),
            (Some(s), _) => Ok(s),
            (None, true) => Ok(SpecSource::Draft),
            (None, false) => Ok(SpecSource::Lookup),
        }
    }

    /// Up to `k` drafted tokens to follow `x`, the last generated token (not yet in the
    /// target's cache), with the distributions a draft model drew them from. The draft model
    /// first catches up with the target's cached tokens (reusing its common prefix), then
    /// draws each token with the call's sampler from its processed distribution.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn propose(
        &mut self,
        source: SpecSource,
        c: &Ctx<'_>,
        run: &mut Running<'_>,
        x: u32,
        k: usize,
        sampler: &mut Sampler,
        stats: &mut Stats,
    ) -> Result<Proposal> {
        if source == SpecSource::Lookup {
            let mut history = c.prompt.to_vec();
            history.extend_from_slice(&run.tokens);
            let mut tokens = lookup_draft(&history, k, LOOKUP_MAX_N);
            let allowed = run.allowed_prefix(&tokens, c.stops)?;
            tokens.truncate(allowed);
            return Ok(Proposal {
                tokens,
                q: Vec::new(),
                masks: Vec::new(),
            });
        }
        let generated = &run.tokens;
        // under a format: where the sequence stands (x taken), a copy moved along the drafts
        let mut grammar = run.grammar_ahead();
        let vocab = self.vocab();
        let Some(draft) = self.draft.as_mut() else {
            return Err(Error::invalid("draft", "no draft model is loaded"));
        };
        let mut history = self.cached.clone();
        history.push(x);
        // the draft's cache must hold the history and all but the last drafted token
        let room = draft.forward.context().saturating_sub(history.len() - 1);
        let k = k.min(room);
        let mut out = Proposal {
            tokens: Vec::new(),
            q: Vec::new(),
            masks: Vec::new(),
        };
        if k == 0 {
            return Ok(out);
        }
        let common = common_prefix(&draft.cached, &history).min(history.len() - 1);
        let common = draft.forward.reusable(common);
        draft.forward.truncate(common)?;
        draft.cached.truncate(common);
        let mut run = history[common..].to_vec();
        let mut gen = generated.to_vec();
        let full_rows = self.full_row_readback;
        for i in 0..k {
            // under a format, the draw is restricted to what may follow the drafts so far
            if let Some(g) = grammar.as_mut() {
                out.masks.push(restrict(g, sampler, c.stops, stats)?);
            }
            // the draft's distribution from its candidates when they decide it (the same
            // values as from the row), else from its row
            let request = match full_rows {
                true => None,
                false => sampler.select_request(c.prompt, &gen)?,
            };
            let readback = match &request {
                Some(r) => Readback::Candidates(r),
                None => Readback::LastRow,
            };
            let out_step = draft.forward.run(Rows::Next(&run), readback).await?;
            draft.cached.extend_from_slice(&run);
            let from_candidates = match (&out_step, &request) {
                (Output::Candidates(cand), Some(r)) => {
                    sampler.distribution_candidates(cand, r, c.prompt, &gen)?
                }
                _ => None,
            };
            let q = match (from_candidates, out_step) {
                (Some(q), _) => q,
                (None, Output::Logits(row)) => draft_distribution(sampler, &row, vocab, c, &gen)?,
                (None, _) => {
                    let row = draft.forward.last_logits().await?;
                    draft_distribution(sampler, &row, vocab, c, &gen)?
                }
            };
            let d = sampler.draw_from(&q, &q);
            out.tokens.push(d);
            out.q.push(q);
            gen.push(d);
            if let Some(g) = grammar.as_mut() {
                // an end id, or a text that can only end, ends the drafting
                if c.stops.contains(&d) {
                    break;
                }
                g.accept(d)?;
                if g.must_end() {
                    break;
                }
            }
            if i + 1 < k {
                run = vec![d];
            }
        }
        Ok(out)
    }
}

/// The sampler's distribution over the first `vocab` logits of a draft's row.
fn draft_distribution(
    sampler: &Sampler,
    row: &[f32],
    vocab: usize,
    c: &Ctx<'_>,
    generated: &[u32],
) -> Result<Vec<f64>> {
    let Some(row) = row.get(..vocab) else {
        return Err(Error::invalid(
            "draft",
            "the draft's logits row is too short",
        ));
    };
    sampler.distribution(row, c.prompt, generated)
}
