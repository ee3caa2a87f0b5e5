//! What a generation call takes and returns: the prompt, the options (read from JSON by
//! [`super::options_parse`]),
//! streamed token events, the generated sequences with their timings, and scores.

use serde::{Deserialize, Serialize};

use crate::chat::{ChatMessage, ToolRequest};
use crate::constrain::ResponseFormat;
use crate::error::{Error, Result};
use crate::sampling::{Checked, SamplingParams, TopLogprob, MAX_TOP_LOGPROBS};

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
    /// Recompute the whole sequence at every generated token instead of reading the KV cache
    /// (JSON `use_cache: false`): for teaching and for measuring what the cache saves. Same
    /// tokens, far slower. Not with beam search.
    pub no_kv_cache: bool,
    /// Put the prompt's text first: one event per sequence before its tokens (`id: None`), and
    /// at the start of every sequence's `text` (a text prompt as given; messages and token ids
    /// as the model saw them, special tokens included). `tokens` stay the generated ones.
    pub echo: bool,
    /// Speculative decoding (`None`: off): drafts from a draft model or prompt lookup,
    /// verified by the model in one step each. Sampling and greedy only.
    pub speculative: Option<super::SpecOptions>,
    /// The shape the text must have (JSON `response_format`): free text, a JSON object, JSON
    /// under a schema, a regular expression, a Lark or a GBNF grammar. Sampling and greedy
    /// only (also batched and with `num_return_sequences`).
    pub response_format: ResponseFormat,
    /// How many of the most likely tokens each token event reports beside the drawn one
    /// (JSON `top_logprobs` / `topLogprobs`), `0..=20`. Default 0. Sampling and greedy
    /// decoding only (also batched and with `num_return_sequences`).
    pub top_logprobs: usize,
    /// Functions the model may call (OpenAI's `tools`, `tool_choice`,
    /// `parallel_tool_calls`): a conversation prompt shows them to the model through its chat
    /// template, and calls are held to the template's call syntax with arguments valid against
    /// each function's schema. Not with a constraining `response_format`.
    pub tools: Option<ToolRequest>,
}

impl GenerateOptions {
    /// Checks every range and every combination that needs no model (the sampling
    /// parameters, `top_logprobs`, speculative settings, and what beam search, speculative
    /// decoding and `use_cache: false` exclude); the error names the option.
    pub fn validate(&self) -> Result<()> {
        let params = &self.sampling;
        params.validate()?;
        if let Some(tools) = &self.tools {
            if !tools.callable().is_empty() && self.response_format.is_constrained() {
                return Err(Error::invalid(
                    "response_format",
                    "cannot be combined with tools the model may call (give `tool_choice: \"none\"` to hold the answer to the format)",
                ));
            }
        }
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            return Err(Error::invalid(
                "top_logprobs",
                format!(
                    "must be a whole number in 0..={MAX_TOP_LOGPROBS}, got {}",
                    self.top_logprobs
                ),
            ));
        }
        if self.top_logprobs > 0 && (params.num_beams > 1 || self.speculative.is_some()) {
            return Err(Error::invalid(
                "top_logprobs",
                "alternatives per token come with sampling and greedy decoding, not with beam search or speculative decoding",
            ));
        }
        if self.no_kv_cache && params.num_beams > 1 {
            return Err(Error::invalid(
                "use_cache",
                "decoding without the KV cache runs sampling and greedy decoding, not beam search",
            ));
        }
        if let Some(spec) = &self.speculative {
            spec.validate()?;
            if params.num_beams > 1 || self.no_kv_cache {
                return Err(Error::invalid(
                    "speculative",
                    "speculative decoding runs sampling and greedy decoding with the KV cache, not beam search or use_cache: false",
                ));
            }
        }
        Ok(())
    }

    /// [`GenerateOptions::validate`] and the token ids against a vocabulary of `vocab_size`:
    /// the one check of a call's options, made where the session starts it. The sampling
    /// parameters come back as the [`Checked`] form the samplers are built from.
    pub fn check(&self, vocab_size: usize) -> Result<Checked> {
        self.validate()?;
        self.sampling.check(vocab_size)
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

/// Why a sequence ended: `stop` (end of sequence or a stop string), `length`
/// (`max_new_tokens`) or `abort`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(target_arch = "wasm32", derive(tsify::Tsify))]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_new_tokens` reached.
    Length,
    /// [`AbortHandle::abort`](super::AbortHandle::abort) was called.
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

/// Beam search's progress after a step: the best running beam's text so far.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(target_arch = "wasm32", derive(tsify::Tsify))]
pub struct BeamProgress {
    /// The decode step (0: after the first generated token).
    pub step: usize,
    /// The leading beam's text so far (the final sequences come in the events after the
    /// search, best first; a finished beam may beat the last leader).
    pub text: String,
    /// The lead changed hands: the leader does not extend the previous step's leader.
    pub switched: bool,
}

/// One streamed piece of output.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(target_arch = "wasm32", derive(tsify::Tsify))]
pub struct TokenEvent {
    /// Index of the prompt in a batch (0 for a single prompt).
    pub prompt: usize,
    /// Index of the sequence among `num_return_sequences`.
    pub sequence: usize,
    /// The token, or `None` for the final event that releases text held back at the end
    /// (an incomplete character or a partial stop-string match that never completed) and for
    /// the echoed prompt that comes first with `echo`.
    #[cfg_attr(target_arch = "wasm32", tsify(type = "number | null"))]
    pub id: Option<u32>,
    /// The token's log-probability under the model's own distribution (`None` with `id`).
    #[cfg_attr(target_arch = "wasm32", tsify(type = "number | null"))]
    pub logprob: Option<f32>,
    /// Text this event adds (UTF-8 safe; may be empty while text is held back).
    pub text: String,
    /// During beam search, one event per step (with `id: None` and no text) says which beam
    /// leads and its text.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(target_arch = "wasm32", tsify(optional))]
    pub beam: Option<BeamProgress>,
    /// With speculative decoding: whether the token is a drafted one the model accepted
    /// (`false`: the model's own token, after a rejection, the extra token or a plain step).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(target_arch = "wasm32", tsify(optional))]
    pub drafted: Option<bool>,
    /// With `top_logprobs` > 0: the most likely tokens at this step under the model's own
    /// distribution, most likely first (the drawn token may be among them or not).
    #[serde(rename = "topLogprobs", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(target_arch = "wasm32", tsify(optional))]
    pub top_logprobs: Option<Vec<TopLogprob>>,
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
    /// Sampled tokens drawn (or, in speculative decoding, drafts verified) from the GPU's
    /// candidates alone.
    pub candidate_steps: usize,
    /// Sampled tokens drawn (or drafts verified) from a whole logits row read back (the
    /// first token after the prompt, a forced full readback, parameters the candidates cannot
    /// serve, the CPU backend, fallbacks).
    pub full_row_steps: usize,
    /// Of those, rows whose candidates were read first and then, as they did not suffice,
    /// the row too.
    pub select_fallbacks: usize,
    /// Decode steps whose draw a response format restricted.
    pub constrained_steps: usize,
    /// Time spent computing those steps' allowed tokens.
    pub constraint_ms: f64,
    /// What speculative decoding did (`None` when it was off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculative: Option<super::SpecStats>,
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

#[cfg(test)]
mod tests {
    use super::*;

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
