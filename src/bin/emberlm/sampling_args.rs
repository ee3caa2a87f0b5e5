//! The sampling flags every generating subcommand shares.

use clap::Args;
use emberlm::sampling::{Preset, SamplingParams};

/// Sampling and stopping flags; unset flags keep [`SamplingParams`]' defaults. Every
/// multi-word flag also answers to its snake_case spelling (`--max_new_tokens`, `--top_k`, ...),
/// as Hugging Face users write them.
#[derive(Debug, Clone, Default, Args)]
pub struct SamplingArgs {
    /// Named settings for temperature, top-k and top-p, under the flags given beside it:
    /// conservative (0.3, 20, off), balanced (0.8, 50, 0.9; the defaults), creative (1.3, 100,
    /// 0.95).
    #[arg(long, value_name = "conservative|balanced|creative")]
    pub preset: Option<String>,
    /// `false`: greedy decoding (temperature 0; a --temperature beside it is ignored, as in
    /// Hugging Face); `true`: sample (the temperature must then be above 0).
    #[arg(long = "do-sample", alias = "do_sample", value_name = "BOOL")]
    pub do_sample: Option<bool>,
    /// Most tokens to generate (0 generates nothing; default 100).
    #[arg(long, alias = "max_new_tokens")]
    pub max_new_tokens: Option<usize>,
    /// Softmax temperature; 0 is greedy (default 0.8).
    #[arg(long, allow_negative_numbers = true)]
    pub temperature: Option<f32>,
    /// Keep the K most likely tokens (0: off; default 50).
    #[arg(long, alias = "top_k")]
    pub top_k: Option<usize>,
    /// Nucleus sampling mass in (0, 1] (1: off; default 0.9).
    #[arg(long, allow_negative_numbers = true, alias = "top_p")]
    pub top_p: Option<f32>,
    /// Keep tokens at least this fraction as likely as the best, in [0, 1].
    #[arg(long, allow_negative_numbers = true, alias = "min_p")]
    pub min_p: Option<f32>,
    /// Locally typical sampling mass in (0, 1].
    #[arg(long, allow_negative_numbers = true, alias = "typical_p")]
    pub typical_p: Option<f32>,
    /// Repetition penalty (> 0; 1 is off) over prompt and generated tokens.
    #[arg(long, allow_negative_numbers = true, alias = "repetition_penalty")]
    pub repetition_penalty: Option<f32>,
    /// Presence penalty in [-2, 2] over generated tokens.
    #[arg(long, allow_hyphen_values = true, alias = "presence_penalty")]
    pub presence_penalty: Option<f32>,
    /// Frequency penalty in [-2, 2] over generated tokens.
    #[arg(long, allow_hyphen_values = true, alias = "frequency_penalty")]
    pub frequency_penalty: Option<f32>,
    /// How many recent tokens the penalties see (0: all).
    #[arg(long, alias = "penalty_last_n")]
    pub penalty_last_n: Option<usize>,
    /// Add a bias to a token's logit: ID=BIAS (repeatable).
    #[arg(
        long = "logit-bias",
        alias = "logit_bias",
        value_parser = parse_bias,
        allow_hyphen_values = true
    )]
    pub logit_bias: Vec<(u32, f32)>,
    /// Random seed (same seed, parameters and model give the same tokens).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop when the text contains this string (repeatable; not included in the output).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Stop at this token id too (repeatable).
    #[arg(long, alias = "stop_token_id")]
    pub stop_token_id: Vec<u32>,
    /// End-of-sequence token id replacing the model's (repeatable).
    #[arg(long = "eos-token-id", alias = "eos_token_id", value_name = "ID")]
    pub eos_token_id: Vec<u32>,
    /// Keep generating past end-of-sequence and end-of-turn tokens (--stop and
    /// --stop-token-id still stop).
    #[arg(long = "ignore-eos", alias = "ignore_eos")]
    pub ignore_eos: bool,
    /// Print the prompt first: the output and the stream start with its text.
    #[arg(long)]
    pub echo: bool,
    /// Recompute the whole sequence at every token instead of reading the KV cache (same
    /// tokens, far slower: for teaching and measuring what the cache saves; not with beams).
    #[arg(long = "no-kv-cache", alias = "no_kv_cache")]
    pub no_kv_cache: bool,
    #[command(flatten)]
    pub spec: crate::spec_args::SpecArgs,
    /// Beam search with this many beams (1: off).
    #[arg(long, alias = "num_beams")]
    pub num_beams: Option<usize>,
    /// Beam search length penalty exponent.
    #[arg(long, allow_hyphen_values = true, alias = "length_penalty")]
    pub length_penalty: Option<f32>,
    /// Beam search stops once enough beams finished.
    #[arg(long, alias = "early_stopping")]
    pub early_stopping: bool,
    /// Sequences to return for the prompt.
    #[arg(long, alias = "num_return_sequences")]
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
    /// The options of one call from these flags: `sampling` (the flags' parameters, see
    /// [`SamplingArgs::apply`]), the prompt flags `special` and `strict`, and `format`.
    pub fn options(
        &self,
        sampling: SamplingParams,
        special: bool,
        strict: bool,
        format: emberlm::constrain::ResponseFormat,
    ) -> crate::CliResult<emberlm::session::GenerateOptions> {
        Ok(emberlm::session::GenerateOptions {
            sampling,
            special,
            strict,
            n_keep: None,
            no_kv_cache: self.no_kv_cache,
            echo: self.echo,
            speculative: self.spec.options()?,
            response_format: format,
            top_logprobs: 0,
            tools: None,
        })
    }

    /// The flags applied over `base`, validated (the error names the parameter).
    pub fn apply(&self, base: &SamplingParams) -> emberlm::Result<SamplingParams> {
        let mut p = base.clone();
        if let Some(name) = &self.preset {
            p.apply_preset(name.parse::<Preset>()?);
        }
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
        if !self.eos_token_id.is_empty() {
            p.eos_token_id = self.eos_token_id.clone();
        }
        p.ignore_eos |= self.ignore_eos;
        match self.do_sample {
            Some(false) => {
                if self.temperature.is_some_and(|t| t > 0.0) {
                    eprintln!(
                        "emberlm: --do-sample false: greedy decoding; --temperature is ignored"
                    );
                }
                p.temperature = 0.0;
            }
            Some(true) if p.temperature == 0.0 => {
                return Err(emberlm::Error::invalid(
                    "do_sample",
                    "sampling needs a temperature above 0 (--temperature, or a --preset)",
                ));
            }
            _ => {}
        }
        p.validate()?;
        Ok(p)
    }
}
