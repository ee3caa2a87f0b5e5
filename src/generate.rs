//! Generation: a [`Session`] turns prompts into text with the GPU forward pass and the CPU
//! [`Sampler`].
//!
//! - **KV reuse.** The session remembers which tokens its KV cache holds. A new call keeps the
//!   longest common prefix of those and the new prompt and only runs the rest, so a multi-turn
//!   chat pays for each new turn, not for the whole conversation.
//! - **Context overflow.** When the next token would not fit, the session keeps the first
//!   `n_keep` tokens, drops the oldest half of the rest and runs the kept tail again (positions
//!   and RoPE are recomputed, never shifted), then generation goes on. A prompt longer than the
//!   context is cut from the left with a warning, or rejected in strict mode.
//! - **Several sequences.** `num_return_sequences` samples share the prompt's KV rows (a new
//!   sequence only reruns the last prompt token); beam search gives each beam its own copy of
//!   its generated KV rows; a batch of prompts runs prompt by prompt, each to its own stop.
//! - **Stopping.** End-of-sequence ids (the model's, the caller's and, in chat form, the
//!   template's end-of-turn token), stop strings matched across token boundaries,
//!   `max_new_tokens`, and [`AbortHandle::abort`], honoured between tokens and prefill chunks.
//! - **Small readbacks.** A sampled decode step reads back only the GPU's selection of
//!   candidates (at most 4 KB, see [`Sampler::select_request`]) instead of the whole logits
//!   row; when the candidates cannot prove the token the full path would draw, the step reads
//!   the row as well and samples from it. Tokens and seeded sequences are the same either way;
//!   [`Session::set_full_row_readback`] forces the row on every step.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use web_time::Instant;

use crate::chat::{ChatMessage, ChatTemplate};
use crate::config::ModelConfig;
use crate::config::{auto_context, ContextChoice};
use crate::error::{Error, Result};
use crate::forward::{Forward, StepLogits, DEFAULT_CHUNK};
use crate::gpu::{GpuContext, KernelCache, KvCache};
use crate::loader::ModelFiles;
use crate::sampling::{log_softmax, Sampled, Sampler, SamplingParams, SelectRequest, StopMatcher};
use crate::tokenizer::Tokenizer;

/// What to generate from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// Plain text, tokenized with the model's tokenizer (BOS as the model asks).
    Text(String),
    /// A conversation, rendered with the model's chat template (generation prompt added).
    Chat(Vec<ChatMessage>),
    /// Token ids, used as they are.
    Tokens(Vec<u32>),
}

impl From<&str> for Prompt {
    fn from(text: &str) -> Self {
        Prompt::Text(text.to_string())
    }
}

/// Everything a generation call accepts besides the prompt.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerateOptions {
    /// Sampling, stopping, beam and sequence-count parameters.
    pub sampling: SamplingParams,
    /// Recognise special tokens (`<|im_start|>` ...) written in a text prompt.
    pub special: bool,
    /// Reject a prompt longer than the context instead of cutting it from the left.
    pub strict: bool,
    /// Tokens at the start that context sliding never drops (default: the BOS token if the
    /// prompt starts with one, else none).
    pub n_keep: Option<usize>,
}

/// Removes option `name` (or its camelCase `alias`) from `map`; both given is an error.
fn take_option(
    map: &mut serde_json::Map<String, serde_json::Value>,
    name: &'static str,
    alias: &str,
) -> Result<Option<serde_json::Value>> {
    match (map.remove(name), map.remove(alias)) {
        (Some(_), Some(_)) => Err(Error::invalid(
            name,
            format!("given twice, as `{name}` and as `{alias}`"),
        )),
        (Some(v), None) | (None, Some(v)) => Ok(Some(v)),
        (None, None) => Ok(None),
    }
}

fn bool_option(name: &'static str, value: &serde_json::Value) -> Result<bool> {
    value
        .as_bool()
        .ok_or_else(|| Error::invalid(name, format!("`{name}` must be true or false, got {value}")))
}

impl GenerateOptions {
    /// Parses one JSON object holding the sampling parameters (snake_case or camelCase, see
    /// [`SamplingParams::from_json`]) and `special`, `strict` and `n_keep` (`nKeep`). `null`
    /// means all defaults. Errors name the option.
    pub fn from_json(json: &str) -> Result<Self> {
        let value: serde_json::Value = serde_json::from_str(json)
            .map_err(|e| Error::invalid("options", format!("not valid JSON: {e}")))?;
        let mut map = match value {
            serde_json::Value::Null => serde_json::Map::new(),
            serde_json::Value::Object(map) => map,
            _ => {
                return Err(Error::invalid(
                    "options",
                    "expected an object of generation options",
                ))
            }
        };
        let mut options = GenerateOptions::default();
        if let Some(v) = take_option(&mut map, "special", "special")? {
            options.special = bool_option("special", &v)?;
        }
        if let Some(v) = take_option(&mut map, "strict", "strict")? {
            options.strict = bool_option("strict", &v)?;
        }
        if let Some(v) = take_option(&mut map, "n_keep", "nKeep")? {
            if !v.is_null() {
                let n = v.as_u64().and_then(|n| usize::try_from(n).ok());
                options.n_keep = Some(n.ok_or_else(|| {
                    Error::invalid(
                        "n_keep",
                        format!("`n_keep` (`nKeep`) must be a whole number >= 0, got {v}"),
                    )
                })?);
            }
        }
        options.sampling = SamplingParams::from_json(&serde_json::Value::Object(map).to_string())?;
        Ok(options)
    }
}

impl Prompt {
    /// Parses a prompt from JSON: a string, an array of `{ role, content }` messages, or an
    /// array of token ids.
    pub fn from_json(json: &str) -> Result<Self> {
        serde_json::from_str(json).map_err(|_| {
            Error::invalid(
                "prompt",
                "expected a string, an array of { role, content } messages or an array of token ids",
            )
        })
    }
}

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_new_tokens` reached.
    Length,
    /// [`AbortHandle::abort`] was called.
    Abort,
}

impl FinishReason {
    /// `stop`, `length` or `abort`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// One streamed piece of output.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TokenEvent {
    /// Index of the prompt in a batch (0 for a single prompt).
    pub prompt: usize,
    /// Index of the sequence among `num_return_sequences`.
    pub sequence: usize,
    /// The token, or `None` for the final event that releases text held back at the end
    /// (an incomplete character or a partial stop-string match that never completed).
    pub id: Option<u32>,
    /// The token's log-probability under the model's own distribution (`None` with `id`).
    pub logprob: Option<f32>,
    /// Text this event adds (UTF-8 safe; may be empty while text is held back).
    pub text: String,
}

/// One generated sequence.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Sequence {
    /// Generated token ids (an end-of-sequence token that ended generation is not included).
    pub tokens: Vec<u32>,
    /// Generated text, without a matched stop string or anything after it.
    pub text: String,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Sum of the tokens' log-probabilities under the model's own distribution.
    pub logprob: f64,
}

/// Timings and counts of one call.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Stats {
    /// Tokens in the prompt (after any cut).
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV state was reused from the previous call.
    pub cached_tokens: usize,
    /// Tokens generated over all sequences.
    pub generated_tokens: usize,
    /// Time spent running the prompt.
    pub prefill_ms: f64,
    /// Time spent generating after the first token.
    pub decode_ms: f64,
    /// From the call to the first generated token.
    pub time_to_first_token_ms: f64,
    /// Decode steps per second (0 when there were none).
    pub decode_tok_per_s: f64,
    /// Sampled tokens drawn from the GPU's candidates alone.
    pub candidate_steps: usize,
    /// Sampled tokens drawn from a whole logits row read back (the first token after the
    /// prompt, a forced full readback, parameters the candidates cannot serve, fallbacks).
    pub full_row_steps: usize,
    /// Of those, decode steps that read the candidates first and then, as they did not
    /// suffice, the row too.
    pub select_fallbacks: usize,
}

/// The result of one call.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Generation {
    /// The prompt as token ids (after the chat template and any cut).
    pub prompt_tokens: Vec<u32>,
    /// The sequences, best first for beam search, in sampling order otherwise.
    pub sequences: Vec<Sequence>,
    /// Timings and counts.
    pub stats: Stats,
    /// The sampling seed used (repeat the run with it), `None` when greedy or beam search.
    pub seed: Option<u64>,
    /// Things the caller should know (a prompt cut to fit the context, a context slide).
    pub warnings: Vec<String>,
}

/// Mean negative log-likelihood of a text.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Score {
    /// Tokens predicted (every token but the first of each context window).
    pub tokens: usize,
    /// Mean negative log-likelihood per predicted token (nats).
    pub nll: f64,
    /// `exp(nll)`.
    pub ppl: f64,
}

/// Stops a running generation between two tokens. Cloneable, usable from another thread
/// (natively) or from a JavaScript event while the engine awaits the GPU (in the browser).
#[derive(Clone, Debug, Default)]
pub struct AbortHandle(Arc<AtomicBool>);

impl AbortHandle {
    /// Asks the running call to stop; it finishes with [`FinishReason::Abort`].
    pub fn abort(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether an abort is pending.
    pub fn is_aborted(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    fn clear(&self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// Strings that chat templates use to end a turn; those the template emits become stop ids.
const END_OF_TURN: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "</s>",
];

/// A model loaded on the GPU with its tokenizer and chat template, and the state of one
/// conversation (the tokens its KV cache holds).
pub struct Session {
    ctx: GpuContext,
    forward: Forward,
    tokenizer: Arc<Tokenizer>,
    template: ChatTemplate,
    has_template: bool,
    /// The model's and the tokenizer's end-of-sequence ids.
    eos: Vec<u32>,
    /// End-of-turn ids the chat template emits.
    end_of_turn: Vec<u32>,
    /// Tokens whose KV rows the cache holds, at positions `0..cached.len()`.
    cached: Vec<u32>,
    abort: AbortHandle,
    context_choice: ContextChoice,
    /// Read back the whole logits row on every decode step (no candidate selection).
    full_row_readback: bool,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("model", &self.forward.config().arch)
            .field("context", &self.context())
            .field("cached", &self.cached.len())
            .finish()
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

fn elapsed_ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

/// Live state of one sampled sequence.
struct Running<'t> {
    tokens: Vec<u32>,
    text: String,
    logprob: f64,
    decoder: crate::tokenizer::StreamDecoder<'t>,
    stops: StopMatcher,
}

impl Session {
    /// Loads `files` onto the GPU of `ctx` with a KV cache of `context` positions (default: the
    /// model's context, at most 4096).
    pub async fn new(ctx: GpuContext, files: &ModelFiles, context: Option<usize>) -> Result<Self> {
        Self::new_with_progress(ctx, files, context, &mut |_, _| {}).await
    }

    /// [`Session::new`], calling `progress(uploaded, total)` in weight bytes as the weights go
    /// to the GPU.
    pub async fn new_with_progress(
        ctx: GpuContext,
        files: &ModelFiles,
        context: Option<usize>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self> {
        let weights = files.weights()?;
        let tokenizer = files.tokenizer()?;
        let template = files.chat_template(&tokenizer)?;
        let has_template = template.is_some();
        let template = template.unwrap_or_else(ChatTemplate::fallback);
        let choice = match context {
            Some(n) => ContextChoice {
                context: n,
                reason: "asked for".into(),
            },
            None => {
                let limits = ctx.limits();
                auto_context(
                    &weights.config,
                    limits.max_storage_buffer_binding_size,
                    limits.max_buffer_size,
                )
            }
        };
        let context = choice.context;
        let kernels = KernelCache::new();
        let forward =
            Forward::new_with_progress(&ctx, &kernels, &weights, context, DEFAULT_CHUNK, progress)
                .await?;
        let mut eos: Vec<u32> = weights.config.eos_ids.clone();
        for &id in tokenizer.eos_ids() {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
        let end_of_turn = Self::end_of_turn_ids(&template, &tokenizer);
        Ok(Self {
            ctx,
            forward,
            tokenizer: Arc::new(tokenizer),
            template,
            has_template,
            eos,
            end_of_turn,
            cached: Vec::new(),
            abort: AbortHandle::default(),
            context_choice: choice,
            full_row_readback: false,
        })
    }

    /// End-of-turn tokens that the template writes after a message.
    fn end_of_turn_ids(template: &ChatTemplate, tokenizer: &Tokenizer) -> Vec<u32> {
        let probe = [
            ChatMessage::new("user", "a"),
            ChatMessage::new("assistant", "b"),
        ];
        let Ok(text) = template.render(&probe, false) else {
            return Vec::new();
        };
        END_OF_TURN
            .iter()
            .filter(|s| text.contains(*s))
            .filter_map(|s| tokenizer.token_to_id(s))
            .collect()
    }

    /// The GPU context.
    pub fn gpu(&self) -> &GpuContext {
        &self.ctx
    }

    /// The model on the GPU (graph, KV cache, memory).
    pub fn forward(&self) -> &Forward {
        &self.forward
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        self.forward.config()
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// KV cache length in positions.
    pub fn context(&self) -> usize {
        self.forward.kv().context()
    }

    /// The context length and why it was chosen (given by the caller, or picked from the
    /// model and the device's limits).
    pub fn context_choice(&self) -> &ContextChoice {
        &self.context_choice
    }

    /// Whether the model brought its own chat template (otherwise a plain fallback is used).
    pub fn has_chat_template(&self) -> bool {
        self.has_template
    }

    /// End-of-sequence ids that stop generation (model + tokenizer).
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos
    }

    /// Tokens the KV cache currently holds.
    pub fn cached_tokens(&self) -> &[u32] {
        &self.cached
    }

    /// Reads back the whole logits row on every sampled decode step instead of the GPU's
    /// candidates when `on` (off by default). The tokens are the same either way; this exists
    /// to compare the two paths and to measure them.
    pub fn set_full_row_readback(&mut self, on: bool) {
        self.full_row_readback = on;
    }

    /// A handle that stops the running call between two tokens.
    pub fn abort_handle(&self) -> AbortHandle {
        self.abort.clone()
    }

    /// Profiles the model's kernels (see [`Forward::profile`]): a decode step at `decode_pos`
    /// and a prefill chunk of `prompt_tokens`. The conversation is forgotten (the profile
    /// overwrites the KV cache).
    pub async fn profile(
        &mut self,
        decode_pos: u32,
        prompt_tokens: u32,
    ) -> Result<crate::forward::Profile> {
        self.cached.clear();
        let result = self
            .forward
            .profile(&self.ctx, decode_pos, prompt_tokens)
            .await;
        self.reset();
        result
    }

    /// Forgets the conversation: the next call starts from an empty KV cache.
    pub fn reset(&mut self) {
        self.cached.clear();
        // Truncating to 0 cannot fail.
        let _ = self.forward.truncate(0);
    }

    /// The prompt as token ids: text tokenized (special tokens recognised when `special`),
    /// a conversation rendered with the chat template, ids checked against the vocabulary.
    pub fn tokenize_prompt(&self, prompt: &Prompt, special: bool) -> Result<Vec<u32>> {
        let ids = match prompt {
            Prompt::Text(text) => self.tokenizer.encode(text, special, None)?,
            Prompt::Chat(messages) => {
                let text = self.template.render(messages, true)?;
                // A template that writes BOS itself must not get a second one.
                let bos_written = self
                    .tokenizer
                    .bos_id()
                    .and_then(|id| self.tokenizer.id_to_token(id))
                    .is_some_and(|bos| !bos.is_empty() && text.starts_with(&bos));
                let add_bos = if bos_written { Some(false) } else { None };
                self.tokenizer.encode(&text, true, add_bos)?
            }
            Prompt::Tokens(ids) => ids.clone(),
        };
        let vocab = self.vocab();
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(Error::invalid(
                "prompt",
                format!("token id {bad} is outside the vocabulary of {vocab}"),
            ));
        }
        Ok(ids)
    }

    /// Ids the sampler may choose: the model's and the tokenizer's vocabularies overlap.
    fn vocab(&self) -> usize {
        self.forward
            .config()
            .vocab_size
            .min(self.tokenizer.vocab_size())
    }

    /// Generates from one prompt; `on_token` sees every token as it is produced.
    pub async fn generate(
        &mut self,
        prompt: &Prompt,
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(&TokenEvent),
    ) -> Result<Generation> {
        self.abort.clear();
        let result = self.generate_one(0, prompt, options, on_token).await;
        if result.is_err() {
            // The KV state is unknown after a failure: start the next call from scratch.
            self.reset();
        }
        result
    }

    /// Generates from each prompt in turn (each stops on its own end-of-sequence); results in
    /// input order. Events carry the prompt's index.
    pub async fn generate_batch(
        &mut self,
        prompts: &[Prompt],
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(&TokenEvent),
    ) -> Result<Vec<Generation>> {
        self.abort.clear();
        let mut out = Vec::with_capacity(prompts.len());
        for (i, prompt) in prompts.iter().enumerate() {
            match self.generate_one(i, prompt, options, on_token).await {
                Ok(g) => out.push(g),
                Err(e) => {
                    self.reset();
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    async fn generate_one(
        &mut self,
        index: usize,
        prompt: &Prompt,
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(&TokenEvent),
    ) -> Result<Generation> {
        let start = Instant::now();
        let params = &options.sampling;
        params.validate_for_vocab(self.vocab())?;
        let mut tokens = self.tokenize_prompt(prompt, options.special)?;
        if tokens.is_empty() {
            return Err(Error::invalid(
                "prompt",
                "the prompt has no tokens (give some text, or enable BOS)",
            ));
        }
        let mut warnings = Vec::new();
        let n_keep = self.n_keep(&tokens, options)?;
        self.fit_prompt(&mut tokens, n_keep, options, &mut warnings)?;
        let mut stops = self.eos.clone();
        stops.extend(&params.stop_token_ids);
        if matches!(prompt, Prompt::Chat(_)) {
            stops.extend(&self.end_of_turn);
        }
        let mut stats = Stats {
            prompt_tokens: tokens.len(),
            ..Stats::default()
        };
        let ctx = Ctx {
            index,
            prompt: &tokens,
            n_keep,
            stops: &stops,
            start,
        };
        let (sequences, seed) = if params.max_new_tokens == 0 {
            let empty = Sequence {
                tokens: Vec::new(),
                text: String::new(),
                finish_reason: FinishReason::Length,
                logprob: 0.0,
            };
            (vec![empty; params.num_return_sequences], None)
        } else if params.num_beams > 1 {
            let seqs = self.beam_search(&ctx, params, &mut stats, on_token).await?;
            (seqs, None)
        } else {
            let mut sampler = Sampler::new(params, self.vocab())?;
            let mut seqs = Vec::with_capacity(params.num_return_sequences);
            for s in 0..params.num_return_sequences {
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

    fn n_keep(&self, tokens: &[u32], options: &GenerateOptions) -> Result<usize> {
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
    fn fit_prompt(
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
    /// and returns the logits after the last one. Aborts between chunks.
    async fn prefill(&mut self, tokens: &[u32]) -> Result<Option<Vec<f32>>> {
        let common = common_prefix(&self.cached, tokens).min(tokens.len().saturating_sub(1));
        self.forward.truncate(common)?;
        self.cached.truncate(common);
        let mut logits = None;
        for chunk in tokens[common..].chunks(DEFAULT_CHUNK) {
            if self.abort.is_aborted() {
                return Ok(None);
            }
            logits = Some(self.forward.forward(&self.ctx, chunk, false).await?);
            self.cached.extend_from_slice(chunk);
        }
        Ok(logits)
    }

    /// Feeds one generated token, sliding the context first when it is full. Returns what the
    /// step read back after it: the candidates `request` asks for, or the whole row (without a
    /// request, when forced, or after a slide); `None` when aborted during a slide.
    async fn advance(
        &mut self,
        token: u32,
        n_keep: usize,
        warnings: &mut Vec<String>,
        request: Option<&SelectRequest>,
    ) -> Result<Option<StepLogits>> {
        if self.cached.len() < self.context() {
            let request = request.filter(|_| !self.full_row_readback);
            let logits = self
                .forward
                .decode_select(&self.ctx, token, request)
                .await?;
            self.cached.push(token);
            return Ok(Some(logits));
        }
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
        self.forward.truncate(n_keep.min(self.cached.len()))?;
        self.cached.truncate(n_keep);
        Ok(self.prefill(&seq).await?.map(StepLogits::Full))
    }

    /// Samples from what a step read back: from the candidates when they suffice, else from
    /// the whole row (read now if the step did not).
    async fn sample_step(
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
                let row = self.forward.last_logits(&self.ctx).await?;
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
        let mut run = Running {
            tokens: Vec::new(),
            text: String::new(),
            logprob: 0.0,
            decoder: tokenizer.stream_decoder(true),
            stops: StopMatcher::new(&params.stop),
        };
        let mut decode_start = None;
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
            if c.stops.contains(&s.id) {
                break FinishReason::Stop;
            }
            run.tokens.push(s.id);
            run.logprob += f64::from(s.logprob);
            let piece = run.decoder.push(s.id)?;
            let out = run.stops.push(&piece);
            run.text.push_str(&out.text);
            on_token(&TokenEvent {
                prompt: c.index,
                sequence,
                id: Some(s.id),
                logprob: Some(s.logprob),
                text: out.text,
            });
            if out.stopped {
                break FinishReason::Stop;
            }
            if run.tokens.len() >= params.max_new_tokens {
                break FinishReason::Length;
            }
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
        if !run.stops.stopped() {
            let rest = run.decoder.finish()?;
            let mut tail = run.stops.push(&rest).text;
            if !run.stops.stopped() {
                tail.push_str(&run.stops.finish());
            }
            if !tail.is_empty() {
                run.text.push_str(&tail);
                on_token(&TokenEvent {
                    prompt: c.index,
                    sequence,
                    id: None,
                    logprob: None,
                    text: tail,
                });
            }
        }
        Ok(Sequence {
            tokens: run.tokens,
            text: run.text,
            finish_reason: finish,
            logprob: run.logprob,
        })
    }

    fn aborted_sequence(&self) -> Sequence {
        Sequence {
            tokens: Vec::new(),
            text: String::new(),
            finish_reason: FinishReason::Abort,
            logprob: 0.0,
        }
    }

    /// Beam search: every beam keeps its generated KV rows in a slot of its own; the prompt's
    /// rows are shared. Stop strings cut the finished texts afterwards.
    async fn beam_search(
        &mut self,
        c: &Ctx<'_>,
        params: &SamplingParams,
        stats: &mut Stats,
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
        let scoring = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            typical_p: 1.0,
            ..params.clone()
        };
        let scorer = Sampler::new(&scoring, self.vocab())?;
        let vocab = self.vocab();
        let prefill_start = Instant::now();
        stats.cached_tokens = common_prefix(&self.cached, c.prompt).min(p.saturating_sub(1));
        let Some(first) = self.prefill(c.prompt).await? else {
            return Ok(vec![self.aborted_sequence()]);
        };
        stats.prefill_ms = elapsed_ms(prefill_start);
        let mut slots: Vec<KvCache> = Vec::with_capacity(2 * width);
        for _ in 0..2 * width {
            slots.push(self.forward.new_kv_slot(&self.ctx, max_new)?);
        }
        let mut free: Vec<usize> = (0..slots.len()).collect();
        let mut running = vec![Beam {
            tokens: Vec::new(),
            score: 0.0,
            logprob: 0.0,
            slot: None,
            logits: first,
        }];
        let mut finished: Vec<Finished> = Vec::new();
        let decode_start = Instant::now();
        stats.time_to_first_token_ms = elapsed_ms(c.start);
        for step in 0..max_new {
            // Every running beam proposes its best 2·width continuations.
            let mut cands: Vec<Candidate> = Vec::new();
            for (b, beam) in running.iter().enumerate() {
                let raw = log_softmax(&beam.logits[..vocab])?;
                let mut processed = beam.logits[..vocab].to_vec();
                scorer.process(&mut processed, c.prompt, &beam.tokens)?;
                let lp = log_softmax(&processed)?;
                let mut ids: Vec<u32> = (0..vocab as u32).collect();
                let k = (2 * width).min(vocab);
                ids.select_nth_unstable_by(k - 1, |&a, &b| {
                    lp[b as usize].total_cmp(&lp[a as usize])
                });
                for &id in &ids[..k] {
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
                        finished.push(Finished::new(
                            parent.tokens.clone(),
                            cand.score,
                            parent.logprob,
                            FinishReason::Stop,
                            params.length_penalty,
                        ));
                    }
                    continue;
                }
                next.push((cand.beam, cand.id, cand.score, parent.logprob + cand.raw));
                if next.len() == width {
                    break;
                }
            }
            finished.sort_by(|a, b| b.normalized.total_cmp(&a.normalized));
            finished.truncate(width);
            let done = finished.len() >= width
                && (params.early_stopping
                    || next.first().is_none_or(|&(_, _, score, _)| {
                        let len = (step + 1) as f64;
                        let best = score / len.powf(f64::from(params.length_penalty));
                        finished[width - 1].normalized >= best
                    }));
            if done || next.is_empty() {
                break;
            }
            let mut grown = Vec::with_capacity(next.len());
            for &(b, id, score, logprob) in &next {
                let mut tokens = running[b].tokens.clone();
                tokens.push(id);
                grown.push((b, tokens, score, logprob));
            }
            if step + 1 == max_new || self.abort.is_aborted() {
                let reason = if self.abort.is_aborted() {
                    FinishReason::Abort
                } else {
                    FinishReason::Length
                };
                for (_, tokens, score, logprob) in grown {
                    finished.push(Finished::new(
                        tokens,
                        score,
                        logprob,
                        reason,
                        params.length_penalty,
                    ));
                }
                break;
            }
            // Run each new beam's last token on its parent's KV rows, and keep its own rows.
            let mut new_running = Vec::with_capacity(grown.len());
            for (b, tokens, score, logprob) in grown {
                let parent_rows = tokens.len() - 1;
                if let Some(slot) = running[b].slot {
                    self.forward.truncate(p.min(self.forward.kv().pos()))?;
                    self.forward
                        .load_kv(&self.ctx, p, &slots[slot], parent_rows)?;
                } else {
                    self.forward.truncate(p)?;
                }
                let last = tokens[tokens.len() - 1];
                let logits = self.forward.forward(&self.ctx, &[last], false).await?;
                let slot = free
                    .pop()
                    .ok_or_else(|| Error::invalid("num_beams", "internal: no free beam slot"))?;
                self.forward.save_kv(&self.ctx, p, &slots[slot])?;
                new_running.push(Beam {
                    tokens,
                    score,
                    logprob,
                    slot: Some(slot),
                    logits,
                });
            }
            for beam in &running {
                if let Some(s) = beam.slot {
                    free.push(s);
                }
            }
            running = new_running;
        }
        stats.decode_ms = elapsed_ms(decode_start);
        // The cache now holds the prompt and some beam's rows: keep only the prompt.
        self.forward.truncate(p.min(self.forward.kv().pos()))?;
        self.cached.truncate(p);
        if finished.is_empty() {
            for beam in running {
                finished.push(Finished::new(
                    beam.tokens,
                    beam.score,
                    beam.logprob,
                    FinishReason::Length,
                    params.length_penalty,
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
            on_token(&TokenEvent {
                prompt: c.index,
                sequence: i,
                id: None,
                logprob: None,
                text: text.clone(),
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
        let vocab = self.forward.config().vocab_size;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::invalid(
                "tokens",
                format!("token id {bad} is outside the vocabulary of {vocab}"),
            ));
        }
        let mut nll = 0.0f64;
        let mut count = 0usize;
        for window in tokens.chunks(self.context()) {
            self.reset();
            // Logits of every position but the last predict the next token.
            let inputs = &window[..window.len() - 1];
            let mut done = 0;
            for chunk in inputs.chunks(DEFAULT_CHUNK) {
                if self.abort.is_aborted() {
                    return Err(Error::invalid("score", "aborted"));
                }
                let rows = self.forward.forward(&self.ctx, chunk, true).await?;
                for (i, row) in rows.chunks(vocab).enumerate() {
                    let target = window[done + i + 1] as usize;
                    let lp = log_softmax(row)?;
                    nll -= f64::from(lp[target]);
                    count += 1;
                }
                done += chunk.len();
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
            ppl: nll.exp(),
        })
    }
}

/// What a generation call passes down to its sequences.
struct Ctx<'a> {
    index: usize,
    prompt: &'a [u32],
    n_keep: usize,
    stops: &'a [u32],
    start: Instant,
}

struct Beam {
    tokens: Vec<u32>,
    /// Sum of processed log-probabilities (the beam score).
    score: f64,
    /// Sum of raw log-probabilities.
    logprob: f64,
    /// Slot holding the KV rows of `tokens` (none before the first token).
    slot: Option<usize>,
    /// Logits after the last token.
    logits: Vec<f32>,
}

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
}

impl Finished {
    fn new(
        tokens: Vec<u32>,
        score: f64,
        logprob: f64,
        reason: FinishReason,
        length_penalty: f32,
    ) -> Self {
        let len = tokens.len().max(1) as f64;
        Self {
            normalized: score / len.powf(f64::from(length_penalty)),
            tokens,
            logprob,
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid_name(json: &str) -> Option<&'static str> {
        match GenerateOptions::from_json(json) {
            Err(Error::InvalidArgument { name, .. }) => Some(name),
            _ => None,
        }
    }

    #[test]
    fn options_from_json_split_own_fields_from_sampling() {
        let o = GenerateOptions::from_json(
            r#"{"topP": 0.5, "maxNewTokens": 3, "special": true, "nKeep": 2, "strict": true}"#,
        )
        .unwrap_or_default();
        assert_eq!(o.sampling.top_p, 0.5);
        assert_eq!(o.sampling.max_new_tokens, 3);
        assert!(o.special && o.strict);
        assert_eq!(o.n_keep, Some(2));
        let defaults = GenerateOptions::from_json("null").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(defaults, GenerateOptions::default());
    }

    #[test]
    fn options_from_json_errors_name_the_option() {
        assert_eq!(invalid_name(r#"{"topP": 1.5}"#), Some("top_p"));
        assert_eq!(invalid_name(r#"{"special": 1}"#), Some("special"));
        assert_eq!(invalid_name(r#"{"nKeep": -1}"#), Some("n_keep"));
        assert_eq!(invalid_name(r#"{"n_keep": 1, "nKeep": 1}"#), Some("n_keep"));
        assert_eq!(invalid_name("[1]"), Some("options"));
        assert_eq!(invalid_name(r#"{"bogus": 1}"#), Some("sampling_params"));
    }

    #[test]
    fn prompt_from_json_takes_text_chat_and_ids() {
        assert_eq!(
            Prompt::from_json(r#""hi""#).ok(),
            Some(Prompt::Text("hi".into()))
        );
        assert_eq!(
            Prompt::from_json(r#"[{"role":"user","content":"hi"}]"#).ok(),
            Some(Prompt::Chat(vec![ChatMessage::new("user", "hi")]))
        );
        assert_eq!(
            Prompt::from_json("[1, 2]").ok(),
            Some(Prompt::Tokens(vec![1, 2]))
        );
        assert!(Prompt::from_json("{}").is_err());
    }
}
