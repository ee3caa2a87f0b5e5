//! Generation: a [`Session`] turns prompts into text with the GPU forward pass and the CPU
//! [`Sampler`](crate::sampling::Sampler).
//!
//! - **KV reuse.** The session remembers which tokens its KV cache holds. A new call keeps the
//!   longest common prefix of those and the new prompt and only runs the rest, so a multi-turn
//!   chat pays for each new turn, not for the whole conversation.
//! - **Context overflow.** When the next token would not fit, the session keeps the first
//!   `n_keep` tokens, drops the oldest half of the rest and runs the kept tail again (positions
//!   and RoPE are recomputed, never shifted), then generation goes on. A prompt longer than the
//!   context is cut from the left with a warning, or rejected in strict mode.
//! - **Several sequences.** A batch of prompts and a prompt's `num_return_sequences` samples
//!   decode together, each sequence in a KV slot of its own (`batched`: continuous batching,
//!   one forward step for all of them); beam search keeps every beam in a slot and advances
//!   all beams in one step per position.
//! - **Stopping.** End-of-sequence ids (the model's, the caller's and, in chat form, the
//!   template's end-of-turn token), stop strings matched across token boundaries,
//!   `max_new_tokens`, and [`AbortHandle::abort`], honoured between tokens and prefill chunks.
//! - **Small readbacks.** A sampled decode step reads back only the GPU's selection of
//!   candidates (at most 4 KB, see
//!   [`Sampler::select_request`](crate::sampling::Sampler::select_request)) instead of the
//!   whole logits row; when the candidates cannot prove the token the full path would draw,
//!   the step reads the row as well and samples from it. Tokens and seeded sequences are the same either way;
//!   [`Session::set_full_row_readback`] forces the row on every step.
//!
//! The code is split by concern: [`options`] (what a call takes and returns), `context`
//! (fitting, sliding, prefix reuse), `decode` (the sampling loop) and `beam` (beam search and
//! scoring).

mod batch_json;
mod batched;
mod beam;
pub mod cache_plan;
mod constraint;
mod context;
mod decode;
mod draft;
pub mod embed;
mod fit;
pub mod generate_keys;
pub mod options;
pub mod options_parse;
mod running;
mod saved;
pub mod saved_state;
mod serving;
pub mod spec_options;
mod speculative;
mod verify;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use web_time::Instant;

use crate::backend::cpu::{CpuForward, CpuPrecision};
use crate::backend::gpu::{GpuContext, GpuModel};
use crate::backend::{Backend, Readback, Rows, DEFAULT_CHUNK};
use crate::chat::{ChatMessage, ChatTemplate, ToolRequest};
use crate::config::ContextChoice;
use crate::config::ModelConfig;
use crate::constrain::{Constraint, Grammars};
use crate::dtype::kv::KvKinds;
use crate::error::{Error, Result};
use crate::loader::ModelFiles;
use crate::tokenizer::Tokenizer;

pub use batch_json::parse_batch;
pub use batched::BatchItem;
pub use cache_plan::{CacheCandidate, CacheDecision, CachePlanOptions};
pub use draft::check_same_vocabulary;
pub use embed::{EmbedOptions, Embeddings, Pooling};
pub use options::{
    BeamProgress, FinishReason, GenerateOptions, Generation, Prompt, Score, Sequence, Stats,
    TokenEvent,
};
pub use options_parse::GivenOptions;
pub use saved::Restored;
pub use serving::ItemFeed;
pub use spec_options::{SpecOptions, SpecSource, SpecStats, SPEC_METHOD};

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

    /// Withdraws a pending abort (at the start of each call).
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

/// A model loaded on the GPU or the CPU with its tokenizer and chat template, and the state
/// of one conversation (the tokens its KV cache holds).
pub struct Session {
    forward: Box<dyn Backend>,
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
    /// The call in progress decodes without the KV cache (`use_cache: false`).
    recompute: bool,
    /// The automatic KV-cache plan's decision, when one was made.
    cache_decision: Option<cache_plan::CacheDecision>,
    /// The draft model of speculative decoding, when one is loaded.
    draft: Option<draft::Draft>,
    /// The grammar compiler for this tokenizer, built at the first constrained call.
    grammars: Option<Arc<Grammars>>,
    /// The model's fingerprint, which a saved conversation must carry to be restored here.
    model_id: String,
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

fn elapsed_ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

/// What a generation call passes down to its sequences.
struct Ctx<'a> {
    index: usize,
    prompt: &'a [u32],
    n_keep: usize,
    stops: &'a [u32],
    start: Instant,
    /// Speculative decoding for the call's sampled sequences.
    speculative: Option<speculative::Speculation<'a>>,
    /// The call's response format, compiled (`None`: free text).
    constraint: Option<&'a Constraint>,
}

/// Rejects token ids outside `0..vocab`, naming the first bad id and its position. The one
/// check of ids entering the session (a prompt, or a text to score); `name` is the argument
/// they came in.
fn check_token_ids(name: &'static str, ids: &[u32], vocab: usize) -> Result<()> {
    match ids.iter().position(|&id| id as usize >= vocab) {
        Some(i) => Err(Error::invalid(
            name,
            format!(
                "token id {} at position {i} is outside the vocabulary of {vocab} (ids 0..{vocab})",
                ids[i]
            ),
        )),
        None => Ok(()),
    }
}

/// Tokens of the text an encoder is timed on ([`Session::time_decode_step`]): a sentence.
pub const ENCODER_TIMING_TOKENS: usize = 32;

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
        let gpu_context =
            |ctx: &GpuContext, config: &ModelConfig| fit::gpu_context(ctx, config, context);
        if let ModelFiles::Ranged(ranged) = files {
            let layout = ranged.layout();
            let choice = gpu_context(&ctx, &layout.config);
            let forward =
                GpuModel::load_read(ctx, layout, ranged.as_ref(), choice.context, progress).await?;
            return Self::with_backend(files, Box::new(forward), choice, ranged.fingerprint()?);
        }
        let weights = files.weights()?;
        let choice = gpu_context(&ctx, &weights.config);
        let forward = GpuModel::load(ctx, &weights, choice.context, progress).await?;
        Self::with_backend(files, Box::new(forward), choice, weights.fingerprint())
    }

    /// Loads `files` for the CPU backend with a KV cache of `context` positions (default: the
    /// model's context, at most 4096, and in WebAssembly at most what fits the address space
    /// beside the model: [`crate::backend::cpu::context_for`]).
    pub fn new_cpu(files: &ModelFiles, context: Option<usize>) -> Result<Self> {
        Self::new_cpu_with(files, context, CpuPrecision::Int8)
    }

    /// [`Session::new_cpu`] with the matrix products in `precision` (8-bit activations, or
    /// exact f32).
    pub fn new_cpu_with(
        files: &ModelFiles,
        context: Option<usize>,
        precision: CpuPrecision,
    ) -> Result<Self> {
        Self::new_cpu_in(files, context, precision, KvKinds::default())
    }

    /// [`Session::new_cpu_with`] with the KV cache in `kinds` from the start, the default
    /// context sized for them (a q8_0 cache leaves room for 3.8 times the positions of an f32
    /// one in WebAssembly's address space).
    pub fn new_cpu_in(
        files: &ModelFiles,
        context: Option<usize>,
        precision: CpuPrecision,
        kinds: KvKinds,
    ) -> Result<Self> {
        let weights = files.weights()?;
        let choice = fit::cpu_context(&weights, context, kinds);
        let forward =
            CpuForward::with_kinds(&weights, choice.context, DEFAULT_CHUNK, precision, kinds)?;
        Self::with_backend(files, Box::new(forward), choice, weights.fingerprint())
    }

    /// [`Session::new_cpu_in`] for files of any kind, calling `progress(read, total)` in
    /// weight bytes while a model read by range ([`ModelFiles::Ranged`]) comes a group of
    /// tensors at a time: its matrices become the backend's own as they arrive (in tiles where
    /// the CPU has them) and its files are never held whole. Files already held load as there.
    pub async fn new_cpu_read(
        files: &ModelFiles,
        context: Option<usize>,
        precision: CpuPrecision,
        kinds: KvKinds,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self> {
        let ModelFiles::Ranged(ranged) = files else {
            return Self::new_cpu_in(files, context, precision, kinds);
        };
        let layout = ranged.layout();
        let choice = fit::cpu_context(layout, context, kinds);
        let forward = CpuForward::load_read(
            layout,
            ranged.as_ref(),
            choice.context,
            DEFAULT_CHUNK,
            precision,
            kinds,
            progress,
        )
        .await?;
        Self::with_backend(files, Box::new(forward), choice, ranged.fingerprint()?)
    }

    /// The session over a loaded model.
    fn with_backend(
        files: &ModelFiles,
        forward: Box<dyn Backend>,
        choice: ContextChoice,
        model_id: String,
    ) -> Result<Self> {
        let tokenizer = files.tokenizer()?;
        let template = files.chat_template(&tokenizer)?;
        let has_template = template.is_some();
        let template = template.unwrap_or_else(ChatTemplate::fallback);
        let mut eos: Vec<u32> = forward.config().eos_ids.clone();
        for &id in tokenizer.eos_ids() {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
        let end_of_turn = Self::end_of_turn_ids(&template, &tokenizer);
        Ok(Self {
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
            recompute: false,
            cache_decision: None,
            draft: None,
            grammars: None,
            model_id,
        })
    }

    /// Uses `source` (a Jinja chat template) in place of the model's own, or of the plain
    /// fallback for a model without one; its end-of-turn tokens become stop tokens. A template
    /// that does not compile is an error, and the current one stays.
    pub fn set_chat_template(&mut self, source: &str) -> Result<()> {
        let template = ChatTemplate::from_source(source, &self.tokenizer)?;
        self.end_of_turn = Self::end_of_turn_ids(&template, &self.tokenizer);
        self.template = template;
        self.has_template = true;
        Ok(())
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

    /// The GPU context (`None` on the CPU backend).
    pub fn gpu(&self) -> Option<&GpuContext> {
        self.forward.gpu()
    }

    /// The loaded model's forward pass (backend, KV cache, memory).
    pub fn forward(&self) -> &dyn Backend {
        self.forward.as_ref()
    }

    /// Milliseconds one decode step takes on this session's backend: the fastest of `steps`
    /// single-token steps (each reading its logits row back) after one untimed step, from an
    /// empty KV cache. The cache is left empty (the next call runs its prompt again). An
    /// encoder, which does not decode, is timed on what it does: a text of
    /// [`ENCODER_TIMING_TOKENS`] embedded (its hidden states read back).
    pub async fn time_decode_step(&mut self, steps: usize) -> Result<f64> {
        self.forward.truncate(0)?;
        self.cached.clear();
        if self.config().bidirectional {
            let first = self.tokenizer.bos_id().unwrap_or(0);
            let text = vec![first; ENCODER_TIMING_TOKENS.min(self.context())];
            let mut best = f64::INFINITY;
            // the first run is not timed
            for run in 0..=steps.max(1) {
                self.forward.truncate(0)?;
                let t = Instant::now();
                self.forward
                    .run(Rows::Next(&text), Readback::Hidden)
                    .await?;
                if run > 0 {
                    best = best.min(elapsed_ms(t));
                }
            }
            self.forward.truncate(0)?;
            return Ok(best);
        }
        let token = [self.eos.first().copied().unwrap_or(0)];
        self.forward
            .run(Rows::Next(&token), Readback::LastRow)
            .await?;
        let mut best = f64::INFINITY;
        for _ in 0..steps.max(1) {
            let t = Instant::now();
            self.forward
                .run(Rows::Next(&token), Readback::LastRow)
                .await?;
            best = best.min(elapsed_ms(t));
        }
        self.forward.truncate(0)?;
        Ok(best)
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        self.forward.config()
    }

    /// The tokenizer, shared (to decode tokens while a call runs).
    pub fn shared_tokenizer(&self) -> Arc<Tokenizer> {
        Arc::clone(&self.tokenizer)
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// KV cache length in positions.
    pub fn context(&self) -> usize {
        self.forward.context()
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
    ) -> Result<crate::backend::gpu::Profile> {
        self.cached.clear();
        let result = self.forward.profile(decode_pos, prompt_tokens).await;
        self.reset();
        result
    }

    /// Forgets the conversation: the next call starts from an empty KV cache.
    pub fn reset(&mut self) {
        self.cached.clear();
        // Truncating to 0 cannot fail.
        let _ = self.forward.truncate(0);
        if let Some(d) = self.draft.as_mut() {
            d.cached.clear();
            let _ = d.forward.truncate(0);
        }
    }

    /// The logits of every position of `tokens`, `[tokens.len(), vocab]`, from an empty KV
    /// cache: in one prefill, or with `decode` the first token as a prefill and each later one
    /// through the cache (the decode path). Forgets the conversation.
    pub async fn all_logits(&mut self, tokens: &[u32], decode: bool) -> Result<Vec<f32>> {
        check_token_ids("tokens", tokens, self.vocab())?;
        if tokens.len() > self.context() {
            return Err(Error::invalid(
                "tokens",
                format!(
                    "{} tokens do not fit the context of {}",
                    tokens.len(),
                    self.context()
                ),
            ));
        }
        self.reset();
        let result = self.rows_from_empty(tokens, decode).await;
        self.reset();
        result
    }

    /// [`Session::all_logits`] after the reset.
    async fn rows_from_empty(&mut self, tokens: &[u32], decode: bool) -> Result<Vec<f32>> {
        if !decode {
            return self.forward.forward(tokens, true).await;
        }
        let mut rows = Vec::with_capacity(tokens.len() * self.forward.config().vocab_size);
        for &t in tokens {
            rows.extend(self.forward.forward(&[t], true).await?);
        }
        Ok(rows)
    }

    /// Starts over from `tokens` (a conversation another session held, replayed after a device
    /// loss): runs them into an empty KV cache without computing or reading back any logits,
    /// so the cache then holds exactly them. On an error the session is left empty.
    pub async fn restore(&mut self, tokens: &[u32]) -> Result<()> {
        check_token_ids("tokens", tokens, self.vocab())?;
        self.reset();
        if tokens.is_empty() {
            return Ok(());
        }
        if let Err(e) = self.forward.run(Rows::Next(tokens), Readback::None).await {
            self.reset();
            return Err(e);
        }
        self.cached = tokens.to_vec();
        Ok(())
    }

    /// The prompt as token ids: text tokenized (special tokens recognised when `special`),
    /// a conversation rendered with the chat template, ids checked against the vocabulary.
    pub fn tokenize_prompt(&self, prompt: &Prompt, special: bool) -> Result<Vec<u32>> {
        self.tokenize_prompt_with(prompt, special, None)
    }

    /// As [`Self::tokenize_prompt`], a conversation rendered with the `tools` the model may
    /// call (ignored for text and ids).
    pub fn tokenize_prompt_with(
        &self,
        prompt: &Prompt,
        special: bool,
        tools: Option<&ToolRequest>,
    ) -> Result<Vec<u32>> {
        let ids = match prompt {
            Prompt::Text(text) => self.tokenizer.encode(text, special, None)?,
            Prompt::Chat(messages) => {
                let text = self.template.render_with_tools(messages, tools, true)?;
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
        check_token_ids("prompt", &ids, self.vocab())?;
        Ok(ids)
    }

    /// Ids the sampler may choose: the model's and the tokenizer's vocabularies overlap.
    pub(super) fn vocab(&self) -> usize {
        self.forward
            .config()
            .vocab_size
            .min(self.tokenizer.vocab_size())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_token_id_is_named_with_its_position_and_the_vocabulary() {
        assert!(check_token_ids("prompt", &[0, 1, 9], 10).is_ok());
        assert!(check_token_ids("prompt", &[], 10).is_ok());
        let err = check_token_ids("prompt", &[3, 10, 12], 10).err();
        let Some(Error::InvalidArgument { name, .. }) = &err else {
            panic!("expected an invalid argument, got {err:?}");
        };
        assert_eq!(*name, "prompt");
        let text = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            text.contains("token id 10 at position 1 is outside the vocabulary of 10"),
            "{text}"
        );
    }

    #[test]
    fn an_abort_is_seen_by_every_clone_until_cleared() {
        let a = AbortHandle::default();
        let b = a.clone();
        assert!(!b.is_aborted());
        a.abort();
        assert!(b.is_aborted());
        b.clear();
        assert!(!a.is_aborted());
    }
}
