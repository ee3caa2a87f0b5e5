//! The decode loop: a call's prompt prepared and dispatched, then each sampled sequence fed
//! token by token (candidates read back when they suffice, the whole row otherwise), with
//! streaming, stop ids and strings, and abort.

use std::sync::Arc;

use web_time::Instant;

use crate::backend::{Output, Readback, Rows, StepLogits};
use crate::error::{Error, Result};
use crate::sampling::{Sampled, Sampler, SelectRequest};

use super::context::common_prefix;
use super::running::Running;
use super::spec_options::SpecStats;
use super::speculative::Speculation;
use super::{
    elapsed_ms, Ctx, FinishReason, GenerateOptions, Generation, Prompt, Sequence, Session, Stats,
    TokenEvent,
};

impl Session {
    /// Generates from one prompt; `on_token` sees every token as it is produced.
    pub async fn generate(
        &mut self,
        prompt: &Prompt,
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(&TokenEvent),
    ) -> Result<Generation> {
        let p = &options.sampling;
        if p.num_return_sequences > 1
            && p.num_beams == 1
            && options.speculative.is_none()
            && !options.no_kv_cache
        {
            // the samples share the prompt's prefill and decode together
            let item = super::BatchItem {
                prompt: prompt.clone(),
                options: options.clone(),
            };
            let mut out = self.generate_items(&[item], None, on_token).await?;
            return out
                .pop()
                .ok_or_else(|| Error::invalid("prompt", "the batch returned no result"));
        }
        self.abort.clear();
        let result = self.generate_one(0, prompt, options, on_token).await;
        if result.is_err() {
            // The KV state is unknown after a failure: start the next call from scratch, with
            // any batch slots given back.
            self.reset();
            let _ = self.release_slots().await;
        }
        result
    }

    /// Generates from every prompt with the same options, their sequences decoded together
    /// (see [`Session::generate_items`]); results in input order, events carry the prompt's
    /// index.
    pub async fn generate_batch(
        &mut self,
        prompts: &[Prompt],
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(&TokenEvent),
    ) -> Result<Vec<Generation>> {
        let items: Vec<super::BatchItem> = prompts
            .iter()
            .map(|p| super::BatchItem {
                prompt: p.clone(),
                options: options.clone(),
            })
            .collect();
        self.generate_items(&items, None, on_token).await
    }

    pub(super) async fn generate_one(
        &mut self,
        index: usize,
        prompt: &Prompt,
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(&TokenEvent),
    ) -> Result<Generation> {
        let start = Instant::now();
        // the one check of the call's options
        let params = &options.check(self.vocab())?;
        self.recompute = options.no_kv_cache;
        if self.recompute {
            // nothing is reused either: the prompt runs from position 0
            self.forward.truncate(0)?;
            self.cached.clear();
        }
        let mut warnings = Vec::new();
        let (tokens, n_keep, stops) = self.prepare_prompt(prompt, options, &mut warnings)?;
        let constraint = self.constraint(options)?;
        let mut stats = Stats {
            prompt_tokens: tokens.len(),
            ..Stats::default()
        };
        let speculative = match &options.speculative {
            None => None,
            Some(o) => {
                let source = self.spec_source(o.source)?;
                stats.speculative = Some(SpecStats {
                    method: source.as_str().to_string(),
                    k_final: o.k,
                    ..SpecStats::default()
                });
                Some(Speculation { source, options: o })
            }
        };
        let ctx = Ctx {
            index,
            prompt: &tokens,
            n_keep,
            stops: &stops,
            start,
            speculative,
            constraint: constraint.as_ref(),
        };
        let echo = self.echo(index, prompt, &tokens, options, on_token)?;
        let (mut sequences, seed) = if params.max_new_tokens == 0 {
            let empty = Sequence {
                tokens: Vec::new(),
                text: String::new(),
                finish_reason: FinishReason::Length,
                logprob: 0.0,
            };
            (vec![empty; params.num_return_sequences], None)
        } else if params.num_beams > 1 {
            let seqs = self
                .beam_search(&ctx, params, &mut stats, &mut warnings, on_token)
                .await?;
            (seqs, None)
        } else {
            let mut sampler = Sampler::checked(params)?;
            sampler.set_top_logprobs(options.top_logprobs)?;
            let mut seqs = Vec::with_capacity(params.num_return_sequences);
            for s in 0..params.num_return_sequences {
                let mut sampler = sampler.for_sequence(s);
                let seq = self
                    .sample_sequence(&ctx, s, &mut sampler, &mut stats, &mut warnings, on_token)
                    .await?;
                let aborted = seq.finish_reason == FinishReason::Abort;
                seqs.push(seq);
                if aborted {
                    break;
                }
            }
            let seed = (!params.is_greedy()).then(|| sampler.seed());
            (seqs, seed)
        };
        stats.generated_tokens = sequences.iter().map(|s| s.tokens.len()).sum();
        if let Some(text) = &echo {
            for s in &mut sequences {
                s.text.insert_str(0, text);
            }
        }
        if stats.decode_ms > 0.0 {
            let steps = stats.generated_tokens.saturating_sub(sequences.len());
            stats.decode_tok_per_s = steps as f64 / (stats.decode_ms / 1000.0);
        }
        Ok(Generation {
            prompt_tokens: tokens,
            sequences,
            stats,
            seed,
            warnings,
        })
    }

    /// With `echo`, the prompt's text (a text prompt as given, others as the model saw them),
    /// streamed first as one event per sequence; it also starts every sequence's text.
    pub(super) fn echo(
        &self,
        index: usize,
        prompt: &Prompt,
        tokens: &[u32],
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(&TokenEvent),
    ) -> Result<Option<String>> {
        let echo = match (options.echo, prompt) {
            (false, _) => None,
            (true, Prompt::Text(text)) => Some(text.clone()),
            (true, _) => Some(self.tokenizer.decode(tokens, false)?),
        };
        if let Some(text) = &echo {
            for sequence in 0..options.sampling.num_return_sequences {
                on_token(&TokenEvent {
                    prompt: index,
                    sequence,
                    id: None,
                    logprob: None,
                    text: text.clone(),
                    beam: None,
                    drafted: None,
                    top_logprobs: None,
                });
            }
        }
        Ok(echo)
    }

    /// A call's prompt as ids fitted to the context (cut with a warning unless strict), the
    /// tokens sliding keeps, and the ids that end its sequences.
    pub(super) fn prepare_prompt(
        &self,
        prompt: &Prompt,
        options: &GenerateOptions,
        warnings: &mut Vec<String>,
    ) -> Result<(Vec<u32>, usize, Vec<u32>)> {
        let params = &options.sampling;
        let mut tokens =
            self.tokenize_prompt_with(prompt, options.special, options.tools.as_ref())?;
        if tokens.is_empty() {
            return Err(Error::invalid(
                "prompt",
                "the prompt has no tokens (give some text, or enable BOS)",
            ));
        }
        let n_keep = self.n_keep(&tokens, options)?;
        self.fit_prompt(&mut tokens, n_keep, options, warnings)?;
        // the caller's end tokens replace the model's; ignore_eos drops both (and end of turn)
        let mut stops = match (params.ignore_eos, params.eos_token_id.is_empty()) {
            (true, _) => Vec::new(),
            (false, true) => self.eos.clone(),
            (false, false) => params.eos_token_id.clone(),
        };
        stops.extend(&params.stop_token_ids);
        if matches!(prompt, Prompt::Chat(_)) && !params.ignore_eos {
            stops.extend(&self.end_of_turn);
        }
        Ok((tokens, n_keep, stops))
    }

    /// Feeds one generated token, sliding the context first when it is full. Returns what the
    /// step read back after it: the candidates `request` asks for, or the whole row (without a
    /// request, when forced, or after a slide); `None` when aborted during a slide.
    pub(super) async fn advance(
        &mut self,
        token: u32,
        n_keep: usize,
        warnings: &mut Vec<String>,
        request: Option<&SelectRequest>,
    ) -> Result<Option<StepLogits>> {
        if self.recompute && self.cached.len() < self.context() {
            // no KV cache: the whole sequence again, from position 0
            let mut all = self.cached.clone();
            all.push(token);
            self.forward.truncate(0)?;
            self.cached.clear();
            let row = match self
                .forward
                .run(Rows::Next(&all), Readback::LastRow)
                .await?
            {
                Output::Logits(row) => row,
                _ => return Err(Error::invalid("use_cache", "the step returned no logits")),
            };
            self.cached = all;
            return Ok(Some(StepLogits::Full(row)));
        }
        if self.cached.len() < self.context() {
            let request = request.filter(|_| !self.full_row_readback);
            let logits = self.forward.decode_select(token, request).await?;
            self.cached.push(token);
            return Ok(Some(logits));
        }
        self.slide(token, n_keep, warnings).await
    }

    /// Samples from what a step read back: from the candidates when they suffice, else from
    /// the whole row (read now if the step did not).
    pub(super) async fn sample_step(
        &mut self,
        sampler: &mut Sampler,
        logits: &StepLogits,
        request: Option<&SelectRequest>,
        prompt: &[u32],
        generated: &[u32],
        stats: &mut Stats,
    ) -> Result<Sampled> {
        let vocab = self.vocab();
        if let (StepLogits::Candidates(c), Some(request)) = (logits, request) {
            if let Some(s) = sampler.sample_candidates(c, request, prompt, generated)? {
                stats.candidate_steps += 1;
                return Ok(s);
            }
            stats.select_fallbacks += 1;
        }
        stats.full_row_steps += 1;
        match logits {
            StepLogits::Full(row) => sampler.sample(&row[..vocab], prompt, generated),
            StepLogits::Candidates(_) => {
                let row = self.forward.last_logits().await?;
                sampler.sample(&row[..vocab], prompt, generated)
            }
        }
    }

    /// Samples one sequence after the prompt.
    async fn sample_sequence(
        &mut self,
        c: &Ctx<'_>,
        sequence: usize,
        sampler: &mut Sampler,
        stats: &mut Stats,
        warnings: &mut Vec<String>,
        on_token: &mut dyn FnMut(&TokenEvent),
    ) -> Result<Sequence> {
        let params = sampler.params().clone();
        let prefill_start = Instant::now();
        let cached_before = common_prefix(&self.cached, c.prompt);
        let logits = self.prefill(c.prompt).await?;
        if sequence == 0 {
            stats.cached_tokens = cached_before.min(c.prompt.len().saturating_sub(1));
            stats.prefill_ms = elapsed_ms(prefill_start);
        }
        let Some(logits) = logits else {
            return Ok(self.aborted_sequence());
        };
        let mut logits = StepLogits::Full(logits);
        let mut request = None;
        let tokenizer = Arc::clone(&self.tokenizer);
        let mut run = Running::new(&tokenizer, &params, sequence, c.constraint);
        // speculation starts after the first token (drawn from the prompt's last row)
        let mut speculation = c.speculative;
        let mut decode_start = None;
        run.constrain(sampler, c.stops, stats)?;
        let finish = loop {
            if self.abort.is_aborted() {
                break FinishReason::Abort;
            }
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
            if decode_start.is_none() {
                decode_start = Some(Instant::now());
                if sequence == 0 {
                    stats.time_to_first_token_ms = elapsed_ms(c.start);
                }
            }
            if let Some(finish) = run.emit(c, &s, None, on_token)? {
                break finish;
            }
            if let Some(spec) = speculation.take() {
                break self
                    .speculate(c, sampler, stats, warnings, on_token, &mut run, s.id, spec)
                    .await?;
            }
            // the next draw's mask first: the request carries it to the GPU
            run.constrain(sampler, c.stops, stats)?;
            request = sampler.select_request(c.prompt, &run.tokens)?;
            match self
                .advance(s.id, c.n_keep, warnings, request.as_ref())
                .await?
            {
                Some(next) => logits = next,
                None => break FinishReason::Abort,
            }
        };
        if let Some(t) = decode_start {
            stats.decode_ms += elapsed_ms(t);
        }
        warnings.extend(run.incomplete(finish));
        run.finish(c, finish, on_token)
    }

    /// The result of a sequence aborted before its first token.
    pub(super) fn aborted_sequence(&self) -> Sequence {
        Sequence {
            tokens: Vec::new(),
            text: String::new(),
            finish_reason: FinishReason::Abort,
            logprob: 0.0,
        }
    }
}
