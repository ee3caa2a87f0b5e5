//! The sampling flags every generating subcommand shares.

use clap::Args;
use emberlm::sampling::SamplingParams;

/// Sampling and stopping flags; unset flags keep [`SamplingParams`]' defaults.
#[derive(Debug, Clone, Default, Args)]
pub struct SamplingArgs {
    /// Most tokens to generate (0 generates nothing).
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// Softmax temperature; 0 is greedy.
    #[arg(long, allow_negative_numbers = true)]
    pub temperature: Option<f32>,
    /// Keep the K most likely tokens (0: off).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Nucleus sampling mass in (0, 1].
    #[arg(long, allow_negative_numbers = true)]
    pub top_p: Option<f32>,
    /// Keep tokens at least this fraction as likely as the best, in [0, 1].
    #[arg(long, allow_negative_numbers = true)]
    pub min_p: Option<f32>,
    /// Locally typical sampling mass in (0, 1].
    #[arg(long, allow_negative_numbers = true)]
    pub typical_p: Option<f32>,
    /// Repetition penalty (> 0; 1 is off) over prompt and generated tokens.
    #[arg(long, allow_negative_numbers = true)]
    pub repetition_penalty: Option<f32>,
    /// Presence penalty in [-2, 2] over generated tokens.
    #[arg(long, allow_hyphen_values = true)]
    pub presence_penalty: Option<f32>,
    /// Frequency penalty in [-2, 2] over generated tokens.
    #[arg(long, allow_hyphen_values = true)]
    pub frequency_penalty: Option<f32>,
    /// How many recent tokens the penalties see (0: all).
    #[arg(long)]
    pub penalty_last_n: Option<usize>,
    /// Add a bias to a token's logit: ID=BIAS (repeatable).
    #[arg(long = "logit-bias", value_parser = parse_bias, allow_hyphen_values = true)]
    pub logit_bias: Vec<(u32, f32)>,
    /// Random seed (same seed, parameters and model give the same tokens).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop when the text contains this string (repeatable; not included in the output).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Stop at this token id too (repeatable).
    #[arg(long)]
    pub stop_token_id: Vec<u32>,
    /// Beam search with this many beams (1: off).
    #[arg(long)]
    pub num_beams: Option<usize>,
    /// Beam search length penalty exponent.
    #[arg(long, allow_hyphen_values = true)]
    pub length_penalty: Option<f32>,
    /// Beam search stops once enough beams finished.
    #[arg(long)]
    pub early_stopping: bool,
    /// Sequences to return for the prompt.
    #[arg(long)]
    pub num_return_sequences: Option<usize>,
}

fn parse_bias(s: &str) -> Result<(u32, f32), String> {
    let (id, bias) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not ID=BIAS"))?;
    let id = id
        .trim()
        .parse()
        .map_err(|_| format!("`{id}` is not a token id"))?;
    let bias = bias
        .trim()
        .parse()
        .map_err(|_| format!("`{bias}` is not a number"))?;
    Ok((id, bias))
}

impl SamplingArgs {
    /// The flags applied over `base`, validated (the error names the parameter).
    pub fn apply(&self, base: &SamplingParams) -> emberlm::Result<SamplingParams> {
        let mut p = base.clone();
        macro_rules! set {
            ($($field:ident),*) => {$(
                if let Some(v) = self.$field { p.$field = v; }
            )*};
        }
        set!(
            max_new_tokens,
            temperature,
            top_k,
            top_p,
            min_p,
            typical_p,
            repetition_penalty,
            presence_penalty,
            frequency_penalty,
            penalty_last_n,
            num_beams,
            length_penalty,
            num_return_sequences
        );
        if self.seed.is_some() {
            p.seed = self.seed;
        }
        p.logit_bias.extend(self.logit_bias.iter().copied());
        p.stop.extend(self.stop.iter().cloned());
        p.stop_token_ids.extend(self.stop_token_id.iter().copied());
        p.early_stopping |= self.early_stopping;
        p.validate()?;
        Ok(p)
    }
}
