//! Generation parameters: defaults and range checks (read from JSON by
//! `session::options_parse`, through the table of generation options).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{Error, Result};

/// Most stop strings accepted in [`SamplingParams::stop`].
pub const MAX_STOP_STRINGS: usize = 16;
/// Most beams accepted in [`SamplingParams::num_beams`].
pub const MAX_BEAMS: usize = 16;
/// Most sequences accepted in [`SamplingParams::num_return_sequences`].
pub const MAX_RETURN_SEQUENCES: usize = 64;
/// Largest magnitude accepted for a [`SamplingParams::logit_bias`] entry.
pub const MAX_LOGIT_BIAS: f32 = 100.0;
/// Largest magnitude accepted for the presence and frequency penalties.
pub const MAX_OPENAI_PENALTY: f32 = 2.0;

/// Largest seed [`draw_seed`] returns, `2^53 - 1`: a drawn seed is reported to the caller
/// (to repeat the run with it) and must survive a JavaScript number.
pub const MAX_DRAWN_SEED: u64 = (1 << 53) - 1;

/// Draws a seed from the system's random source (below 2^53, see [`MAX_DRAWN_SEED`]): the
/// one place a seed is chosen when [`SamplingParams::seed`] is `None`.
pub fn draw_seed() -> Result<u64> {
    let seed = getrandom::u64().map_err(|e| {
        Error::invalid(
            "seed",
            format!("none was given and the system random source failed ({e}); pass a seed"),
        )
    })?;
    Ok(seed & MAX_DRAWN_SEED)
}

/// Named sampling settings (`preset`): temperature, top-k and top-p for a style of output.
/// Fields given explicitly beside a preset override it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// Temperature 0.3, top-k 20: focused, repeatable answers.
    Conservative,
    /// Temperature 0.8, top-k 50, top-p 0.9: the everyday setting.
    Balanced,
    /// Temperature 1.3, top-k 100, top-p 0.95: varied, surprising text.
    Creative,
}

impl Preset {
    /// Every preset, in order.
    pub const ALL: [Preset; 3] = [Preset::Conservative, Preset::Balanced, Preset::Creative];

    /// The name users write.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Conservative => "conservative",
            Preset::Balanced => "balanced",
            Preset::Creative => "creative",
        }
    }

    /// `(temperature, top_k, top_p)` of the preset.
    pub fn values(self) -> (f32, usize, f32) {
        match self {
            Preset::Conservative => (0.3, 20, 1.0),
            Preset::Balanced => (0.8, 50, 0.9),
            Preset::Creative => (1.3, 100, 0.95),
        }
    }
}

impl std::str::FromStr for Preset {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let wanted = s.trim().to_ascii_lowercase();
        Preset::ALL
            .into_iter()
            .find(|p| p.name() == wanted)
            .ok_or_else(|| {
                Error::invalid(
                    "preset",
                    format!("`{s}` is not a preset (conservative, balanced or creative)"),
                )
            })
    }
}

/// Everything that controls how tokens are chosen and when generation ends.
///
/// Every field has a default (see [`Default`]: the `balanced` preset and 100 new tokens), so an
/// options object only needs the fields it changes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SamplingParams {
    /// Softmax temperature, `>= 0` and finite; `0` means greedy (argmax). Default 0.8.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` turns the filter off. Default 50.
    pub top_k: usize,
    /// Nucleus sampling: keep the smallest most-likely set whose probability reaches `top_p`;
    /// in `(0, 1]`, `1` is off. Default 0.9.
    pub top_p: f32,
    /// Keep tokens whose probability is at least `min_p` times the largest probability;
    /// in `[0, 1]`, `0` is off. Default 0.0.
    pub min_p: f32,
    /// Locally typical sampling mass; in `(0, 1]`, `1` is off. Default 1.0.
    pub typical_p: f32,
    /// Repetition penalty (Hugging Face semantics), `> 0` and finite; `1` is off. Default 1.0.
    pub repetition_penalty: f32,
    /// Presence penalty (OpenAI semantics), in `[-2, 2]`. Default 0.
    pub presence_penalty: f32,
    /// Frequency penalty (OpenAI semantics), in `[-2, 2]`. Default 0.
    pub frequency_penalty: f32,
    /// How many of the most recent history tokens the penalties look at; `0` means all. Default 0.
    pub penalty_last_n: usize,
    /// Added to the logit of each listed token id; each bias finite and in `[-100, 100]`.
    pub logit_bias: BTreeMap<u32, f32>,
    /// Random seed; `None` draws one with [`draw_seed`]. Default `None`.
    pub seed: Option<u64>,
    /// Most tokens generated after the prompt; `0` is allowed. Default 100
    /// ([`DEFAULT_MAX_NEW_TOKENS`]).
    pub max_new_tokens: usize,
    /// Stop strings (each non-empty, at most 16); generated text ends before the first match.
    pub stop: Vec<String>,
    /// Token ids that end generation, besides the model's end-of-sequence tokens.
    pub stop_token_ids: Vec<u32>,
    /// Beam count for beam search, `1..=16`; `1` means no beam search. Default 1.
    pub num_beams: usize,
    /// Beam-search length penalty exponent, finite. Default 1.0.
    pub length_penalty: f32,
    /// Beam search stops as soon as `num_beams` finished candidates exist. Default false.
    pub early_stopping: bool,
    /// Sequences returned, `1..=64`; with beam search at most `num_beams`. Default 1.
    pub num_return_sequences: usize,
    /// End-of-sequence token ids that replace the model's (a number or a list; empty: the
    /// model's own). Default empty.
    pub eos_token_id: Vec<u32>,
    /// Keep generating past end-of-sequence and end-of-turn tokens (the stop strings and
    /// `stop_token_ids` still stop): for benchmarks and tests. Default false.
    pub ignore_eos: bool,
}

/// Tokens generated after the prompt unless [`SamplingParams::max_new_tokens`] says otherwise.
pub const DEFAULT_MAX_NEW_TOKENS: usize = 100;

/// The one default sampling set of the library, the CLI, the JavaScript API and the chat page:
/// the `balanced` preset (temperature 0.8, top-k 50, top-p 0.9), no penalties, and
/// [`DEFAULT_MAX_NEW_TOKENS`] new tokens. Small models ramble and repeat themselves from the
/// long tail of their distribution at temperature 1; cutting that tail keeps their text on
/// topic while still varying from run to run. [`SamplingParams::unfiltered`] is the model's
/// own distribution (OpenAI's defaults).
impl Default for SamplingParams {
    fn default() -> Self {
        let (temperature, top_k, top_p) = Preset::Balanced.values();
        SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p: 0.0,
            typical_p: 1.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 0,
            logit_bias: BTreeMap::new(),
            seed: None,
            max_new_tokens: DEFAULT_MAX_NEW_TOKENS,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            num_beams: 1,
            length_penalty: 1.0,
            early_stopping: false,
            num_return_sequences: 1,
            eos_token_id: Vec::new(),
            ignore_eos: false,
        }
    }
}

fn check_range(name: &'static str, value: f32, lo: f32, hi: f32, range: &str) -> Result<()> {
    // NaN is outside every range.
    if (lo..=hi).contains(&value) {
        Ok(())
    } else {
        Err(Error::invalid(
            name,
            format!("must be in {range}, got {value}"),
        ))
    }
}

fn check_unit_open_closed(name: &'static str, value: f32) -> Result<()> {
    if value > 0.0 && value <= 1.0 {
        Ok(())
    } else {
        Err(Error::invalid(
            name,
            format!("must be in (0, 1], got {value}"),
        ))
    }
}

fn check_count(name: &'static str, value: usize, lo: usize, hi: usize) -> Result<()> {
    if (lo..=hi).contains(&value) {
        Ok(())
    } else {
        Err(Error::invalid(
            name,
            format!("must be in {lo}..={hi}, got {value}"),
        ))
    }
}

impl SamplingParams {
    /// Greedy decoding (temperature 0, no filters), otherwise the defaults.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..SamplingParams::unfiltered()
        }
    }

    /// Temperature 1 over the whole vocabulary (no top-k or top-p), otherwise the defaults: a
    /// draw from the model's own distribution, as OpenAI's API defaults to.
    pub fn unfiltered() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            ..SamplingParams::default()
        }
    }

    /// Sets the preset's temperature, top-k and top-p.
    pub fn apply_preset(&mut self, preset: Preset) {
        (self.temperature, self.top_k, self.top_p) = preset.values();
    }

    /// Checks every range; the error names the parameter (the snake_case field name) and the
    /// allowed range and the given value.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(Error::invalid(
                "temperature",
                format!("must be finite and >= 0, got {}", self.temperature),
            ));
        }
        check_unit_open_closed("top_p", self.top_p)?;
        check_range("min_p", self.min_p, 0.0, 1.0, "[0, 1]")?;
        check_unit_open_closed("typical_p", self.typical_p)?;
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(Error::invalid(
                "repetition_penalty",
                format!("must be finite and > 0, got {}", self.repetition_penalty),
            ));
        }
        check_range(
            "presence_penalty",
            self.presence_penalty,
            -MAX_OPENAI_PENALTY,
            MAX_OPENAI_PENALTY,
            "[-2, 2]",
        )?;
        check_range(
            "frequency_penalty",
            self.frequency_penalty,
            -MAX_OPENAI_PENALTY,
            MAX_OPENAI_PENALTY,
            "[-2, 2]",
        )?;
        for (&id, &bias) in &self.logit_bias {
            if !(-MAX_LOGIT_BIAS..=MAX_LOGIT_BIAS).contains(&bias) {
                return Err(Error::invalid(
                    "logit_bias",
                    format!("bias for token {id} must be finite and in [-100, 100], got {bias}"),
                ));
            }
        }
        if self.stop.len() > MAX_STOP_STRINGS {
            return Err(Error::invalid(
                "stop",
                format!(
                    "at most {MAX_STOP_STRINGS} stop strings are allowed, got {}",
                    self.stop.len()
                ),
            ));
        }
        if let Some(i) = self.stop.iter().position(|s| s.is_empty()) {
            return Err(Error::invalid(
                "stop",
                format!("stop strings must be non-empty, got an empty string at index {i}"),
            ));
        }
        check_count("num_beams", self.num_beams, 1, MAX_BEAMS)?;
        if !self.length_penalty.is_finite() {
            return Err(Error::invalid(
                "length_penalty",
                format!("must be finite, got {}", self.length_penalty),
            ));
        }
        check_count(
            "num_return_sequences",
            self.num_return_sequences,
            1,
            MAX_RETURN_SEQUENCES,
        )?;
        if self.num_beams > 1 && self.num_return_sequences > self.num_beams {
            return Err(Error::invalid(
                "num_return_sequences",
                format!(
                    "must be <= num_beams ({}) when num_beams > 1, got {}",
                    self.num_beams, self.num_return_sequences
                ),
            ));
        }
        Ok(())
    }

    /// validate() plus ids in logit_bias / stop_token_ids < vocab_size.
    pub fn validate_for_vocab(&self, vocab_size: usize) -> Result<()> {
        self.validate()?;
        let in_vocab = |id: u32| usize::try_from(id).is_ok_and(|id| id < vocab_size);
        if let Some(&id) = self.logit_bias.keys().find(|&&id| !in_vocab(id)) {
            return Err(Error::invalid(
                "logit_bias",
                format!("token id must be in 0..{vocab_size} (the vocabulary), got {id}"),
            ));
        }
        for (name, ids) in [
            ("stop_token_ids", &self.stop_token_ids),
            ("eos_token_id", &self.eos_token_id),
        ] {
            if let Some(&id) = ids.iter().find(|&&id| !in_vocab(id)) {
                return Err(Error::invalid(
                    name,
                    format!("token id must be in 0..{vocab_size} (the vocabulary), got {id}"),
                ));
            }
        }
        Ok(())
    }

    /// [`SamplingParams::validate_for_vocab`], and the parameters as the [`Checked`] form a
    /// [`crate::sampling::Sampler`] is built from without checking them again.
    pub fn check(&self, vocab_size: usize) -> Result<Checked> {
        if vocab_size == 0 || u32::try_from(vocab_size - 1).is_err() {
            return Err(Error::invalid(
                "vocab_size",
                format!("must be in 1..=4294967296, got {vocab_size}"),
            ));
        }
        self.validate_for_vocab(vocab_size)?;
        Ok(Checked {
            params: self.clone(),
            vocab_size,
        })
    }

    /// True when sampling is deterministic argmax: temperature == 0, or top_k == 1.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }
}

/// Sampling parameters that passed [`SamplingParams::check`] for a vocabulary: what the
/// samplers are built from, so that a call's parameters are checked once.
#[derive(Clone, Debug, PartialEq)]
pub struct Checked {
    params: SamplingParams,
    vocab_size: usize,
}

impl Checked {
    /// The vocabulary size the parameters were checked for.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The scoring form beam search uses: only the logit bias and the penalties shape beam
    /// scores (temperature 1, no filter); still in range, as every filter is off.
    pub fn scoring(&self) -> Checked {
        Checked {
            params: SamplingParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                typical_p: 1.0,
                ..self.params.clone()
            },
            vocab_size: self.vocab_size,
        }
    }
}

impl std::ops::Deref for Checked {
    type Target = SamplingParams;

    fn deref(&self) -> &SamplingParams {
        &self.params
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_set_temperature_top_k_and_top_p() {
        let mut q = SamplingParams::default();
        q.apply_preset(Preset::Conservative);
        assert_eq!((q.temperature, q.top_k, q.top_p), (0.3, 20, 1.0));
        assert_eq!("Creative".parse::<Preset>().ok(), Some(Preset::Creative));
        let err = "wild".parse::<Preset>().unwrap_err();
        assert!(err.to_string().contains("preset"), "{err}");
    }

    /// The presets are this table's: the chat page takes them from the engine's `info`
    /// (it holds no copy), and the `--preset` help and the generation options' documentation
    /// say the same numbers.
    #[test]
    fn every_copy_of_the_presets_says_the_tables_numbers() {
        let app = include_str!("../../www/app.js");
        assert!(
            app.contains("info.presets"),
            "app.js reads the engine's presets"
        );
        let flags: String = include_str!("../bin/emberlm/sampling_args.rs")
            .lines()
            .map(|l| l.trim().trim_start_matches("///").trim())
            .collect::<Vec<_>>()
            .join(" ");
        let options = include_str!("../session/generate_keys.rs");
        for preset in Preset::ALL {
            let (t, k, p) = preset.values();
            let name = preset.name();
            let top_p = if p == 1.0 {
                "off".to_string()
            } else {
                p.to_string()
            };
            let copied = format!("{name}: {{ temperature: {t}");
            assert!(!app.contains(&copied), "app.js holds a copy: `{copied}`");
            for (copy, text, wanted) in [
                (
                    "sampling_args.rs",
                    flags.as_str(),
                    format!("{name} ({t}, {k}, {top_p}"),
                ),
                (
                    "generate_keys.rs",
                    options,
                    format!("`'{name}'` ({t} / {k} / {p}"),
                ),
            ] {
                assert!(text.contains(&wanted), "{copy} lacks `{wanted}`");
            }
        }
    }

    #[test]
    fn checked_ids_stay_within_the_vocabulary() {
        let big = SamplingParams {
            eos_token_id: vec![100],
            ..SamplingParams::default()
        };
        let err = big.check(50).unwrap_err();
        assert!(err.to_string().contains("eos_token_id"), "{err}");
        assert!(big.check(0).is_err());
        let ok = big
            .check(101)
            .map(|c| (c.vocab_size(), c.eos_token_id.clone()));
        assert_eq!(ok.ok(), Some((101, vec![100])));
        let scoring = SamplingParams::default().check(8).map(|c| c.scoring());
        assert!(scoring.is_ok_and(|s| s.validate().is_ok() && s.top_k == 0));
    }

    #[test]
    fn greedy_is_greedy() {
        assert!(SamplingParams::greedy().is_greedy());
        assert!(!SamplingParams::default().is_greedy());
        let top1 = SamplingParams {
            top_k: 1,
            ..SamplingParams::default()
        };
        assert!(top1.is_greedy());
    }

    #[test]
    fn drawn_seeds_fit_a_javascript_number() {
        for _ in 0..64 {
            let seed = draw_seed().unwrap_or(u64::MAX);
            assert!(seed <= MAX_DRAWN_SEED, "{seed}");
        }
        // A sampler without a seed reports the one it drew, within the same range.
        let sampler = crate::sampling::Sampler::new(&SamplingParams::default(), 8);
        let seed = sampler.map(|s| s.seed()).unwrap_or(u64::MAX);
        assert!(seed <= MAX_DRAWN_SEED, "{seed}");
    }
}
