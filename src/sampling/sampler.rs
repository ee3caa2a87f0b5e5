//! Logit processing and token drawing.

use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha20Rng;

use crate::sampling::SamplingParams;
use crate::{Error, Result};

/// The chosen token and its log-probability under the model's raw distribution (log-softmax of
/// the logits as the model produced them, before any processor).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampled {
    /// Token id.
    pub id: u32,
    /// Log-probability of `id` under the raw logits.
    pub logprob: f32,
}

/// Log-softmax of `logits` (`[vocab]`), computed stably in f64 and returned as f32; non-finite
/// input -> Error naming the first bad index.
pub fn log_softmax(logits: &[f32]) -> Result<Vec<f32>> {
    let _ = logits;
    Err(Error::invalid("logits", "not implemented yet"))
}

/// Draws tokens from logits according to [`SamplingParams`].
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha20Rng,
    seed: u64,
    vocab_size: usize,
}

impl Sampler {
    /// Validates `params` for `vocab_size`, seeds the RNG from params.seed or getrandom.
    pub fn new(params: &SamplingParams, vocab_size: usize) -> Result<Self> {
        params.validate_for_vocab(vocab_size)?;
        let seed = params.seed.unwrap_or(0);
        Ok(Sampler {
            params: params.clone(),
            rng: ChaCha20Rng::seed_from_u64(seed),
            seed,
            vocab_size,
        })
    }

    /// The seed in use (reported to users so a run can be repeated).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The parameters this sampler was built with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Applies every logit processor in place (see the module documentation for the order).
    pub fn process(&self, logits: &mut [f32], prompt: &[u32], generated: &[u32]) -> Result<()> {
        let _ = (logits, prompt, generated, self.vocab_size);
        Err(Error::invalid("logits", "not implemented yet"))
    }

    /// Processes a copy of `logits` and draws one token.
    pub fn sample(&mut self, logits: &[f32], prompt: &[u32], generated: &[u32]) -> Result<Sampled> {
        let _ = (logits, prompt, generated, &mut self.rng);
        Err(Error::invalid("logits", "not implemented yet"))
    }

    /// The probability distribution `sample` would draw from.
    pub fn distribution(
        &self,
        logits: &[f32],
        prompt: &[u32],
        generated: &[u32],
    ) -> Result<Vec<f64>> {
        let _ = (logits, prompt, generated);
        Err(Error::invalid("logits", "not implemented yet"))
    }
}
