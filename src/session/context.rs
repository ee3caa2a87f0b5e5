//! The context window: how many tokens sliding keeps, cutting a prompt that does not fit,
//! reusing the cached common prefix, and sliding when generation reaches the end.

use crate::backend::{Output, Readback, Rows, StepLogits};
use crate::error::{Error, Result};

use super::{GenerateOptions, Session};

/// Length of the common prefix of `a` and `b`.
pub(super) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Session {
    /// Tokens at the start of `tokens` that sliding never drops: `options.n_keep`, or the BOS
    /// token when the prompt starts with one. More than half the context is an error.
    pub(super) fn n_keep(&self, tokens: &[u32], options: &GenerateOptions) -> Result<usize> {
        let context = self.context();
        let n_keep = options.n_keep.unwrap_or_else(|| {
            usize::from(
                self.tokenizer.bos_id().is_some()
                    && tokens.first() == self.tokenizer.bos_id().as_ref(),
            )
        });
        if n_keep > context / 2 {
            return Err(Error::invalid(
                "n_keep",
                format!(
                    "{n_keep} kept tokens leave no room to slide a context of {context}; the limit is {}",
                    context / 2
                ),
            ));
        }
        Ok(n_keep.min(tokens.len()))
    }

    /// Cuts a prompt that leaves no room to generate: keeps `n_keep` tokens and the newest rest,
    /// leaving a quarter of the context (at most `max_new_tokens`) free. Strict mode rejects it.
    pub(super) fn fit_prompt(
        &self,
        tokens: &mut Vec<u32>,
        n_keep: usize,
        options: &GenerateOptions,
        warnings: &mut Vec<String>,
    ) -> Result<()> {
        let context = self.context();
        if tokens.len() < context {
            return Ok(());
        }
        if options.strict {
            return Err(Error::invalid(
                "prompt",
                format!(
                    "{} tokens do not fit the context of {context} (strict mode)",
                    tokens.len()
                ),
            ));
        }
        let room = (context / 4).min(options.sampling.max_new_tokens).max(1);
        let tail = context - room - n_keep;
        let cut = tokens.len() - n_keep - tail;
        tokens.drain(n_keep..n_keep + cut);
        warnings.push(format!(
            "the prompt was cut from the left: {cut} tokens after the first {n_keep} were dropped to fit the context of {context}"
        ));
        Ok(())
    }

    /// Runs `tokens` so that the cache holds all of them, reusing the cached common prefix,
    /// and returns the logits after the last one (`[vocab]`); `None` when aborted.
    pub(super) async fn prefill(&mut self, tokens: &[u32]) -> Result<Option<Vec<f32>>> {
        let common = common_prefix(&self.cached, tokens).min(tokens.len().saturating_sub(1));
        // a local layer's ring may have overwritten what the prefix's continuation reads
        let common = self.forward.reusable(common);
        self.forward.truncate(common)?;
        self.cached.truncate(common);
        let mut last = None;
        let done = self
            .run_chunks(&tokens[common..], false, &mut |_, row| {
                last = Some(row);
                Ok(())
            })
            .await?;
        Ok(last.filter(|_| done))
    }

    /// Runs `tokens` after the cached ones, one forward step at a time so that an abort is
    /// honoured between steps and no more than one step's logits are held. `on_rows(first,
    /// rows)` receives each step's logits: of every token from index `first` of `tokens` on
    /// (`[step tokens, vocab]`) when `all_logits`, else of the step's last token (`[vocab]`).
    /// Returns `false` when aborted (the cache then holds the steps already run).
    pub(super) async fn run_chunks(
        &mut self,
        tokens: &[u32],
        all_logits: bool,
        on_rows: &mut dyn FnMut(usize, Vec<f32>) -> Result<()>,
    ) -> Result<bool> {
        if self.abort.is_aborted() {
            return Ok(false);
        }
        let abort = &self.abort;
        let cached = &mut self.cached;
        let mut on_step = |first: usize, n: usize, rows: Vec<f32>| -> Result<bool> {
            cached.extend_from_slice(&tokens[first..first + n]);
            if all_logits || !rows.is_empty() {
                on_rows(first, rows)?;
            }
            Ok(!abort.is_aborted())
        };
        let readback = Readback::EachStep {
            all_rows: all_logits,
            on_step: &mut on_step,
        };
        match self.forward.run(Rows::Next(tokens), readback).await? {
            Output::Stepped { ran } => Ok(ran == tokens.len()),
            _ => Ok(true),
        }
    }

    /// Makes room for `token` in a full context: keeps the first `n_keep` cached tokens, drops
    /// the oldest half of the rest and runs the kept tail again (positions are recomputed, never
    /// shifted). Returns the whole logits row after `token`; `None` when aborted.
    pub(super) async fn slide(
        &mut self,
        token: u32,
        n_keep: usize,
        warnings: &mut Vec<String>,
    ) -> Result<Option<StepLogits>> {
        let mut seq = self.cached.clone();
        seq.push(token);
        let rest = seq.len() - n_keep;
        let drop = (rest / 2).max(1);
        seq.drain(n_keep..n_keep + drop);
        if !warnings.iter().any(|w| w.starts_with("the context slid")) {
            warnings.push(format!(
                "the context slid: the oldest tokens after the first {n_keep} were dropped to keep generating past {} positions",
                self.context()
            ));
        }
        // Everything after `n_keep` moved to a new position: run it again.
        let keep = self.forward.reusable(n_keep.min(self.cached.len()));
        self.forward.truncate(keep)?;
        self.cached.truncate(keep);
        Ok(self.prefill(&seq).await?.map(StepLogits::Full))
    }
}

#[cfg(test)]
mod tests {
    use super::common_prefix;

    #[test]
    fn common_prefix_stops_at_the_first_difference() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4]), 2);
        assert_eq!(common_prefix(&[1, 2], &[1, 2, 3]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
        assert_eq!(common_prefix(&[5], &[6]), 0);
    }
}
