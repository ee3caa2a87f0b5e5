//! CPU-side token sampling: parameters ([`SamplingParams`]), logit processing and drawing
//! ([`Sampler`]) and stop strings in streamed text ([`StopMatcher`]).
//!
//! # Processor order
//!
//! [`Sampler::process`] rewrites a `[vocab]` logit vector in place, in this order:
//!
//! 1. **Logit bias**: `logit[id] += logit_bias[id]`.
//! 2. **Repetition penalty** (Hugging Face semantics): for every *distinct* token of
//!    `prompt ++ generated` inside the penalty window, a positive logit is divided by
//!    `repetition_penalty` and a negative one multiplied by it.
//! 3. **Presence and frequency penalties** (OpenAI semantics): for every token generated inside
//!    the window, `logit -= presence_penalty * [count > 0] + frequency_penalty * count`, where
//!    `count` is how often it was generated there. Prompt tokens do not count.
//! 4. **Temperature**: every logit is divided by `temperature`; skipped when greedy.
//! 5. **Top-k**: keeps the `top_k` largest logits (ties to the lower id).
//! 6. **Typical**: orders the survivors by `|-log p - H|` (H: their entropy) and keeps the
//!    shortest prefix of that order whose probability reaches `typical_p`.
//! 7. **Top-p**: orders the survivors by probability and keeps the shortest prefix whose
//!    probability reaches `top_p`.
//! 8. **Min-p**: keeps the survivors whose probability is at least `min_p` times the largest.
//!
//! **Constraints.** A [`TokenMask`] set with [`Sampler::set_mask`] acts before step 1: a
//! forbidden token's logit becomes `f32::NEG_INFINITY` and every step leaves it there, so a
//! constrained draw is an unconstrained draw from the allowed tokens, renormalised.
//!
//! Steps 5-8 are one pipeline of filters, built once when the sampler is made (the neutral
//! ones left out); the full row and the candidate path below run the same pipeline.
//!
//! Probabilities in steps 6-8 are the softmax over the tokens that survived the previous steps.
//! The penalty window is the last `penalty_last_n` tokens of `prompt ++ generated` (all of them
//! when `penalty_last_n` is 0). A filtered token's logit becomes `f32::NEG_INFINITY`; every
//! filter keeps at least one token. Each filter is skipped at its neutral value (`top_k` 0,
//! `typical_p` 1, `top_p` 1, `min_p` 0). Penalties and temperature saturate at `±f32::MAX`
//! rather than overflow.
//!
//! **Greedy** ([`SamplingParams::is_greedy`]: `temperature == 0` or `top_k == 1`): after the
//! penalties, only the largest logit (lowest id on ties) is kept, temperature and the filters
//! are skipped, and [`Sampler::sample`] returns that token without consuming randomness.
//!
//! # Drawing
//!
//! Otherwise [`Sampler::sample`] takes one uniform `u` in `[0, 1)` from a ChaCha20 generator
//! (the top 53 bits of one `u64`, so native and wasm32 draw identically) and walks the softmax
//! of the processed logits in **token-id order**, returning the first id whose cumulative
//! probability exceeds `u`. The same seed, parameters and inputs always give the same tokens.
//! [`Sampler::distribution`] returns exactly the probabilities this walk uses.
//!
//! [`Sampled::logprob`] is always the log-softmax of the *raw* logits (before any processor).
//!
//! # Candidates instead of the row
//!
//! A decode step can read back only the GPU's top candidates ([`candidates`]):
//! [`Sampler::select_request`] says what to select (or that the row is needed), and
//! [`Sampler::sample_candidates`] returns exactly the token [`Sampler::sample`] would draw
//! from the full row, with the same use of the random generator, or declines. The pipeline's
//! first filter says what the candidates must show (the order of the largest, a nucleus that
//! ends inside them, or nothing short of the row); the filters after it run on the kept
//! tokens as on the row's survivors. Greedy and
//! `top_k <= 256` are served whenever the selection proves the order of the kept tokens; top-p
//! without top-k when the nucleus provably ends inside the candidates; min-p or typical without
//! top-k never. On that path the log-probability comes from the GPU's f32 max and sum of the
//! raw row and may differ from the full path's in the last bits; the token never does. To make
//! the kept set's order canonical, top-k's survivors are sorted by logit before the filters.
//!
//! # Speculative decoding
//!
//! [`speculative`] verifies drafted tokens against these same distributions (modified
//! rejection sampling), so speculation changes how many forward steps a text costs, never
//! which distribution its tokens come from.

pub use crate::candidates;
pub mod divergence;
mod filters;
mod from_candidates;
mod logits;
pub mod mask;
pub mod params;
pub mod sampler;
pub mod speculative;
pub mod stop;

pub use candidates::{Candidates, LogitAdjustment, OpenAiPenalty, SelectRequest};
pub use divergence::{agreement, LogitAgreement};
pub use mask::TokenMask;
pub use params::{draw_seed, Checked, Preset, SamplingParams, DEFAULT_MAX_NEW_TOKENS};
pub use sampler::{log_softmax, Sampled, Sampler, TopLogprob, MAX_TOP_LOGPROBS};
pub use stop::{StopMatcher, StopOutput};
